// tensor_parallel.cpp — column/row-parallel linears and their application to a Llama model.
#include "meshtrain/parallel/tensor_parallel.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/parallel/collectives.hpp"

namespace meshtrain::parallel {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TensorSplit tensor_split_of(const std::string& name) {
  for (const char* column : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight"})
    if (ends_with(name, column)) return TensorSplit::rows;
  for (const char* row : {"o_proj.weight", "down_proj.weight"})
    if (ends_with(name, row)) return TensorSplit::columns;
  return TensorSplit::none;
}

ColumnParallelLinear::ColumnParallelLinear(const at::Tensor& local_weight_OI, runtime::Comm& comm) : comm_(comm) {
  weight = register_parameter("weight", local_weight_OI.contiguous());
}

torch::Tensor ColumnParallelLinear::forward(const torch::Tensor& x_NI) {
  return torch::matmul(copy_to_group(x_NI, comm_), weight.to(x_NI.scalar_type()).t());
}

RowParallelLinear::RowParallelLinear(const at::Tensor& local_weight_OI, runtime::Comm& comm) : comm_(comm) {
  weight = register_parameter("weight", local_weight_OI.contiguous());
}

torch::Tensor RowParallelLinear::forward(const torch::Tensor& x_NI) {
  return reduce_from_group(torch::matmul(x_NI, weight.to(x_NI.scalar_type()).t()), comm_);
}

at::Tensor tensor_block(const at::Tensor& full, TensorSplit split, runtime::Comm& tensor_comm) {
  const int n = tensor_comm.size();
  if (split == TensorSplit::none || n == 1) return full.clone();
  const int64_t dim = split == TensorSplit::rows ? 0 : 1;
  MT_CHECK(full.size(dim) % n == 0, "dimension {} of size {} does not split over {} tensor ranks", dim, full.size(dim), n);
  return full.chunk(n, dim)[tensor_comm.rank()].contiguous();
}

at::Tensor gather_tensor_blocks(const at::Tensor& block, TensorSplit split, runtime::Comm& tensor_comm) {
  if (split == TensorSplit::none || tensor_comm.size() == 1) return block;
  if (split == TensorSplit::rows) return tensor_comm.allgather(block.contiguous());
  // Blocks of columns: gather the transposes as rows.
  return tensor_comm.allgather(block.t().contiguous()).t().contiguous();
}

void check_tensor_parallel(const model::LlamaConfig& config, int n) {
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
  torch::NoGradGuard no_grad;
  for (const std::string& name : model.linear_names()) {
    const TensorSplit split = tensor_split_of(name + ".weight");
    if (split == TensorSplit::none) continue;
    const at::Tensor block = tensor_block(model.linear(name)->named_parameters()["weight"], split, tensor_comm);
    if (split == TensorSplit::rows)
      model.replace_linear(name, std::make_shared<ColumnParallelLinear>(block, tensor_comm));
    else
      model.replace_linear(name, std::make_shared<RowParallelLinear>(block, tensor_comm));
  }
}

}  // namespace meshtrain::parallel
