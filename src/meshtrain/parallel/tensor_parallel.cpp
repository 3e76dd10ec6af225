// tensor_parallel.cpp — column/row-parallel linears and their application to a Llama model.
#include "meshtrain/parallel/tensor_parallel.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/parallel/autograd_collectives.hpp"

namespace meshtrain::parallel {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// `name` ends with `pattern`, in which one "*" stands for one non-empty name component (an expert's index).
bool matches(const std::string& name, const std::string& pattern) {
  const size_t star = pattern.find('*');
  if (star == std::string::npos) return ends_with(name, pattern);
  const std::string before = pattern.substr(0, star), after = pattern.substr(star + 1);
  if (!ends_with(name, after)) return false;
  const std::string rest = name.substr(0, name.size() - after.size());
  const size_t dot = rest.rfind('.');
  return dot != std::string::npos && dot + 1 < rest.size() && ends_with(rest.substr(0, dot + 1), before);
}

}  // namespace

TensorSplit tensor_split_of(const std::string& name) {
  for (const char* column : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
                             "experts.*.w1.weight", "experts.*.w3.weight"})
    if (matches(name, column)) return TensorSplit::rows;
  for (const char* row : {"o_proj.weight", "down_proj.weight", "experts.*.w2.weight"})
    if (matches(name, row)) return TensorSplit::columns;
  return TensorSplit::none;
}

ColumnParallelLinear::ColumnParallelLinear(int64_t local_out_features, int64_t in_features, runtime::Comm& comm)
    : comm_(comm) {
  weight = register_parameter("weight", model::new_parameter({local_out_features, in_features}));
}

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x_NI) {
  return model::compute_matmul(copy_to_group(x_NI, comm_), weight.to(x_NI.scalar_type()).t());
}

RowParallelLinear::RowParallelLinear(int64_t out_features, int64_t local_in_features, runtime::Comm& comm)
    : comm_(comm) {
  weight = register_parameter("weight", model::new_parameter({out_features, local_in_features}));
}

torch::Tensor RowParallelLinear::forward(const torch::Tensor& x_NI) {
  return reduce_from_group(model::compute_matmul(x_NI, weight.to(x_NI.scalar_type()).t()), comm_);
}

model::ParameterSlice tensor_block_slice(const std::string& name, const std::vector<int64_t>& full_shape,
                                         TensorSplit split, int rank, int size) {
  model::ParameterSlice block = model::ParameterSlice::whole(name, full_shape);
  if (split == TensorSplit::none || size == 1) return block;
  MT_CHECK(full_shape.size() == 2, "{}: only 2-D parameters split over tensor", name);
  const int64_t dim = split == TensorSplit::rows ? 0 : 1;
  MT_CHECK(full_shape[dim] % size == 0, "{}: dimension {} of size {} does not split over {} tensor ranks", name, dim,
           full_shape[dim], size);
  if (split == TensorSplit::rows) {
    block.rows = full_shape[0] / size;
    block.row_begin = rank * block.rows;
  } else {
    block.cols = full_shape[1] / size;
    block.col_begin = rank * block.cols;
  }
  return block.range(0, block.block_numel());
}

std::vector<int64_t> whole_shape(const std::vector<int64_t>& block_shape, TensorSplit split, int size) {
  std::vector<int64_t> shape = block_shape;
  if (split != TensorSplit::none) shape.at(split == TensorSplit::rows ? 0 : 1) *= size;
  return shape;
}

void check_tensor_parallel(const config::LlamaConfig& config, int n) {
  MT_USER_CHECK(config.num_attention_heads % n == 0,
                "tensor parallelism over {} ranks needs num_attention_heads ({}) to be a multiple of {}", n,
                config.num_attention_heads, n);
  MT_USER_CHECK(config.num_key_value_heads % n == 0,
                "tensor parallelism over {} ranks needs num_key_value_heads ({}) to be a multiple of {}", n,
                config.num_key_value_heads, n);
  MT_USER_CHECK(config.intermediate_size % n == 0,
                "tensor parallelism over {} ranks needs intermediate_size ({}) to be a multiple of {}", n,
                config.intermediate_size, n);
}

void apply_tensor_parallel(model::LlamaForCausalLM& model, runtime::Comm& tensor_comm) {
  const int n = tensor_comm.size();
  if (n == 1) return;
  check_tensor_parallel(model.config(), n);
  for (const std::string& name : model.linear_names()) {
    const TensorSplit split = tensor_split_of(name + ".weight");
    if (split == TensorSplit::none) continue;
    const std::vector<int64_t> whole = model.linear(name)->named_parameters()["weight"].sizes().vec();  // [O, I]
    if (split == TensorSplit::rows)
      model.replace_linear(name, std::make_shared<ColumnParallelLinear>(whole[0] / n, whole[1], tensor_comm));
    else
      model.replace_linear(name, std::make_shared<RowParallelLinear>(whole[0], whole[1] / n, tensor_comm));
  }
  runtime::Comm* comm = &tensor_comm;
  for (const auto& layer : model.model->layers)
    if (layer->block_sparse_moe)
      layer->block_sparse_moe->shard_over_tensor(
          n, [comm](const torch::Tensor& x) { return copy_to_group(x, *comm); },
          [comm](const torch::Tensor& y) { return reduce_from_group(y, *comm); });
}

}  // namespace meshtrain::parallel
