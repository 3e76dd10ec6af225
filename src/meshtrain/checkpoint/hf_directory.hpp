// hf_directory.hpp — the files of a checkpoint directory as Hugging Face reads it, without torch: `config.json`
// (config::LlamaConfig keys), the weights in safetensors, one `model.safetensors` or `model-0000i-of-0000n.safetensors`
// plus the weight map `model.safetensors.index.json`, and meshtrain's completion marker `meshtrain_complete.json`.
//
// The marker lists every file of a complete checkpoint with its size and CRC-32C and is written last. Readers take
// only the files it lists (never a directory listing) and check them against it; a directory meshtrain wrote (its
// config.json has meshtrain's key) but did not complete is refused. A directory from Hugging Face (no marker, no
// meshtrain key) is read with the structural checks alone. File names read from a marker or an index must be plain
// names inside the directory. Every refusal is a UserError naming the file and the failed check.
#pragma once

#include "meshtrain/checkpoint/safetensors_file.hpp"
#include "meshtrain/config/llama_config.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace meshtrain::checkpoint {

inline constexpr const char* kCompletionMarker = "meshtrain_complete.json";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kSingleWeightsFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// The files a completion marker lists, by name; empty when the directory has no marker.
using CompletionMarker = std::map<std::string, CheckpointFile>;
CompletionMarker read_completion_marker(const std::filesystem::path& dir);
// Writes the completion marker listing `files`; the checkpoint is complete once this returns.
void write_completion_marker(const std::filesystem::path& dir, const std::vector<CheckpointFile>& files);
// True if `dir` holds a completion marker (the files are verified when read).
bool is_complete_checkpoint(const std::filesystem::path& dir);
// Reads (streamed) and checks every file listed in the marker (size and CRC-32C); UserError naming the first bad one,
// or the directory when it has no marker.
void verify_checkpoint_files(const std::filesystem::path& dir);

// Writes `text` as the file `name` of `dir` atomically and returns its entry for the marker.
CheckpointFile write_checkpoint_file(const std::filesystem::path& dir, const std::string& name,
                                     const std::string& text);
// "model-00001-of-00004.safetensors": the weight file `index` of `count`.
std::string weights_file_name(size_t index, size_t count);
// config.json, marked as meshtrain's; `torch_dtype` is "float32" or "bfloat16" (of the stored weights).
CheckpointFile write_hf_config(const std::filesystem::path& dir, const config::LlamaConfig& config,
                               const std::string& torch_dtype);
// The weight map of a sharded checkpoint (tensor name -> file).
CheckpointFile write_hf_index(const std::filesystem::path& dir, const std::map<std::string, std::string>& weight_map,
                              uint64_t total_bytes);

// The LlamaConfig of the checkpoint in `dir` (its config.json), unchecked against a marker.
config::LlamaConfig read_hf_config(const std::filesystem::path& dir);
// The LlamaConfig of the checkpoint in `dir` as a load reads it: refused when meshtrain wrote the directory and
// `marker` (read_completion_marker(dir)) is missing, or when config.json differs from what the marker says.
config::LlamaConfig read_checked_hf_config(const std::filesystem::path& dir, const CompletionMarker& marker);
// UserError naming config.json in `dir` when `stored` (read from it) and `model` differ in a field that changes what
// the network computes (token ids, the initializer range, the context limit and the dtype may differ).
void check_same_architecture(const std::filesystem::path& dir, const config::LlamaConfig& stored,
                             const config::LlamaConfig& model);

// Whether to check each weight file's size and CRC-32C against the marker (a whole, streamed read of it) when the
// directory has one.
enum class Verify { against_marker, no };
// The weight files of the checkpoint in `dir`, opened (headers validated): those the index maps tensors to, or
// model.safetensors; each must be listed in `marker` when there is one, and each tensor must be in the file the index
// maps it to.
std::vector<SafetensorsFile> open_weight_files(const std::filesystem::path& dir, const CompletionMarker& marker,
                                               Verify verify);

}  // namespace meshtrain::checkpoint
