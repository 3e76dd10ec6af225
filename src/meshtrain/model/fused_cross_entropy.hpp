// fused_cross_entropy.hpp — the training loss of the output head, sum over tokens of -log softmax(h W^T)[target],
// computed in chunks of rows so that the [N, V] logits never exist whole.
//
// Legend: N tokens (rows), D hidden size, V vocabulary.
//
// Unfused, a step keeps four [N, V] fp32 tensors alive at once (the logits, their log-softmax, and both gradients:
// 0.5 GB for 8 x 128 tokens of a 32k vocabulary, the largest activation of a small model). Here each chunk's
// logits live only while the chunk is processed, and (as Liger-Kernel's fused linear cross-entropy does) the
// gradients for h and W are computed in the same pass and kept, so the backward only scales them by the incoming
// gradient: no logits recomputation, the same matmul FLOPs as unfused. Numerics follow the unfused path: logits in
// the compute dtype of h, converted to fp32 for the softmax; gradients back in the compute dtype for the matmuls, W's
// summed over chunks in fp32.
#pragma once

#include <torch/torch.h>

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

}  // namespace meshtrain::model
