// hf_checkpoint.hpp — model checkpoints as Hugging Face reads them: a directory with `config.json` (LlamaConfig
// keys) and the weights in safetensors under HF Llama names, one `model.safetensors` or, when larger than the shard
// limit, `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` (the weight map).
//
// Saving is atomic per file (temporary name, fsync, rename) and the directory is complete only when the completion
// marker `meshtrain_complete.json` exists: it lists every file with its size and CRC-32C, and is written last. Other
// writers (the trainer's optimizer state) add their files to the marker through `write_completion_marker`.
// Loading reads only the files the marker lists (never a directory listing: a file left beside them by an earlier
// save is never read) and verifies them against it; a directory that meshtrain wrote but did not complete is refused,
// and so is a damaged file, with the file and the failed check named. A directory from Hugging Face (no marker, no
// meshtrain key in config.json) loads with the structural checks of the safetensors reader. Loading reads only the
// pieces asked for (CheckpointTensors): a device of a mesh reads its shards' byte ranges, never a whole file.
#pragma once

#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/parameter_slice.hpp"
#include "meshtrain/model/safetensors.hpp"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::model {

inline constexpr const char* kCompletionMarker = "meshtrain_complete.json";

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct HfSaveOptions {
  torch::Dtype dtype = torch::kFloat32;      // of the stored weights: kFloat32 or kBFloat16
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default shard size ("5GB")
};

// The tensors of a checkpoint directory by name, across its safetensors files, opened once (headers only) and read
// piece by piece. Its const methods may be called from several threads at once (each read is a pread).
class CheckpointTensors {
 public:
  // Whether to check every listed file's size and CRC-32C against the completion marker while opening (a whole read
  // of each, streamed), when the directory has a marker.
  enum class Verify { against_marker, no };
  // The weights of a Hugging Face or meshtrain checkpoint: config.json's architecture must equal `config`'s, every
  // parameter of `config`'s model must be present (and nothing else but tensors the model derives: the rotary
  // table, a tied head); the index (or model.safetensors) says which file holds which tensor.
  static CheckpointTensors weights(const std::filesystem::path& dir, const LlamaConfig& config, Verify verify);
  // Every tensor of the safetensors files that the completion marker of `dir` lists whose names start with
  // `file_prefix` ("optimizer-"), whatever their number (written by any mesh); never a file the marker does not list.
  // UserError if `dir` has no marker.
  static CheckpointTensors listed_files_starting_with(const std::filesystem::path& dir,
                                                      const std::string& file_prefix);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The values of `slice` of the tensor `slice.name + suffix` as fp32 [slice.numel()]; UserError naming the
  // directory and tensor if it is missing, or the file if its shape is not slice.full_shape.
  at::Tensor read(const ParameterSlice& slice, const std::string& suffix = "") const;
  // read(slice, suffix) as a SliceSource (it refers to this object).
  SliceSource source(const std::string& suffix = "") const;

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, entry) indices
};

// Writes config.json and the weights into `dir` (created if needed; an old marker there is removed first) and
// returns the files written. The directory is not complete until write_completion_marker.
std::vector<CheckpointFile> save_hf_weights(const std::filesystem::path& dir, LlamaForCausalLM& model,
                                            const HfSaveOptions& options = {});
// For writers that assemble a checkpoint from several places (the trainer on a mesh, each device writing its files
// into a fresh folder: train/checkpoint_dirs.hpp): "model-00001-of-00004.safetensors"; config.json (marked as
// meshtrain's); the index of a sharded checkpoint (tensor name -> file).
std::string weights_file_name(size_t index, size_t count);
CheckpointFile write_hf_config(const std::filesystem::path& dir, const LlamaConfig& config, torch::Dtype dtype);
CheckpointFile write_hf_index(const std::filesystem::path& dir, const std::map<std::string, std::string>& weight_map,
                              uint64_t total_bytes);

// Writes the completion marker listing `files`; the checkpoint is complete once this returns.
void write_completion_marker(const std::filesystem::path& dir, const std::vector<CheckpointFile>& files);
// save_hf_weights + write_completion_marker.
void save_hf_checkpoint(const std::filesystem::path& dir, LlamaForCausalLM& model, const HfSaveOptions& options = {});

// True if `dir` holds a completion marker (the files are verified when read).
bool is_complete_checkpoint(const std::filesystem::path& dir);
// Reads (streamed) and checks every file listed in the marker (size and CRC-32C); UserError naming the first bad one.
void verify_checkpoint_files(const std::filesystem::path& dir);

// The LlamaConfig of the checkpoint in `dir` (its config.json).
LlamaConfig read_hf_config(const std::filesystem::path& dir);
// Loads every parameter of `model` whole from `dir` (CheckpointTensors::weights, verified against the marker;
// stored dtype converted). For one device; a mesh reads its pieces through CheckpointTensors itself.
void load_hf_checkpoint(const std::filesystem::path& dir, LlamaForCausalLM& model);
// The model in `dir` with its weights, for one device: config.json is checked against the weight files' headers
// (every parameter present, with the model's shape) and the model's fp32 size against the memory this host can still
// allocate before any parameter exists. UserError naming the file otherwise.
std::unique_ptr<LlamaForCausalLM> load_hf_model(const std::filesystem::path& dir);

}  // namespace meshtrain::model
