// autograd_collectives.cpp — copy_to_group and reduce_from_group as torch::autograd::Functions.
#include "meshtrain/parallel/autograd_collectives.hpp"

#include <torch/torch.h>

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The Comm travels through the autograd context as an integer (saved_data holds IValues only).
void save_comm(AutogradContext* ctx, runtime::Comm& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}
runtime::Comm& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<runtime::Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

at::Tensor all_reduced(const at::Tensor& x, runtime::Comm& comm) {
  at::Tensor sum = x.contiguous().clone();
  comm.allreduce_sum(sum);
  return sum;
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, runtime::Comm* comm) {
    save_comm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved_comm(ctx)), at::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, runtime::Comm* comm) { return all_reduced(x, *comm); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

at::Tensor copy_to_group(const at::Tensor& x, runtime::Comm& comm) {
  return comm.size() == 1 ? x : CopyToGroup::apply(x, &comm);
}

at::Tensor reduce_from_group(const at::Tensor& x, runtime::Comm& comm) {
  return comm.size() == 1 ? x : ReduceFromGroup::apply(x, &comm);
}

}  // namespace meshtrain::parallel
