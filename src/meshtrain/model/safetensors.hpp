// safetensors.hpp — reader and writer of the safetensors format (Hugging Face's weight files), written here:
//
//   [8 bytes: little-endian u64 N] [N bytes: JSON header, space-padded] [data]
//   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
//
// Offsets are relative to the start of the data; the tensors must tile the data exactly (no gaps, no overlap).
// The reader checks all of that up front and names the file and the failed check in its UserError.
#pragma once

#include "meshtrain/common/atomic_file.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::model {

// Writes `tensors` (CPU; any dtype with a safetensors name) in the given order, then the metadata strings.
void write_safetensors(AtomicFileWriter& out, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsEntry {
  std::string name;
  torch::Dtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// A safetensors file read whole into memory and validated.
class SafetensorsFile {
 public:
  static SafetensorsFile read(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError naming the file if absent
  torch::Tensor tensor(const std::string& name) const;            // a fresh CPU tensor (a copy of the bytes)
  uint32_t crc32c() const { return crc32c_; }                     // of the whole file
  uint64_t file_size() const { return bytes_.size(); }

 private:
  std::filesystem::path path_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  uint32_t crc32c_ = 0;
};

// "F32", "BF16", ... for a torch dtype, and back; UserError for one safetensors cannot hold.
std::string safetensors_dtype_name(torch::Dtype dtype);
torch::Dtype safetensors_dtype(const std::string& name, const std::string& context);

}  // namespace meshtrain::model
