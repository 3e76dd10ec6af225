// safetensors_file.hpp — the safetensors format (Hugging Face's weight files) without torch: the header, written for a
// writer that streams the data itself, and a validating reader of headers and byte ranges.
//
//   [8 bytes: little-endian u64 N] [N bytes: JSON header, space-padded] [data]
//   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
//
// Offsets are relative to the start of the data; the tensors must tile the data exactly (no gaps, no overlap). The
// reader checks all of that when it opens a file and names the file and the failed check in its UserError; what it
// then reads is only the byte ranges asked for. Tensors of these bytes are model/safetensors.hpp's business; a file's
// checksum is the completion marker's (completion_marker.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::checkpoint {

enum class SafetensorsDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

// "F32", "BF16", ... as the header spells them, and back (UserError naming `context` for another name).
const char* safetensors_dtype_name(SafetensorsDtype dtype);
SafetensorsDtype parse_safetensors_dtype(const std::string& name, const std::string& context);
uint64_t element_bytes(SafetensorsDtype dtype);

struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section

  int64_t numel() const;
};

// The bytes that start a file holding `entries` in this order (the length, the header, its padding to 8 bytes); fills
// each entry's byte range (begin/end given are ignored). The caller writes each entry's bytes after it, in order.
std::string safetensors_header(std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

// A safetensors file opened for reading: the header is read and validated up front (the data not at all), and byte
// ranges are read when asked (pread), so a reader holds only what it asked for. Copies share the open file; its const
// methods may be called from several threads at once.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError naming the file if absent
  // Elements [first, first + count) of `entry` in row-major order, as raw bytes of its dtype, into `out`
  // (count * element_bytes(entry.dtype) bytes).
  void read_elements(const SafetensorsEntry& entry, int64_t first, int64_t count, void* out) const;
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

}  // namespace meshtrain::checkpoint
