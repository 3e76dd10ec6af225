// safetensors_file.cpp — safetensors headers: the writer's, and the reader that validates one and reads byte ranges.
#include "meshtrain/checkpoint/safetensors_file.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/shape_text.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace meshtrain::checkpoint {
namespace {

// Headers larger than this are refused as damaged (HF's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  uint64_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::F64, "F64", 8}, {SafetensorsDtype::F32, "F32", 4}, {SafetensorsDtype::F16, "F16", 2},
    {SafetensorsDtype::BF16, "BF16", 2}, {SafetensorsDtype::I64, "I64", 8}, {SafetensorsDtype::I32, "I32", 4},
    {SafetensorsDtype::I16, "I16", 2}, {SafetensorsDtype::I8, "I8", 1},    {SafetensorsDtype::U8, "U8", 1},
    {SafetensorsDtype::BOOL, "BOOL", 1}};

const DtypeInfo& info(SafetensorsDtype dtype) {
  for (const DtypeInfo& d : kDtypes)
    if (d.dtype == dtype) return d;
  throw Error("safetensors: a dtype outside the enumeration");
}

// The bytes a tensor of `dtype` and `shape` (sizes >= 0) needs; UserError naming `context` when that, or the
// element count with zero sizes left out (torch computes strides from it), does not fit in 63 bits.
uint64_t nbytes_of(SafetensorsDtype dtype, const std::vector<int64_t>& shape, const std::string& context) {
  int64_t nonzero_bytes = static_cast<int64_t>(element_bytes(dtype));
  bool empty = false;
  for (int64_t d : shape) {
    empty = empty || d == 0;
    MT_USER_CHECK(!__builtin_mul_overflow(nonzero_bytes, std::max<int64_t>(d, 1), &nonzero_bytes),
                  "{}: shape check failed: the sizes {} overflow a 64-bit byte count", context, shape_text(shape));
  }
  return empty ? 0 : static_cast<uint64_t>(nonzero_bytes);
}

}  // namespace

const char* safetensors_dtype_name(SafetensorsDtype dtype) { return info(dtype).name; }

uint64_t element_bytes(SafetensorsDtype dtype) { return info(dtype).bytes; }

SafetensorsDtype parse_safetensors_dtype(const std::string& name, const std::string& context) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name) return d.dtype;
  throw UserError(fmt::format("{}: unsupported safetensors dtype '{}'", context, bounded_text(name)));
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string safetensors_header(std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (SafetensorsEntry& e : entries) {
    MT_CHECK(!header.contains(e.name), "safetensors: tensor name {} given twice", e.name);
    e.begin = offset;
    e.end = offset + nbytes_of(e.dtype, e.shape, e.name);
    offset = e.end;
    header[e.name] = {
        {"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  const std::string where = path.string();
  const int fd = ::open(where.c_str(), O_RDONLY | O_CLOEXEC);
  MT_USER_CHECK(fd >= 0, "cannot open {}: {}", where, std::strerror(errno));
  file.fd_ = std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat stat_of_file {};
  MT_USER_CHECK(::fstat(fd, &stat_of_file) == 0, "cannot stat {}: {}", where, std::strerror(errno));
  const uint64_t size = file.file_size_ = static_cast<uint64_t>(stat_of_file.st_size);
  MT_USER_CHECK(size >= 8, "{}: the file is {} bytes, too short for the 8-byte header length", where, size);
  uint8_t length[8];
  file.read_bytes(0, 8, length);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(length[i]) << (8 * i);
  MT_USER_CHECK(header_len <= kMaxHeaderBytes && 8 + header_len <= size,
                "{}: header length {} does not fit in the file of {} bytes (damaged or not safetensors)", where,
                header_len, size);
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = size - file.data_start_;
  std::string header_text(header_len, '\0');
  file.read_bytes(8, header_len, header_text.data());

  const nlohmann::json header = parse_json(header_text, where);
  MT_USER_CHECK(header.is_object(), "{}: the header is not a JSON object", where);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      MT_USER_CHECK(value.is_object(), "{}: __metadata__ is not an object", where);
      for (const auto& [k, v] : value.items()) {
        MT_USER_CHECK(v.is_string(), "{}: __metadata__ value '{}' is not a string", where, bounded_text(k));
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string context = fmt::format("{}: tensor '{}'", where, bounded_text(name));
    MT_USER_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                      value.contains("data_offsets"),
                  "{} lacks dtype, shape or data_offsets", context);
    SafetensorsEntry e;
    e.name = name;
    MT_USER_CHECK(value["dtype"].is_string(), "{}: dtype is not a string", context);
    e.dtype = parse_safetensors_dtype(value["dtype"].get<std::string>(), context);
    const auto& shape = value["shape"];
    const auto& offsets = value["data_offsets"];
    MT_USER_CHECK(shape.is_array(), "{}: shape is not a list", context);
    for (const auto& d : shape) {
      MT_USER_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "{}: shape {} is not a list of sizes", context,
                    json_excerpt(shape));
      e.shape.push_back(d.get<int64_t>());
    }
    MT_USER_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                      offsets[1].is_number_unsigned(),
                  "{}: data_offsets {} is not [begin, end]", context, json_excerpt(offsets));
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t nbytes = nbytes_of(e.dtype, e.shape, context);
    MT_USER_CHECK(e.begin <= e.end && e.end - e.begin == nbytes,
                  "{}: data_offsets [{}, {}] span {} bytes but dtype {} and shape {} need {}", context, e.begin, e.end,
                  e.end - e.begin, value["dtype"].get<std::string>(), json_excerpt(shape), nbytes);
    MT_USER_CHECK(e.end <= data_size, "{}: data ends at byte {} but the file holds {} data bytes (truncated?)",
                  context, e.end, data_size);
    file.entries_.push_back(std::move(e));
  }
  // The tensors must tile the data section exactly.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : file.entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  uint64_t covered = 0;
  for (const SafetensorsEntry* e : by_offset) {
    MT_USER_CHECK(e->begin == covered, "{}: tensor '{}' starts at data byte {} but the previous one ends at {}", where,
                  e->name, e->begin, covered);
    covered = e->end;
  }
  MT_USER_CHECK(covered == data_size, "{}: the tensors cover {} data bytes but the file holds {} (damaged?)", where,
                covered, data_size);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;
  return file;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  MT_USER_CHECK(it != index_.end(), "{}: no tensor named '{}'", path_.string(), name);
  return entries_[it->second];
}

void SafetensorsFile::read_bytes(uint64_t offset, uint64_t size, void* out) const {
  auto* dest = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t got = ::pread(*fd_, dest, std::min<uint64_t>(size, 1ull << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    MT_USER_CHECK(got > 0, "{}: reading {} bytes at offset {} failed: {}", path_.string(), size, offset,
                  got == 0 ? "the file is shorter than when it was opened" : std::strerror(errno));
    dest += got;
    offset += static_cast<uint64_t>(got);
    size -= static_cast<uint64_t>(got);
  }
}

void SafetensorsFile::read_elements(const SafetensorsEntry& e, int64_t first, int64_t count, void* out) const {
  const uint64_t element = element_bytes(e.dtype);
  MT_CHECK(first >= 0 && count >= 0 && static_cast<uint64_t>(first + count) * element <= e.end - e.begin,
           "{}: elements [{}, {}) are outside tensor '{}'", path_.string(), first, first + count, e.name);
  if (count > 0) read_bytes(data_start_ + e.begin + static_cast<uint64_t>(first) * element, count * element, out);
}

}  // namespace meshtrain::checkpoint
