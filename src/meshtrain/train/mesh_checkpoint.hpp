// mesh_checkpoint.hpp — training checkpoints written by every device of a mesh, loadable on any mesh (and by
// Hugging Face: the weights are its sharded layout).
//
//   config.json                                  LlamaConfig keys (+ meshtrain's format key)
//   model-0000k-of-0000W.safetensors            full weights under Hugging Face names, fp32
//   model.safetensors.index.json                tensor name -> file
//   optimizer-0000k-of-0000W.safetensors        AdamW moments: "<name>.exp_avg", "<name>.exp_avg_sq"
//   training_state.json                         step, data state, seed, trajectory config (training_state.hpp)
//   meshtrain_complete.json                     written last, listing every file with its size and CRC-32C
//
// Tensor i (in the parallel model's unit order) goes to file (i mod W), W = min(devices, tensors), and device k
// writes file k: the devices of data replica 0 send their pieces of tensor i to device (i mod W) point to point
// (ParallelModel::assemble_whole_tensors: the state crosses the network at most once, in parts of at most 8 MB, so
// no device holds more than one part and its received pieces), which streams each part into its file, checksumming
// as it writes. Every file goes into a fresh "<dir>.partial" folder (checkpoint_dirs.hpp). Device 0 writes the small
// files and, once every device's sizes and checksums have arrived (an all-gather that is also the barrier), the
// completion marker, then publishes the folder whole by renaming it to `dir`. A save that fails (a full disk) removes
// the partial folder and leaves the older checkpoints as they were. Loading needs no communication: each device
// reads only the byte ranges of its own tensor blocks and FSDP shards (model::CheckpointTensors) in the files the
// marker lists, whatever mesh wrote the checkpoint (resharding).
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
