// fused_cross_entropy.hpp — the training loss of the output head, sum over tokens of -log softmax(h W^T)[target],
// computed in chunks of rows so that the [N, V] logits never exist whole; the gradients for h and W are made in the
// same pass and kept, so backward only scales them (why: docs/parallelism.md, "The loss without the logits").
// Numerics follow the unfused path: logits in the compute dtype of h, converted to fp32 for the softmax; gradients
// back in the compute dtype for the matmuls, W's summed over chunks in fp32.
//
// Legend: N tokens (rows), D hidden size, V vocabulary.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>
#include <vector>

namespace meshtrain::model {

// Rows per chunk for a vocabulary of `vocab_size`: about 8M logits (32 MB in fp32) at a time.
int64_t cross_entropy_chunk_rows(int64_t vocab_size);

// Sum over the N rows of the cross entropy of targets_N (int64 in [0, V)) under the logits hidden_ND x weight_VD^T,
// as an fp32 scalar. Differentiable in hidden_ND and weight_VD; with grad mode off (or neither requiring grad) it
// computes the loss only. weight_VD may be fp32 or the compute dtype; it is converted to hidden_ND's dtype.
torch::Tensor fused_cross_entropy_sum(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                      const torch::Tensor& targets_N, int64_t chunk_rows);

// The same pass outside autograd, for a caller that handles the weight's gradient itself (FSDP reduce-scatters it
// as soon as it exists): the loss sum and both gradients for an incoming gradient of 1.
struct CrossEntropyWithGradients {
  torch::Tensor loss;            // fp32 scalar
  torch::Tensor grad_hidden_ND;  // hidden_ND's dtype
  torch::Tensor grad_weight_VD;  // fp32
};
CrossEntropyWithGradients cross_entropy_with_gradients(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                                       const torch::Tensor& targets_N, int64_t chunk_rows);

// The same pass for a caller that wants the weight's gradient a range at a time (FSDP: straight into the pieces of
// its reduce-scatter), so that the V x D fp32 gradient never exists whole: the logits' gradient is kept instead,
// [N, V] in hidden_ND's dtype, no larger than the V x D fp32 gradient when N * element size <= 4 * D
// (logit_gradients_fit_in_weight_gradient() says when). The weight is not needed after the pass.
class CrossEntropyWithLogitGradients {
 public:
  CrossEntropyWithLogitGradients(const torch::Tensor& hidden_ND, const torch::Tensor& weight_VD,
                                 const torch::Tensor& targets_N, int64_t chunk_rows);

  // The weight a block of rows at a time instead (FSDP: a piece of every shard, all-gathered as the pass goes, so
  // that the V x D weight is never whole either). next_block() gives the blocks until every one of the V rows has
  // come once, then a block with no weight. The softmax is computed online (a running maximum and sum per token,
  // rescaled as blocks arrive, as flash attention does) with the hidden states' gradient, softmax x W - W[target],
  // accumulated the same way in fp32; the logits wait in the [N, V] buffer and become their gradient in place.
  struct WeightBlock {
    torch::Tensor weight_RD;  // fp32 or the compute dtype; undefined: no more blocks
    std::vector<std::pair<int64_t, int64_t>> row_ranges;  // (first vocabulary row, rows), in weight_RD's row order
  };
  CrossEntropyWithLogitGradients(const torch::Tensor& hidden_ND, int64_t vocab_size, const torch::Tensor& targets_N,
                                 int64_t chunk_rows, const std::function<WeightBlock()>& next_block);
  const torch::Tensor& loss() const { return loss_; }                      // fp32 scalar
  const torch::Tensor& grad_hidden_ND() const { return grad_hidden_ND_; }  // hidden_ND's dtype
  // Elements [from, to) of the weight's fp32 gradient flattened (row-major V x D): only the rows they touch are
  // computed.
  torch::Tensor weight_gradient_elements(int64_t from, int64_t to) const;

 private:
  torch::Tensor hidden_ND_, grad_logits_NV_, loss_, grad_hidden_ND_;
};
// Whether the logits' gradient of N rows (hidden dtype `dtype`) takes no more memory than the weight's V x D fp32
// gradient.
bool logit_gradients_fit_in_weight_gradient(int64_t rows, int64_t hidden_size, at::ScalarType dtype);

}  // namespace meshtrain::model
