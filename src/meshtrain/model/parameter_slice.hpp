// parameter_slice.hpp — a piece of one parameter, named by where it sits in the whole (Hugging Face) tensor, so that
// whatever produces parameter values (the initializer, a checkpoint reader, a full tensor) can produce just the
// piece a device holds: the device's tensor-parallel block of the parameter, and a range of that block's elements
// (its FSDP shard of the block).
//
// The parameter is viewed as 2-D [full_rows, full_cols] (a 1-D parameter as one row); the block is a rectangle of
// it, and the slice is elements [flat_begin, flat_end) of the block in row-major order.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace meshtrain::model {

struct ParameterSlice {
  std::string name;                 // Hugging Face name
  std::vector<int64_t> full_shape;  // of the whole parameter
  int64_t row_begin = 0, rows = 0, col_begin = 0, cols = 0;  // the block, in the 2-D view
  int64_t flat_begin = 0, flat_end = 0;                      // within the block, row-major

  // All of a parameter of `shape` (one block, every element).
  static ParameterSlice whole(std::string name, std::vector<int64_t> shape);
  // Elements [begin, end) of the same block.
  ParameterSlice range(int64_t begin, int64_t end) const;

  int64_t full_cols() const;
  int64_t block_numel() const { return rows * cols; }
  int64_t numel() const { return flat_end - flat_begin; }
  // The slice as runs of consecutive elements of the whole parameter (row-major): fn(first element's index in the
  // whole parameter, element count, offset in the slice). One run when the block spans whole rows.
  void for_each_run(const std::function<void(int64_t whole_index, int64_t count, int64_t slice_offset)>& fn) const;
  std::string describe() const;  // "model.norm.weight[0:768 of block rows 0:1 cols 0:768]"
};

// Writes the values of a slice into `out` (fp32, contiguous, [slice.numel()]: where they are kept, a piece of a
// shard, so that no copy of them is made on the way).
using SliceSource = std::function<void(const ParameterSlice& slice, const at::Tensor& out)>;

// Slices cut from whole tensors: `whole_of(name)` returns the whole parameter (any float dtype).
SliceSource slices_of_whole_tensors(std::function<at::Tensor(const std::string&)> whole_of);

}  // namespace meshtrain::model
