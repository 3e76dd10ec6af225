// expert_parallel.hpp — expert parallelism for a Mixtral: every MoE layer's experts split over the `expert` axis
// (device at expert coordinate r keeps experts [r * E/ep, (r + 1) * E/ep)), and the routed token slots carried to
// their experts' devices and back by all-to-alls of variable sizes.
//
// Per MoE layer and forward pass, over the expert group:
//   1. all_to_all of the slot counts: each device tells each peer how many rows it sends to each of its experts;
//   2. all_to_all_rows of the slot rows (sorted by expert, so each peer's rows are one contiguous block);
//   3. the local experts run on the rows they received, regrouped by expert (one matmul chain per expert);
//   4. all_to_all_rows back, in the order the rows came. Backward runs 4 and 2 in reverse (parallel/autograd_collectives.hpp).
// An expert or a device may receive no rows; the counts say so and nothing is sent for them.
#pragma once

#include "meshtrain/model/llama.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <cstdint>
#include <string>

namespace meshtrain::parallel {

// The expert coordinate of the device holding expert `expert` of `num_experts` over `expert_size` devices.
int expert_holder(int64_t expert, int64_t num_experts, int expert_size);

// The expert index in a Mixtral parameter name ("model.layers.0.block_sparse_moe.experts.5.w1.weight" -> 5), or -1
// for a parameter outside the experts.
int64_t expert_of_parameter(const std::string& name);
// The name of the same parameter of expert `expert` ("...experts.5.w1.weight", 2 -> "...experts.2.w1.weight").
std::string with_expert_index(const std::string& name, int64_t expert);

// UserError unless `config` has experts that split evenly over `expert_size` devices (no-op for one device).
void check_expert_parallel(const config::LlamaConfig& config, int expert_size);

// Keeps this device's experts in every MoE layer and routes the others' slots over `expert_comm` (the device's rank
// in it picks its experts), after check_expert_parallel. With one rank it keeps every expert.
void apply_expert_parallel(model::LlamaForCausalLM& model, runtime::Comm& expert_comm);

}  // namespace meshtrain::parallel
