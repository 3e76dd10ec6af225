// process_runner.hpp — test helper: runs the meshtrain binary as a child process, capturing its output.
#pragma once

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

}  // namespace meshtrain::testing
