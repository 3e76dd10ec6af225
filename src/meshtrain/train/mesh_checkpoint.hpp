// mesh_checkpoint.hpp — training checkpoints written by every device of a mesh and loadable on any mesh (and by
// Hugging Face: the weights are its sharded layout): the weights, the AdamW moments, training_state.json and the
// completion marker, written into a fresh "<dir>.partial" folder (checkpoint_dirs.hpp) that is published whole as
// `dir`. Files and who writes what: docs/parallelism.md, "Checkpoints on a mesh".
//
// A save is collective over the world; no device holds more than one part of a tensor (at most 8 MB) and its
// received pieces at a time. A save that fails removes its partial folder and leaves the older checkpoints as they
// were. Loading needs no communication: each device reads only its own byte ranges of the files the marker lists,
// whatever mesh wrote them.
#pragma once

#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/train/adamw.hpp"

#include <filesystem>
#include <functional>

namespace meshtrain::train {

// Collective over the world: every device of the job calls it with the same `dir` and state. `after_own_files` runs
// on each device once its own files are written, before the completion marker (the failure tests die there).
// Error naming `dir` if this device fails to write its part (its partial folder is removed first); the
// CollectiveError of a failure elsewhere passes through.
void save_mesh_checkpoint(const std::filesystem::path& dir, runtime::DeviceContext& ctx,
                          parallel::ParallelModel& model, AdamW& optimizer, const checkpoint::TrainingState& state,
                          const std::function<void()>& after_own_files = {});

// Fills the optimizer's moments (laid out like the model's shards on this mesh) from `dir`; its step count is the
// training state's step (one AdamW step per training step).
// UserError naming the file and tensor that is missing. No communication.
void load_optimizer_state(const std::filesystem::path& dir, parallel::ParallelModel& model, AdamW& optimizer);

}  // namespace meshtrain::train
