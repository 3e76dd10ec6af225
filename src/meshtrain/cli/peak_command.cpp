// peak_command.cpp — `meshtrain peak`: this machine's fp32 and bf16 matmul GFLOP/s (the MFU denominator).
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/model/matmul_peak.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <thread>

namespace meshtrain::cli {

int peak_command(int argc, char** argv) {
  CLI::App app{"Measure this machine's matmul throughput in fp32 and bf16 (square n x n products).", "meshtrain peak"};
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int64_t size = 2048;
  double seconds = 2.0;
  bool as_json = false;
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  app.add_option("--size", size, "n of the n x n matrices")->capture_default_str();
  app.add_option("--seconds", seconds, "time per dtype")->capture_default_str();
  app.add_flag("--json", as_json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_USER_CHECK(threads > 0, "--threads must be positive, got {}", threads);
  MT_USER_CHECK(size > 0, "--size must be positive, got {}", size);
  MT_USER_CHECK(seconds > 0, "--seconds must be positive, got {}", seconds);
  at::set_num_threads(threads);

  nlohmann::json result = {{"threads", threads}, {"size", size}};
  for (auto [dtype, name] : {std::pair{torch::kFloat32, "fp32"}, std::pair{torch::kBFloat16, "bf16"}}) {
    model::MatmulPeak peak = model::measure_matmul_peak(dtype, size, seconds);
    result[std::string(name) + "_gflops"] = peak.gflops;
    if (!as_json)
      std::cout << fmt::format("{} matmul: {:8.1f} GFLOP/s  ({} threads, {}x{}x{}, {} products in {:.2f} s)\n", name,
                               peak.gflops, threads, size, size, size, peak.products, peak.seconds);
  }
  if (as_json) std::cout << result.dump() << "\n";
  return 0;
}

}  // namespace meshtrain::cli
