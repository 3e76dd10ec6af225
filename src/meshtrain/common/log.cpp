// log.cpp — timestamps, levels, and whole-line writes to stderr.
#include "meshtrain/common/log.hpp"

#include "meshtrain/common/error.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>

namespace meshtrain::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::info)};

const char* level_name(Level level) {
  switch (level) {
    case Level::debug: return "DEBUG";
    case Level::info: return "INFO";
    case Level::warning: return "WARNING";
    case Level::error: return "ERROR";
  }
  return "?";
}

void write_all(const std::string& text) {
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

void set_level(Level level) { g_level.store(static_cast<int>(level)); }
Level level() { return static_cast<Level>(g_level.load()); }

Level parse_level(const std::string& name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warning") return Level::warning;
  if (name == "error") return Level::error;
  throw UserError(fmt::format("log level '{}' is not one of: debug, info, warning, error", name));
}

void write(Level level, const std::string& message) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t seconds = system_clock::to_time_t(now);
  int millis = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&seconds, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  write_all(fmt::format("[{},{:03d}][meshtrain][{}] - {}\n", stamp, millis, level_name(level), message));
}

void block(const std::string& text) {
  write_all(text.empty() || text.back() == '\n' ? text : text + "\n");
}

}  // namespace meshtrain::log
