// matmul_peak.hpp — this machine's measured matmul throughput (square GEMMs through libtorch, so the same BLAS and
// oneDNN kernels the model uses), the honest MFU denominator when no peak is configured.
#pragma once

#include <torch/torch.h>

namespace meshtrain::model {

struct MatmulPeak {
  torch::Dtype dtype;
  int64_t size = 0;     // n of the n x n x n products
  int threads = 0;      // torch intra-op threads used
  int64_t products = 0;  // how many were timed
  double seconds = 0;
  double gflops = 0;  // 2 n^3 products / seconds / 1e9
};

// Times n x n matmuls in `dtype` on the current torch thread count for about `seconds` after one warm-up product.
MatmulPeak measure_matmul_peak(torch::Dtype dtype, int64_t size, double seconds);

}  // namespace meshtrain::model
