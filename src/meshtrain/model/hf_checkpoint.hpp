// hf_checkpoint.hpp — a model's weights in checkpoint directories as Hugging Face reads them (the files themselves,
// their completion marker and its checks: checkpoint/hf_directory.hpp): save (sharded at a size limit, each file
// atomic, the marker last) and load. Loading reads only the pieces asked for (CheckpointTensors): a device of a mesh
// reads its shards' byte ranges, never a whole file.
#pragma once

#include "meshtrain/checkpoint/hf_directory.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/parameter_slice.hpp"
#include "meshtrain/model/safetensors.hpp"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::model {

struct HfSaveOptions {
  torch::Dtype dtype = torch::kFloat32;      // of the stored weights: kFloat32 or kBFloat16
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default shard size ("5GB")
};

// The tensors of a checkpoint directory by name, across its safetensors files, opened once (headers only) and read
// piece by piece. Its const methods may be called from several threads at once (each read is a pread).
class CheckpointTensors {
 public:
  // The weights of a Hugging Face or meshtrain checkpoint: config.json's architecture must equal `config`'s, every
  // parameter of `config`'s model must be present (and nothing else but tensors the model derives: the rotary
  // table, a tied head); the index (or model.safetensors) says which file holds which tensor.
  static CheckpointTensors weights(const std::filesystem::path& dir, const LlamaConfig& config,
                                   checkpoint::Verify verify);
  // Every tensor of the safetensors files that the completion marker of `dir` lists whose names start with
  // `file_prefix` ("optimizer-"), whatever their number (written by any mesh); never a file the marker does not list.
  // UserError if `dir` has no marker.
  static CheckpointTensors listed_files_starting_with(const std::filesystem::path& dir,
                                                      const std::string& file_prefix);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The values of `slice` of the tensor `slice.name + suffix` as fp32 [slice.numel()]; UserError naming the
  // directory and tensor if it is missing, or the file if its shape is not slice.full_shape.
  at::Tensor read(const ParameterSlice& slice, const std::string& suffix = "") const;
  // read() into `out` (fp32, contiguous, [slice.numel()]); fp32 tensors are read into it directly.
  void read_into(const ParameterSlice& slice, const at::Tensor& out, const std::string& suffix = "") const;
  // read_into(slice, out, suffix) as a SliceSource (it refers to this object).
  SliceSource source(const std::string& suffix = "") const;

 private:
  std::filesystem::path dir_;
  std::vector<checkpoint::SafetensorsFile> files_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // name -> (file, entry) indices
};

// Writes config.json and the weights into `dir` (created if needed; an old marker there is removed first) and
// returns the files written. The directory is not complete until checkpoint::write_completion_marker.
std::vector<checkpoint::CheckpointFile> save_hf_weights(const std::filesystem::path& dir, LlamaForCausalLM& model,
                                                        const HfSaveOptions& options = {});
// save_hf_weights + checkpoint::write_completion_marker.
void save_hf_checkpoint(const std::filesystem::path& dir, LlamaForCausalLM& model, const HfSaveOptions& options = {});

// Loads every parameter of `model` whole from `dir` (CheckpointTensors::weights, verified against the marker;
// stored dtype converted). For one device; a mesh reads its pieces through CheckpointTensors itself.
void load_hf_checkpoint(const std::filesystem::path& dir, LlamaForCausalLM& model);
// The model in `dir` with its weights, for one device: config.json is checked against the weight files' headers
// (every parameter present, with the model's shape) and the model's fp32 size against the memory this host can still
// allocate before any parameter exists. UserError naming the file otherwise.
std::unique_ptr<LlamaForCausalLM> load_hf_model(const std::filesystem::path& dir);

}  // namespace meshtrain::model
