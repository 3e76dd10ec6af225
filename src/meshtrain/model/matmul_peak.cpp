// matmul_peak.cpp — timing square matmuls for `meshtrain peak` and MFU.
#include "meshtrain/model/matmul_peak.hpp"

#include <chrono>

namespace meshtrain::model {

MatmulPeak measure_matmul_peak(torch::Dtype dtype, int64_t size, double seconds) {
  torch::NoGradGuard no_grad;
  auto options = torch::TensorOptions().dtype(dtype);
  torch::Tensor a = torch::randn({size, size}).to(options), b = torch::randn({size, size}).to(options);
  torch::Tensor c = torch::empty({size, size}, options);
  torch::matmul_out(c, a, b);  // warm-up: first-call kernel selection and allocation
  MatmulPeak peak{dtype, size, at::get_num_threads()};
  const auto start = std::chrono::steady_clock::now();
  do {
    torch::matmul_out(c, a, b);
    ++peak.products;
    peak.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (peak.seconds < seconds);
  peak.gflops = 2.0 * static_cast<double>(size) * size * size * peak.products / peak.seconds / 1e9;
  return peak;
}

}  // namespace meshtrain::model
