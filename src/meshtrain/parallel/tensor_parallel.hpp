// tensor_parallel.hpp — Megatron-style tensor parallelism over the mesh's `tensor` axis, applied to a finished
// single-device model from outside it.
//
// In every decoder layer, q/k/v and gate/up become column-parallel (each rank holds a block of output rows: whole
// attention heads, whole key/value heads, a block of the MLP's width) and o/down become row-parallel (each rank
// holds the matching block of input columns and the outputs are summed over the group). One all-reduce in the
// forward of each attention and MLP block, one in the backward; everything else (embedding, norms, the head) is
// replicated over `tensor` and gets identical gradients on every rank of the group.
//
// Shape suffixes: N any leading dimensions, I in_features, O out_features (local).
#pragma once

#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/parameter_slice.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <string>

namespace meshtrain::parallel {

// How a parameter is split over `tensor`: not at all, by rows (dim 0, column-parallel), by columns (dim 1,
// row-parallel).
enum class TensorSplit { none, rows, columns };

// The split of the Hugging Face parameter `name` under apply_tensor_parallel (none for every parameter when the
// tensor group has one rank).
TensorSplit tensor_split_of(const std::string& name);

// y = x W_r^T for this rank's block W_r [O/tp, I] of the rows of W; the input is replicated over the group.
// Both parallel linears are made with their block allocated, not written (the FSDP unit fills it).
class ColumnParallelLinear : public model::Linear {
 public:
  ColumnParallelLinear(int64_t local_out_features, int64_t in_features, runtime::Comm& comm);
  torch::Tensor forward(const torch::Tensor& x_NI) override;
  torch::Tensor weight;

 private:
  runtime::Comm& comm_;
};

// y = sum over ranks of x_r W_r^T, with x_r this rank's block of the input features and W_r [O, I/tp].
class RowParallelLinear : public model::Linear {
 public:
  RowParallelLinear(int64_t out_features, int64_t local_in_features, runtime::Comm& comm);
  torch::Tensor forward(const torch::Tensor& x_NI) override;
  torch::Tensor weight;

 private:
  runtime::Comm& comm_;
};

// UserError unless the heads, key/value heads and MLP width divide by `tensor_size` (naming the config key).
void check_tensor_parallel(const config::LlamaConfig& config, int tensor_size);

// Replaces every layer's projections by this rank's column/row-parallel blocks (unwritten; the whole weights are
// dropped without being read), after check_tensor_parallel; a Mixtral's experts keep their blocks of w1/w3 rows and
// w2 columns, entered and left once per block (model/moe.hpp). No-op for a group of one.
void apply_tensor_parallel(model::LlamaForCausalLM& model, runtime::Comm& tensor_comm);

// The block of the parameter `name` (whole shape `full_shape`) that rank `rank` of `size` holds under `split`, as
// a slice of all its elements.
model::ParameterSlice tensor_block_slice(const std::string& name, const std::vector<int64_t>& full_shape,
                                         TensorSplit split, int rank, int size);
// The whole parameter's shape from a rank's block shape.
std::vector<int64_t> whole_shape(const std::vector<int64_t>& block_shape, TensorSplit split, int size);

}  // namespace meshtrain::parallel
