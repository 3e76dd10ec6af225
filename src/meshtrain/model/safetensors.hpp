// safetensors.hpp — torch tensors in safetensors files (checkpoint/safetensors_file.hpp has the format, its header
// and its validating reader): a streaming writer of CPU tensors, and tensors read from a SafetensorsFile.
#pragma once

#include "meshtrain/checkpoint/safetensors_file.hpp"
#include "meshtrain/common/atomic_file.hpp"

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::model {

// A safetensors file written one tensor (or part of a tensor) at a time: the header (every entry's name, dtype and
// shape, in order) first, then each tensor's bytes in that order, so the writer never needs more than one tensor, or
// one part, in memory.
class SafetensorsStreamWriter {
 public:
  // Writes the header; the entries' byte ranges are assigned here (begin/end are ignored).
  SafetensorsStreamWriter(AtomicFileWriter& out, std::vector<checkpoint::SafetensorsEntry> entries,
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
  std::vector<checkpoint::SafetensorsEntry> entries_;
  size_t next_ = 0;
  uint64_t next_bytes_written_ = 0;  // of entries_[next_], by write_part
};

// Writes `tensors` (CPU; any dtype with a safetensors name) in the given order, then the metadata strings.
void write_safetensors(AtomicFileWriter& out, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The tensor `name` of `file`, a fresh CPU tensor of its dtype and shape (UserError naming the file if absent).
torch::Tensor read_tensor(const checkpoint::SafetensorsFile& file, const std::string& name);
// Elements [first, first + count) of `entry` in row-major order, as a fresh 1-D tensor of the entry's dtype.
torch::Tensor read_elements(const checkpoint::SafetensorsFile& file, const checkpoint::SafetensorsEntry& entry,
                            int64_t first, int64_t count);

// The safetensors dtype of a torch dtype (UserError for one safetensors cannot hold), and back.
checkpoint::SafetensorsDtype safetensors_dtype(torch::Dtype dtype);
torch::Dtype torch_dtype(checkpoint::SafetensorsDtype dtype);

}  // namespace meshtrain::model
