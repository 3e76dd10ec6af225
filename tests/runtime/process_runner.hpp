// process_runner.hpp — test helper: runs the meshtrain binary as a child process, capturing its output.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace meshtrain::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
};

// Runs MESHTRAIN_BINARY with `args` (killed after `timeout_s`). `on_line` sees each output line as it arrives.
ProcessResult run_meshtrain(const std::vector<std::string>& args, double timeout_s = 120,
                            const std::function<void(const std::string&)>& on_line = nullptr);

// The line of `output` that is a JSON object (a `--json` verb's result; logs go around it). Adds a test failure and
// returns null when there is none.
nlohmann::json json_line(const std::string& output);

}  // namespace meshtrain::testing
