// parameter_init.hpp — the initial value of every parameter as a function of (seed, parameter name, element index),
// so that any device can produce any piece of any parameter without producing the rest: sharded initialization
// gives the same weights on every mesh, and one device's initialization is the same as a mesh's.
//
// Distribution as Hugging Face's LlamaPreTrainedModel._init_weights: projections and the embedding
// ~ N(0, initializer_range^2), RMSNorm weights (the 1-D parameters) = 1. The normal variates come from a
// counter-based generator: element i of parameter p is a Box-Muller transform of two 32-bit uniforms, the halves of
// SplitMix64(key(seed, p) + i * golden ratio), key = SplitMix64(seed ^ FNV-1a(p)). No state: slices can be made in
// any order, on any thread.
#pragma once

#include "meshtrain/config/llama_config.hpp"
#include "meshtrain/model/parameter_slice.hpp"

#include <cstdint>

namespace meshtrain::model {

// Writes the initial values of `slice` into `out` (fp32, contiguous, [slice.numel()]).
void fill_initial_values(const config::LlamaConfig& config, uint64_t seed, const ParameterSlice& slice,
                         const at::Tensor& out);
// The initial values of `slice` (fp32 [slice.numel()]).
at::Tensor initial_values(const config::LlamaConfig& config, uint64_t seed, const ParameterSlice& slice);

// fill_initial_values as a SliceSource.
SliceSource initial_value_source(const config::LlamaConfig& config, uint64_t seed);

}  // namespace meshtrain::model
