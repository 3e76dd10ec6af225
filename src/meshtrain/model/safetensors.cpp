// safetensors.cpp — the streaming safetensors writer of torch tensors, and tensors read from safetensors files.
#include "meshtrain/model/safetensors.hpp"

#include "meshtrain/common/error.hpp"

namespace meshtrain::model {

using checkpoint::SafetensorsDtype;
using checkpoint::SafetensorsEntry;

namespace {

constexpr std::pair<SafetensorsDtype, torch::Dtype> kTorchDtypes[] = {
    {SafetensorsDtype::F64, torch::kFloat64}, {SafetensorsDtype::F32, torch::kFloat32},
    {SafetensorsDtype::F16, torch::kFloat16}, {SafetensorsDtype::BF16, torch::kBFloat16},
    {SafetensorsDtype::I64, torch::kInt64},   {SafetensorsDtype::I32, torch::kInt32},
    {SafetensorsDtype::I16, torch::kInt16},   {SafetensorsDtype::I8, torch::kInt8},
    {SafetensorsDtype::U8, torch::kUInt8},    {SafetensorsDtype::BOOL, torch::kBool}};

}  // namespace

SafetensorsDtype safetensors_dtype(torch::Dtype dtype) {
  for (const auto& [stored, in_torch] : kTorchDtypes)
    if (in_torch == dtype) return stored;
  throw UserError(fmt::format("dtype {} cannot be stored in safetensors", c10::toString(dtype)));
}

torch::Dtype torch_dtype(SafetensorsDtype dtype) {
  for (const auto& [stored, in_torch] : kTorchDtypes)
    if (stored == dtype) return in_torch;
  throw Error("safetensors: a dtype outside the enumeration");
}

SafetensorsStreamWriter::SafetensorsStreamWriter(AtomicFileWriter& out, std::vector<SafetensorsEntry> entries,
                                                 const std::map<std::string, std::string>& metadata)
    : out_(out), entries_(std::move(entries)) {
  const std::string header = checkpoint::safetensors_header(entries_, metadata);
  out_.write(header.data(), header.size());
}

void SafetensorsStreamWriter::write_next(const torch::Tensor& tensor) {
  MT_CHECK(next_ < entries_.size(), "safetensors: {} tensors announced, a {}th written", entries_.size(), next_ + 1);
  MT_CHECK(next_bytes_written_ == 0, "safetensors: tensor {} given whole after a part of it",
           entries_[next_].name);
  const SafetensorsEntry& e = entries_[next_++];
  MT_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == torch_dtype(e.dtype) && tensor.sizes().vec() == e.shape,
           "safetensors: tensor {} is {} {} on {}, announced as {} {}", e.name, c10::toString(tensor.scalar_type()),
           c10::str(tensor.sizes()), c10::str(tensor.device()), checkpoint::safetensors_dtype_name(e.dtype),
           c10::str(c10::IntArrayRef(e.shape)));
  const torch::Tensor contiguous = tensor.contiguous();
  out_.write(contiguous.data_ptr(), contiguous.nbytes());
}

void SafetensorsStreamWriter::write_part(const torch::Tensor& elements) {
  MT_CHECK(next_ < entries_.size(), "safetensors: {} tensors announced, a part of a {}th written", entries_.size(),
           next_ + 1);
  const SafetensorsEntry& e = entries_[next_];
  const torch::Tensor contiguous = elements.contiguous();
  const uint64_t size = e.end - e.begin;
  MT_CHECK(elements.device().is_cpu() && elements.scalar_type() == torch_dtype(e.dtype) &&
               next_bytes_written_ + contiguous.nbytes() <= size,
           "safetensors: a part of tensor {} ({} {} on {}) that does not fit its remaining {} of {} bytes of {}",
           e.name, c10::str(elements.sizes()), c10::toString(elements.scalar_type()), c10::str(elements.device()),
           size - next_bytes_written_, size, checkpoint::safetensors_dtype_name(e.dtype));
  out_.write(contiguous.data_ptr(), contiguous.nbytes());
  next_bytes_written_ += contiguous.nbytes();
  if (next_bytes_written_ == size) {
    ++next_;
    next_bytes_written_ = 0;
  }
}

void SafetensorsStreamWriter::finish() const {
  MT_CHECK(next_ == entries_.size(), "safetensors: {} of {} announced tensors written", next_, entries_.size());
}

void write_safetensors(AtomicFileWriter& out, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : tensors)
    entries.push_back({name, safetensors_dtype(tensor.scalar_type()), tensor.sizes().vec()});
  SafetensorsStreamWriter writer(out, std::move(entries), metadata);
  for (const auto& [name, tensor] : tensors) writer.write_next(tensor);
  writer.finish();
}

torch::Tensor read_tensor(const checkpoint::SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry& e = file.entry(name);
  return read_elements(file, e, 0, e.numel()).view(e.shape);
}

torch::Tensor read_elements(const checkpoint::SafetensorsFile& file, const SafetensorsEntry& e, int64_t first,
                            int64_t count) {
  torch::Tensor t = torch::empty({count}, torch::TensorOptions().dtype(torch_dtype(e.dtype)));
  // An empty tensor has no storage (data_ptr() is null): nothing to read.
  if (count > 0) file.read_elements(e, first, count, t.data_ptr());
  return t;
}

}  // namespace meshtrain::model
