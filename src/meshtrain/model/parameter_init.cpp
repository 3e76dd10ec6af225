// parameter_init.cpp — the counter-based initializer.
#include "meshtrain/model/parameter_init.hpp"

#include "meshtrain/common/mix.hpp"

#include <ATen/Parallel.h>

#include <cmath>

namespace meshtrain::model {
namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// N(0, 1) at element `index` of the stream `key`.
float standard_normal(uint64_t key, int64_t index) {
  const uint64_t bits = splitmix64(key + static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull);
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;  // (0, 1]
  const double u2 = static_cast<double>(bits & 0xffffffffull) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

at::Tensor initial_values(const config::LlamaConfig& config, uint64_t seed, const ParameterSlice& slice) {
  if (slice.full_shape.size() <= 1) return at::ones({slice.numel()}, at::kFloat);  // RMSNorm weights
  at::Tensor out = at::empty({slice.numel()}, at::kFloat);
  float* out_data = out.data_ptr<float>();
  const uint64_t key = splitmix64(seed ^ fnv1a(slice.name));
  const float std = static_cast<float>(config.initializer_range);
  slice.for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
    at::parallel_for(0, count, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out_data[offset + i] = std * standard_normal(key, whole_index + i);
    });
  });
  return out;
}

SliceSource initial_value_source(const config::LlamaConfig& config, uint64_t seed) {
  return [config, seed](const ParameterSlice& slice) { return initial_values(config, seed, slice); };
}

}  // namespace meshtrain::model
