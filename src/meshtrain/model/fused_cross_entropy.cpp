// fused_cross_entropy.cpp — chunked cross-entropy of the output head with its gradients computed in the forward
// pass (fused_cross_entropy.hpp says why).
#include "meshtrain/model/fused_cross_entropy.hpp"

#include "meshtrain/common/error.hpp"

namespace meshtrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

CrossEntropyWithGradients chunked_loss(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                       const torch::Tensor& targets_N, int64_t chunk_rows, bool with_gradients) {
  torch::NoGradGuard no_grad;
  const int64_t N = hidden_ND.size(0);
  const torch::Tensor compute_weight_VD = weight_VD.to(hidden_ND.scalar_type());
  CrossEntropyWithGradients out;
  out.loss = torch::zeros({}, torch::kFloat32);
  if (with_gradients) {
    out.grad_hidden_ND = torch::empty_like(hidden_ND);
    out.grad_weight_VD = torch::zeros(weight_VD.sizes(), weight_VD.options().dtype(torch::kFloat32));
  }
  for (int64_t begin = 0; begin < N; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, N - begin);
    const torch::Tensor h_CD = hidden_ND.narrow(0, begin, rows);
    const torch::Tensor t_C1 = targets_N.narrow(0, begin, rows).unsqueeze(1);
    torch::Tensor logits_CV = torch::matmul(h_CD, compute_weight_VD.t()).to(torch::kFloat32);
    const torch::Tensor logsumexp_C1 = logits_CV.logsumexp(1, /*keepdim=*/true);
    out.loss.add_((logsumexp_C1 - logits_CV.gather(1, t_C1)).sum());
    if (!with_gradients) continue;
    // d loss / d logits = softmax - one_hot(target), computed in the logits' buffer.
    torch::Tensor& grad_logits_CV = logits_CV.sub_(logsumexp_C1).exp_();
    grad_logits_CV.scatter_add_(1, t_C1, torch::full({rows, 1}, -1.0f));
    const torch::Tensor compute_grad_CV = grad_logits_CV.to(hidden_ND.scalar_type());
    out.grad_hidden_ND.narrow(0, begin, rows).copy_(torch::matmul(compute_grad_CV, compute_weight_VD));
    out.grad_weight_VD.add_(torch::matmul(compute_grad_CV.t(), h_CD));
  }
  return out;
}

void check_shapes(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD, const torch::Tensor& targets_N,
                  int64_t chunk_rows) {
  MT_CHECK(hidden_ND.dim() == 2 && weight_VD.dim() == 2 && hidden_ND.size(1) == weight_VD.size(1) &&
               targets_N.dim() == 1 && targets_N.size(0) == hidden_ND.size(0) &&
               targets_N.scalar_type() == torch::kLong && chunk_rows >= 1,
           "fused_cross_entropy_sum: expected hidden [N, D], weight [V, D], int64 targets [N], got {}, {}, {}",
           c10::str(hidden_ND.sizes()), c10::str(weight_VD.sizes()), c10::str(targets_N.sizes()));
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                               const torch::Tensor& targets_N, int64_t chunk_rows) {
    CrossEntropyWithGradients result = chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, /*with_gradients=*/true);
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight_VD.scalar_type());
    ctx->save_for_backward({result.grad_hidden_ND, result.grad_weight_VD});
    return result.loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& grad_loss = grad_outputs[0];  // a scalar
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    return {saved[0] * grad_loss.to(saved[0].scalar_type()), (saved[1] * grad_loss).to(weight_dtype),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int64_t cross_entropy_chunk_rows(int64_t vocab_size) {
  return std::max<int64_t>(1, (int64_t{8} << 20) / std::max<int64_t>(1, vocab_size));
}

torch::Tensor fused_cross_entropy_sum(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                      const torch::Tensor& targets_N, int64_t chunk_rows) {
  check_shapes(hidden_ND, weight_VD, targets_N, chunk_rows);
  const bool differentiable =
      torch::GradMode::is_enabled() && (hidden_ND.requires_grad() || weight_VD.requires_grad());
  if (!differentiable) return chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, false).loss;
  return FusedCrossEntropy::apply(hidden_ND, weight_VD, targets_N, chunk_rows);
}

CrossEntropyWithGradients cross_entropy_with_gradients(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                                       const torch::Tensor& targets_N, int64_t chunk_rows) {
  check_shapes(hidden_ND, weight_VD, targets_N, chunk_rows);
  return chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, /*with_gradients=*/true);
}

}  // namespace meshtrain::model
