// log.hpp — one-line logs in the torchprime/Hydra style: `[2026-12-02 13:05:01,123][meshtrain][INFO] - message`.
//
// Lines are written whole (one write per line) so the output of device threads and of hosts under the launcher
// never interleaves mid-line. A process-wide prefix (e.g. "host 1") can be set once the host is known.
#pragma once

#include <fmt/format.h>

#include <string>

namespace meshtrain::log {

enum class Level { debug = 0, info = 1, warning = 2, error = 3 };

void set_level(Level level);
Level level();
Level parse_level(const std::string& name);  // "debug" | "info" | "warning" | "error"; UserError otherwise

// Writes one line to stderr: timestamp, logger name, level, message.
void write(Level level, const std::string& message);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warning(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

// Writes a multi-line block (a table, a picture) verbatim, atomically, to stderr.
void block(const std::string& text);

}  // namespace meshtrain::log
