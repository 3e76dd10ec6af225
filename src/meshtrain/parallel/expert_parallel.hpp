// expert_parallel.hpp — expert parallelism for a Mixtral: every MoE layer's experts split over the `expert` axis
// (device at expert coordinate r keeps experts [r * E/ep, (r + 1) * E/ep)), and the routed token slots carried to
// their experts' devices and back by all-to-alls of variable sizes.
//
// Per MoE layer and forward pass, over the expert group:
//   1. all_to_all of the slot counts: each device tells each peer how many rows it sends to each of its experts;
//   2. the slot rows to their experts' devices (sorted by expert, so each peer's rows are one contiguous block), point
//      to point, started without waiting;
//   3. the local experts run (model::experts_forward, one GEMM chain per expert): first on half of the rows this
//      device routed to its own experts, while step 2 travels; then on the rows received, regrouped by expert;
//   4. their outputs back, in the order the rows came, while the other half of its own rows runs.
// Backward does the same with the gradients (the exchanges of 2 and 4 reversed, each overlapped with half of the own
// rows' backward), all in one autograd node. The exchanges are counted as all-to-alls; the time a device waits for
// them is the `alltoall_s` metric, what the overlap did not hide.
// An expert or a device may receive no rows; the counts say so and nothing is sent for them.
#pragma once

#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/moe.hpp"
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

// Keeps the experts of `moe` (all of them, E a multiple of the group's size) that this device's rank in
// `expert_comm` holds, and routes the others' slots over it (steps 1-4 above).
void distribute_experts(model::MixtralSparseMoe& moe, runtime::Comm& expert_comm);

// Keeps this device's experts in every MoE layer and routes the others' slots over `expert_comm` (the device's rank
// in it picks its experts), after check_expert_parallel. With one rank it keeps every expert.
void apply_expert_parallel(model::LlamaForCausalLM& model, runtime::Comm& expert_comm);

}  // namespace meshtrain::parallel
