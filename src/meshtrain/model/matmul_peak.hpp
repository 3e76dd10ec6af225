// matmul_peak.hpp — this machine's measured matmul throughput (GEMMs through libtorch, so the same BLAS and oneDNN
// kernels the model uses): square products for `meshtrain peak` and the honest MFU denominator when no peak is
// configured, and the product of one projection for the probe that picks how bf16 matmuls run (compute_matmul.hpp).
#pragma once

#include <torch/torch.h>

namespace meshtrain::model {

struct MatmulPeak {
  torch::Dtype dtype;
  int64_t rows = 0, inner = 0, cols = 0;  // [rows, inner] x [inner, cols] products
  int threads = 0;       // torch intra-op threads used
  int64_t products = 0;  // how many were timed
  double seconds = 0;
  double gflops = 0;  // 2 rows inner cols products / seconds / 1e9
  double best_gflops = 0;  // of the fastest single product: a stall of the machine (a busy core) does not count
};

// Times [rows, inner] x [inner, cols] matmuls in `dtype` on the current torch thread count for about `seconds` (at
// least one product) after one warm-up product.
MatmulPeak measure_matmul_rate(torch::Dtype dtype, int64_t rows, int64_t inner, int64_t cols, double seconds);
// The same for n x n x n products (n = `size`).
MatmulPeak measure_matmul_peak(torch::Dtype dtype, int64_t size, double seconds);

}  // namespace meshtrain::model
