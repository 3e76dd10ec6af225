// memory_plan.hpp — how much memory a training job needs per device and per host, estimated from the model's
// shapes and the layout before anything is allocated, and the refusal (with what would make it fit) when a host
// does not have it. `train` logs the plan and checks it at start-up; `meshtrain plan --memory` prints it for any
// layout without starting. What each term counts: docs/parallelism.md, "The memory plan".
#pragma once

#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/settings/settings.hpp"
#include "meshtrain/sharding/spec.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::train {

// Resident memory of a host process before any model state (libtorch, Gloo, the loader's buffers), measured.
inline constexpr int64_t kProcessBytes = int64_t{300} << 20;

// The layout numbers the estimate depends on.
struct MemoryLayout {
  int fsdp = 1;
  int tensor = 1;
  int devices_per_host = 1;
  int64_t rows_per_device = 1;  // of one global batch (before gradient accumulation splits them)
  int expert = 1;               // a Mixtral's experts split over this many devices
  int fsdp_on_host = 1;         // members of a device's fsdp group on its host (how its reduce-scatters travel)
  int context = 1;              // each row's tokens split over this many devices (context parallelism)
  // Pipeline parallelism: each stage's decoder layers (empty: one stage of every layer), and the micro-batches one
  // pass of a device's rows is cut into.
  std::vector<int64_t> stage_layers;  // per pipeline rank (over its virtual stages)
  int64_t pipeline_microbatches = 1;
  int virtual_stages = 1;
};

struct DeviceMemory {
  int64_t parameters = 0, gradients = 0, optimizer = 0, gathered = 0, activations = 0;
  int64_t logits = 0;  // the loss: the fused cross-entropy's gradients and one chunk of logits
  int64_t total() const { return parameters + gradients + optimizer + gathered + activations + logits; }
};

struct MemoryPlan {
  MemoryLayout layout;
  DeviceMemory device;  // of the stage that needs the most (the only one without a pipeline)
  int stage = 0;
  int64_t in_flight = 1;  // micro-batches whose activations that stage keeps at once (its schedule's)
  int64_t host_total() const { return layout.devices_per_host * device.total() + kProcessBytes; }
  // "parameters 0.40 GB + gradients 0.40 GB + ... = 2.91 GB per device; 4 devices + process 0.31 GB = 11.97 GB per
  // host"
  std::string describe() const;
};

// The layout of `settings` on `mesh`; rows per device from how the input batch's spec (the read plan's) splits rows.
MemoryLayout memory_layout(const settings::Settings& settings, const mesh::Mesh& mesh,
                           const sharding::PartitionSpec& input_spec);

MemoryPlan plan_memory(const settings::Settings& settings, const MemoryLayout& layout);

// UserError when the plan's host total exceeds `available`: the estimate and the available memory in GB, and the
// changes that would fit (activation checkpointing, gradient accumulation, more fsdp over more hosts), each with its
// estimate. Returns normally when the plan fits.
void check_memory_fits(const settings::Settings& settings, const MemoryPlan& plan, const MemoryAvailable& available);

}  // namespace meshtrain::train
