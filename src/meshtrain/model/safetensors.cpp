// safetensors.cpp — the safetensors writer and the validating reader.
#include "meshtrain/model/safetensors.hpp"

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>

namespace meshtrain::model {
namespace {

// Headers larger than this are refused as damaged (HF's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const std::vector<std::pair<std::string, torch::Dtype>>& dtype_names() {
  static const std::vector<std::pair<std::string, torch::Dtype>> names = {
      {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
      {"U8", torch::kUInt8},    {"BOOL", torch::kBool}};
  return names;
}

// The bytes a tensor of `dtype` and `shape` (sizes >= 0) needs; UserError naming `context` when that, or the
// element count with zero sizes left out (torch computes strides from it), does not fit in 63 bits.
uint64_t nbytes_of(torch::Dtype dtype, const std::vector<int64_t>& shape, const std::string& context) {
  int64_t nonzero_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  bool empty = false;
  for (int64_t d : shape) {
    empty = empty || d == 0;
    MT_USER_CHECK(!__builtin_mul_overflow(nonzero_bytes, std::max<int64_t>(d, 1), &nonzero_bytes),
                  "{}: shape check failed: the sizes {} overflow a 64-bit byte count", context,
                  c10::str(c10::IntArrayRef(shape)));
  }
  return empty ? 0 : static_cast<uint64_t>(nonzero_bytes);
}

}  // namespace

std::string safetensors_dtype_name(torch::Dtype dtype) {
  for (const auto& [name, d] : dtype_names())
    if (d == dtype) return name;
  throw UserError(fmt::format("dtype {} cannot be stored in safetensors", c10::toString(dtype)));
}

torch::Dtype safetensors_dtype(const std::string& name, const std::string& context) {
  for (const auto& [n, d] : dtype_names())
    if (n == name) return d;
  throw UserError(fmt::format("{}: unsupported safetensors dtype '{}'", context, name));
}

void write_safetensors(AtomicFileWriter& out, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MT_CHECK(tensor.device().is_cpu(), "safetensors: tensor {} is not on the CPU", name);
    MT_CHECK(!header.contains(name), "safetensors: tensor name {} given twice", name);
    contiguous.push_back(tensor.contiguous());
    const uint64_t nbytes = contiguous.back().nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(length, 8);
  out.write(text.data(), text.size());
  for (const torch::Tensor& t : contiguous) out.write(t.data_ptr(), t.nbytes());
}

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.path_ = path;
  const std::string where = path.string();
  {
    std::ifstream in(path, std::ios::binary);
    MT_USER_CHECK(in, "cannot open {}", where);
    in.seekg(0, std::ios::end);
    file.bytes_.resize(static_cast<size_t>(in.tellg()));
    in.seekg(0);
    in.read(file.bytes_.data(), static_cast<std::streamsize>(file.bytes_.size()));
    MT_USER_CHECK(in, "reading {} failed", where);
  }
  file.crc32c_ = meshtrain::crc32c(file.bytes_.data(), file.bytes_.size());
  const uint64_t size = file.bytes_.size();
  MT_USER_CHECK(size >= 8, "{}: the file is {} bytes, too short for the 8-byte header length", where, size);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<uint8_t>(file.bytes_[i])) << (8 * i);
  MT_USER_CHECK(header_len <= kMaxHeaderBytes && 8 + header_len <= size,
                "{}: header length {} does not fit in the file of {} bytes (damaged or not safetensors)", where,
                header_len, size);
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = size - file.data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.bytes_.begin() + 8, file.bytes_.begin() + static_cast<long>(8 + header_len));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: the header is not valid JSON: {}", where, e.what()));
  }
  MT_USER_CHECK(header.is_object(), "{}: the header is not a JSON object", where);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      MT_USER_CHECK(value.is_object(), "{}: __metadata__ is not an object", where);
      for (const auto& [k, v] : value.items()) {
        MT_USER_CHECK(v.is_string(), "{}: __metadata__ value '{}' is not a string", where, k);
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string context = fmt::format("{}: tensor '{}'", where, name);
    MT_USER_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                      value.contains("data_offsets"),
                  "{} lacks dtype, shape or data_offsets", context);
    SafetensorsEntry e;
    e.name = name;
    MT_USER_CHECK(value["dtype"].is_string(), "{}: dtype is not a string", context);
    e.dtype = safetensors_dtype(value["dtype"].get<std::string>(), context);
    const auto& shape = value["shape"];
    const auto& offsets = value["data_offsets"];
    MT_USER_CHECK(shape.is_array(), "{}: shape is not a list", context);
    for (const auto& d : shape) {
      MT_USER_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "{}: shape {} is not a list of sizes", context,
                    shape.dump());
      e.shape.push_back(d.get<int64_t>());
    }
    MT_USER_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                      offsets[1].is_number_unsigned(),
                  "{}: data_offsets {} is not [begin, end]", context, offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t nbytes = nbytes_of(e.dtype, e.shape, context);
    MT_USER_CHECK(e.begin <= e.end && e.end - e.begin == nbytes,
                  "{}: data_offsets [{}, {}] span {} bytes but dtype {} and shape {} need {}", context, e.begin, e.end,
                  e.end - e.begin, value["dtype"].get<std::string>(), shape.dump(), nbytes);
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

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  // An empty tensor has no storage (data_ptr() is null), and memcpy with a null pointer is undefined even for 0 bytes.
  if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes_.data() + data_start_ + e.begin, e.end - e.begin);
  return t;
}

}  // namespace meshtrain::model
