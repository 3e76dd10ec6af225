// parameter_slice.cpp — ParameterSlice geometry and slices of whole tensors.
#include "meshtrain/model/parameter_slice.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

namespace meshtrain::model {

ParameterSlice ParameterSlice::whole(std::string name, std::vector<int64_t> shape) {
  ParameterSlice s;
  s.name = std::move(name);
  s.full_shape = std::move(shape);
  s.rows = s.full_shape.size() <= 1 ? 1 : s.full_shape[0];
  s.cols = s.full_cols();
  s.flat_end = s.block_numel();
  return s;
}

ParameterSlice ParameterSlice::range(int64_t begin, int64_t end) const {
  MT_CHECK(0 <= begin && begin <= end && end <= block_numel(), "{}: elements [{}, {}) outside a block of {}", name,
           begin, end, block_numel());
  ParameterSlice s = *this;
  s.flat_begin = begin;
  s.flat_end = end;
  return s;
}

int64_t ParameterSlice::full_cols() const {
  if (full_shape.empty()) return 1;
  if (full_shape.size() == 1) return full_shape[0];
  int64_t cols = 1;
  for (size_t d = 1; d < full_shape.size(); ++d) cols *= full_shape[d];
  return cols;
}

void ParameterSlice::for_each_run(
    const std::function<void(int64_t whole_index, int64_t count, int64_t slice_offset)>& fn) const {
  const int64_t whole_cols = full_cols();
  if (cols == whole_cols) {  // whole rows: the block is contiguous in the parameter
    if (numel() > 0) fn(row_begin * whole_cols + flat_begin, numel(), 0);
    return;
  }
  for (int64_t j = flat_begin; j < flat_end;) {
    const int64_t row = j / cols, col = j % cols;
    const int64_t count = std::min(cols - col, flat_end - j);
    fn((row_begin + row) * whole_cols + col_begin + col, count, j - flat_begin);
    j += count;
  }
}

std::string ParameterSlice::describe() const {
  return fmt::format("{}[{}:{} of block rows {}:{} cols {}:{}]", name, flat_begin, flat_end, row_begin,
                     row_begin + rows, col_begin, col_begin + cols);
}

SliceSource slices_of_whole_tensors(std::function<at::Tensor(const std::string&)> whole_of) {
  return [whole_of = std::move(whole_of)](const ParameterSlice& slice, const at::Tensor& out) {
    const at::Tensor whole = whole_of(slice.name).contiguous();
    MT_CHECK(whole.sizes().vec() == slice.full_shape, "{}: the whole tensor has shape {}", slice.describe(),
             c10::str(whole.sizes()));
    const at::Tensor flat = whole.reshape({-1});
    slice.for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
      out.narrow(0, offset, count).copy_(flat.narrow(0, whole_index, count));
    });
  };
}

}  // namespace meshtrain::model
