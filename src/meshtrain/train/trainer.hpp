// trainer.hpp — the training loop of one host: data pipeline, one SPMD trainer per local device, checkpoints.
//
// Per step, on every device (all devices run the same program):
//   batch      DataPipeline::next: this device's rows of the global batch (no communication)
//   micro      gradient_accumulation_steps forward/backward passes over slices of those rows; the loss of each
//              is (sum of its token losses) / (global tokens in the step), so the summed gradients are those of the
//              global mean (divided further by how many devices of the (data, fsdp) group hold the same rows)
//   gradients  reduce-scattered over fsdp per layer during backward, all-reduced over data after the last pass
//   clip       by the global norm over every shard; AdamW on this device's shards; the learning-rate schedule
//   loss       the local sums all-reduced over (data, fsdp): the global mean, the same number on every host
//   checkpoint every checkpoint.save_steps and at the end, every device writing its files (mesh_checkpoint.hpp)
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/host_runtime.hpp"

namespace meshtrain::train {

// Trains as the config says on this host's devices; returns when max_steps is reached. Resumes from the newest
// complete checkpoint under <output_dir>/checkpoints when checkpoint.resume is true (on any mesh).
void train_host(const config::Config& config, const mesh::Mesh& mesh, int host, runtime::HostRuntime& runtime);

}  // namespace meshtrain::train
