// fused_cross_entropy.cpp — chunked cross-entropy of the output head with its gradients computed in the forward
// pass (fused_cross_entropy.hpp says why).
#include "meshtrain/model/fused_cross_entropy.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"

#include <limits>

namespace meshtrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the chunk loop does with each chunk's gradient of the logits.
enum class WeightGradient { none, accumulate, keep_logit_gradients };

struct ChunkedPass {
  torch::Tensor loss, grad_hidden_ND, grad_weight_VD, grad_logits_NV;
};

// logits_CV.logsumexp(1, keepdim=true) as ATen computes it (each row's maximum, an infinite one taken as 0, then
// log(sum(exp(logit - max))) + max), with exp(logit - max) made for kRows rows at a time instead of the whole chunk:
// each row's sum is the same reduction of the same values (the same bits), and no second [C, V] buffer (33.5 MB at a
// 32k vocabulary) sits beside the logits at the head's peak.
torch::Tensor row_logsumexp(const torch::Tensor& logits_CV) {
  constexpr int64_t kRows = 16;
  torch::Tensor max_C1 = logits_CV.amax(1, /*keepdim=*/true);
  max_C1.masked_fill_(max_C1.abs() == std::numeric_limits<float>::infinity(), 0);
  torch::Tensor sum_C1 = torch::empty_like(max_C1);
  const int64_t C = logits_CV.size(0);
  for (int64_t begin = 0; begin < C; begin += kRows) {
    const int64_t rows = std::min(kRows, C - begin);
    torch::Tensor sum_R1 = sum_C1.narrow(0, begin, rows);
    torch::sum_out(sum_R1, (logits_CV.narrow(0, begin, rows) - max_C1.narrow(0, begin, rows)).exp_(), {1},
                   /*keepdim=*/true);
  }
  return sum_C1.log_().add_(max_C1);
}

ChunkedPass chunked_loss(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                         const torch::Tensor& targets_N, int64_t chunk_rows, WeightGradient weight_gradient) {
  torch::NoGradGuard no_grad;
  const int64_t N = hidden_ND.size(0), V = weight_VD.size(0);
  const torch::Dtype dtype = hidden_ND.scalar_type();
  // The GEMMs' operands as they read them (compute_matmul.hpp: fp32 holding bf16 values on the fp32_gemm path), the
  // weight converted once for every chunk.
  const torch::Tensor compute_weight_VD = gemm_operand(weight_VD, dtype);
  ChunkedPass out;
  out.loss = torch::zeros({}, torch::kFloat32);
  if (weight_gradient != WeightGradient::none) out.grad_hidden_ND = torch::empty_like(hidden_ND);
  if (weight_gradient == WeightGradient::accumulate)
    out.grad_weight_VD = torch::zeros(weight_VD.sizes(), weight_VD.options().dtype(torch::kFloat32));
  if (weight_gradient == WeightGradient::keep_logit_gradients)
    out.grad_logits_NV = torch::empty({N, V}, hidden_ND.options());
  for (int64_t begin = 0; begin < N; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, N - begin);
    const torch::Tensor h_CD = gemm_operand(hidden_ND.narrow(0, begin, rows), dtype);
    const torch::Tensor t_C1 = targets_N.narrow(0, begin, rows).unsqueeze(1);
    torch::Tensor logits_CV = torch::matmul(h_CD, compute_weight_VD.t()).to(dtype).to(torch::kFloat32);
    const torch::Tensor logsumexp_C1 = row_logsumexp(logits_CV);
    out.loss.add_((logsumexp_C1 - logits_CV.gather(1, t_C1)).sum());
    if (weight_gradient == WeightGradient::none) continue;
    // d loss / d logits = softmax - one_hot(target), computed in the logits' buffer.
    torch::Tensor& grad_logits_CV = logits_CV.sub_(logsumexp_C1).exp_();
    grad_logits_CV.scatter_add_(1, t_C1, torch::full({rows, 1}, -1.0f));
    torch::Tensor compute_grad_CV = gemm_operand(grad_logits_CV, dtype);
    out.grad_hidden_ND.narrow(0, begin, rows).copy_(torch::matmul(compute_grad_CV, compute_weight_VD));
    if (weight_gradient == WeightGradient::keep_logit_gradients) {
      out.grad_logits_NV.narrow(0, begin, rows).copy_(compute_grad_CV);
    } else if (compute_grad_CV.scalar_type() == torch::kFloat32) {
      // In place: no V x D product beside the sum (on the fp32_gemm path, the bf16 GEMM's fp32 accumulation goes on
      // over the chunks, where a bf16 GEMM rounds each chunk's product).
      out.grad_weight_VD.addmm_(compute_grad_CV.t(), h_CD);
    } else {
      out.grad_weight_VD.add_(torch::matmul(compute_grad_CV.t(), h_CD));
    }
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
    ChunkedPass result = chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, WeightGradient::accumulate);
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
  if (!differentiable) return chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, WeightGradient::none).loss;
  return FusedCrossEntropy::apply(hidden_ND, weight_VD, targets_N, chunk_rows);
}

CrossEntropyWithGradients cross_entropy_with_gradients(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                                       const torch::Tensor& targets_N, int64_t chunk_rows) {
  check_shapes(hidden_ND, weight_VD, targets_N, chunk_rows);
  ChunkedPass pass = chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, WeightGradient::accumulate);
  return {pass.loss, pass.grad_hidden_ND, pass.grad_weight_VD};
}

CrossEntropyWithLogitGradients::CrossEntropyWithLogitGradients(const torch::Tensor& hidden_ND,
                                                               const torch::Tensor& weight_VD,
                                                               const torch::Tensor& targets_N, int64_t chunk_rows) {
  check_shapes(hidden_ND, weight_VD, targets_N, chunk_rows);
  ChunkedPass pass = chunked_loss(hidden_ND, weight_VD, targets_N, chunk_rows, WeightGradient::keep_logit_gradients);
  hidden_ND_ = hidden_ND.detach();
  grad_logits_NV_ = std::move(pass.grad_logits_NV);
  loss_ = std::move(pass.loss);
  grad_hidden_ND_ = std::move(pass.grad_hidden_ND);
}

CrossEntropyWithLogitGradients::CrossEntropyWithLogitGradients(const torch::Tensor& hidden_ND, int64_t vocab_size,
                                                               const torch::Tensor& targets_N, int64_t chunk_rows,
                                                               const std::function<WeightBlock()>& next_block) {
  MT_CHECK(hidden_ND.dim() == 2 && targets_N.dim() == 1 && targets_N.size(0) == hidden_ND.size(0) &&
               targets_N.scalar_type() == torch::kLong && chunk_rows >= 1 && vocab_size >= 1,
           "CrossEntropyWithLogitGradients: expected hidden [N, D], int64 targets [N], got {}, {}",
           c10::str(hidden_ND.sizes()), c10::str(targets_N.sizes()));
  torch::NoGradGuard no_grad;
  const int64_t N = hidden_ND.size(0), D = hidden_ND.size(1);
  const at::ScalarType dtype = hidden_ND.scalar_type();
  const torch::TensorOptions fp32 = hidden_ND.options().dtype(torch::kFloat32);
  hidden_ND_ = hidden_ND.detach();
  grad_logits_NV_ = torch::empty({N, vocab_size}, hidden_ND.options());  // the logits until every block is in
  torch::Tensor max_N1 = torch::full({N, 1}, -std::numeric_limits<float>::infinity(), fp32);
  torch::Tensor sum_N1 = torch::zeros({N, 1}, fp32), weighted_ND = torch::zeros({N, D}, fp32);
  torch::Tensor target_logit_N1 = torch::zeros({N, 1}, fp32), target_weight_ND = torch::zeros({N, D}, fp32);
  const torch::Tensor t_N1 = targets_N.unsqueeze(1);
  const torch::Tensor gemm_hidden_ND = gemm_operand(hidden_ND_, dtype);  // as the GEMMs read it (compute_matmul.hpp)
  int64_t rows_given = 0;
  for (WeightBlock block = next_block(); block.weight_RD.defined(); block = next_block()) {
    const torch::Tensor w_RD = gemm_operand(block.weight_RD, dtype);
    const torch::Tensor logits_NR = torch::matmul(gemm_hidden_ND, w_RD.t()).to(dtype);
    // Where the block's rows go, and for each token whose target is among them, that row in the block (else -1).
    torch::Tensor target_row_N1 = torch::full({N, 1}, -1, targets_N.options());
    int64_t offset = 0;
    for (const auto& [first, rows] : block.row_ranges) {
      MT_CHECK(first >= 0 && rows >= 0 && first + rows <= vocab_size, "a weight block's rows [{}, {}) of {}", first,
               first + rows, vocab_size);
      grad_logits_NV_.narrow(1, first, rows).copy_(logits_NR.narrow(1, offset, rows));
      target_row_N1 = torch::where((t_N1 >= first) & (t_N1 < first + rows), t_N1 - first + offset, target_row_N1);
      offset += rows;
    }
    MT_CHECK(offset == w_RD.size(0) && w_RD.dim() == 2 && w_RD.size(1) == D,
             "a weight block of {} rows describes {} rows", c10::str(w_RD.sizes()), offset);
    rows_given += offset;
    const torch::Tensor logits32_NR = logits_NR.to(torch::kFloat32);
    const torch::Tensor new_max_N1 = torch::maximum(max_N1, logits32_NR.amax(1, /*keepdim=*/true));
    const torch::Tensor rescale_N1 = (max_N1 - new_max_N1).exp_();
    const torch::Tensor scaled_NR = (logits32_NR - new_max_N1).exp_();
    sum_N1.mul_(rescale_N1).add_(scaled_NR.sum(1, /*keepdim=*/true));
    const torch::Tensor weighted_block_ND = torch::matmul(gemm_operand(scaled_NR, dtype), w_RD).to(dtype);
    weighted_ND.mul_(rescale_N1).add_(weighted_block_ND.to(torch::kFloat32));
    max_N1 = new_max_N1;
    const torch::Tensor found_N1 = (target_row_N1 >= 0).to(torch::kFloat32), index_N1 = target_row_N1.clamp_min(0);
    target_logit_N1.add_(logits32_NR.gather(1, index_N1) * found_N1);
    target_weight_ND.add_(w_RD.index_select(0, index_N1.squeeze(1)).to(torch::kFloat32) * found_N1);
  }
  MT_CHECK(rows_given == vocab_size, "the weight blocks gave {} rows of a vocabulary of {}", rows_given, vocab_size);
  const torch::Tensor logsumexp_N1 = max_N1 + sum_N1.log();
  loss_ = (logsumexp_N1 - target_logit_N1).sum();
  grad_hidden_ND_ = (weighted_ND.div_(sum_N1) - target_weight_ND).to(dtype);
  // The logits become d loss / d logits = softmax - one_hot(target), a chunk of rows at a time.
  for (int64_t begin = 0; begin < N; begin += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, N - begin);
    torch::Tensor logits_CV = grad_logits_NV_.narrow(0, begin, rows);
    torch::Tensor grad_CV = logits_CV.to(torch::kFloat32).sub_(logsumexp_N1.narrow(0, begin, rows)).exp_();
    grad_CV.scatter_add_(1, t_N1.narrow(0, begin, rows), torch::full({rows, 1}, -1.0f));
    logits_CV.copy_(grad_CV);
  }
}

torch::Tensor CrossEntropyWithLogitGradients::weight_gradient_elements(int64_t from, int64_t to) const {
  const int64_t V = grad_logits_NV_.size(1), D = hidden_ND_.size(1);
  MT_CHECK(0 <= from && from <= to && to <= V * D, "weight_gradient_elements: [{}, {}) of a {} x {} gradient", from,
           to, V, D);
  torch::NoGradGuard no_grad;
  const int64_t first_row = from / D, end_row = (to + D - 1) / D;
  const torch::Dtype dtype = hidden_ND_.scalar_type();
  const torch::Tensor rows_RD =
      torch::matmul(gemm_operand(grad_logits_NV_.narrow(1, first_row, end_row - first_row).t(), dtype),
                    gemm_operand(hidden_ND_, dtype))
          .to(dtype)
          .to(torch::kFloat32);
  return rows_RD.view({-1}).narrow(0, from - first_row * D, to - from);
}

bool logit_gradients_fit_in_weight_gradient(int64_t rows, int64_t hidden_size, at::ScalarType dtype) {
  return rows * static_cast<int64_t>(c10::elementSize(dtype)) <= 4 * hidden_size;
}

}  // namespace meshtrain::model
