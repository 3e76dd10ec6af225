// matmul_peak.cpp — timing matmuls for `meshtrain peak`, MFU and the bf16 probe.
#include "meshtrain/model/matmul_peak.hpp"

#include <algorithm>
#include <chrono>

namespace meshtrain::model {

MatmulPeak measure_matmul_rate(torch::Dtype dtype, int64_t rows, int64_t inner, int64_t cols, double seconds) {
  torch::NoGradGuard no_grad;
  auto options = torch::TensorOptions().dtype(dtype);
  torch::Tensor a = torch::randn({rows, inner}).to(options), b = torch::randn({inner, cols}).to(options);
  torch::Tensor c = torch::empty({rows, cols}, options);
  torch::matmul_out(c, a, b);  // warm-up: first-call kernel selection and allocation
  MatmulPeak peak{dtype, rows, inner, cols, at::get_num_threads()};
  const double flops = 2.0 * static_cast<double>(rows) * inner * cols;
  const auto start = std::chrono::steady_clock::now();
  auto before = start;
  do {
    torch::matmul_out(c, a, b);
    ++peak.products;
    const auto now = std::chrono::steady_clock::now();
    peak.best_gflops = std::max(peak.best_gflops, flops / std::chrono::duration<double>(now - before).count() / 1e9);
    before = now;
    peak.seconds = std::chrono::duration<double>(now - start).count();
  } while (peak.seconds < seconds);
  peak.gflops = flops * peak.products / peak.seconds / 1e9;
  return peak;
}

MatmulPeak measure_matmul_peak(torch::Dtype dtype, int64_t size, double seconds) {
  return measure_matmul_rate(dtype, size, size, size, seconds);
}

}  // namespace meshtrain::model
