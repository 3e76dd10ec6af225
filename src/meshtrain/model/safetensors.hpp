// safetensors.hpp — reader and writer of the safetensors format (Hugging Face's weight files), written here:
//
//   [8 bytes: little-endian u64 N] [N bytes: JSON header, space-padded] [data]
//   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
//
// Offsets are relative to the start of the data; the tensors must tile the data exactly (no gaps, no overlap).
// The reader checks all of that up front and names the file and the failed check in its UserError. The file's
// checksum is the completion marker's business (hf_checkpoint.hpp), computed while writing.
#pragma once

#include "meshtrain/common/atomic_file.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::model {

struct SafetensorsEntry {
  std::string name;
  torch::Dtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
};

// A safetensors file written one tensor (or part of a tensor) at a time: the header (every entry's name, dtype and
// shape, in order) first, then each tensor's bytes in that order, so the writer never needs more than one tensor, or
// one part, in memory.
class SafetensorsStreamWriter {
 public:
  // Writes the header; the entries' byte ranges are assigned here (begin/end are ignored).
  SafetensorsStreamWriter(AtomicFileWriter& out, std::vector<SafetensorsEntry> entries,
                          const std::map<std::string, std::string>& metadata = {});
  // The next entry's tensor (CPU, its dtype and shape).
  void write_next(const torch::Tensor& tensor);
  // The next elements (row-major) of the current entry, in its dtype, any shape: an entry is written once all its
  // elements have come, whole or in parts, which never span two entries.
  void write_part(const torch::Tensor& elements);
  // Error unless every entry was written.
  void finish() const;

 private:
  AtomicFileWriter& out_;
  std::vector<SafetensorsEntry> entries_;
  size_t next_ = 0;
  uint64_t next_bytes_written_ = 0;  // of entries_[next_], by write_part
};

// Writes `tensors` (CPU; any dtype with a safetensors name) in the given order, then the metadata strings.
void write_safetensors(AtomicFileWriter& out, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A safetensors file opened for reading: the header is read and validated up front (the data not at all), and
// tensors, or ranges of their elements, are read from the file when asked (pread), so a reader holds only what
// it asked for.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError naming the file if absent
  torch::Tensor tensor(const std::string& name) const;            // a fresh CPU tensor of its dtype and shape
  // Elements [first, first + count) of `entry` in row-major order, as a fresh 1-D tensor of the entry's dtype.
  torch::Tensor read_elements(const SafetensorsEntry& entry, int64_t first, int64_t count) const;
  uint64_t file_size() const { return file_size_; }

 private:
  void read_bytes(uint64_t offset, uint64_t size, void* out) const;

  std::filesystem::path path_;
  std::shared_ptr<int> fd_;  // closed with the last copy
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// "F32", "BF16", ... for a torch dtype, and back; UserError for one safetensors cannot hold.
std::string safetensors_dtype_name(torch::Dtype dtype);
torch::Dtype safetensors_dtype(const std::string& name, const std::string& context);

}  // namespace meshtrain::model
