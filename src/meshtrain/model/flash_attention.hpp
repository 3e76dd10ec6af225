// flash_attention.hpp — masked attention for CPU that never holds a [T, S] score matrix: each task runs a tile of
// queries against the tiles of keys it sees with an online softmax (running maximum and sum, FlashAttention-2), and
// backward recomputes each tile's probabilities from the saved log-sum-exp. It is the model's attention (causal,
// grouped-query, with a KV cache) and the building block of context parallelism: queries and keys carry explicit
// positions, so a device holding arbitrary chunks of a row (an early and a late one) or queries after cached keys
// computes its part, and the log-sum-exp it returns merges partial results over several key chunks exactly.
//
// Rules for callers:
// - A query sees a key iff key position <= query position, and with document ids also iff both ids are equal. A query
//   that sees no key gets a zero output, a log-sum-exp of -inf and zero gradients.
// - Query head h reads key/value head h / G (H = K * G): the K/V tensors are never repeated per query head.
// - q, k, v are all float32 or all bfloat16 (any strides); products and the softmax run in fp32 (for bf16, fp32 GEMMs
//   of the bf16 values, as compute_matmul's fp32_gemm path), the output and the gradients come back in that dtype.
// - Differentiable in q, k, v through the output and the log-sum-exp; positions and documents are not.
// - Work is split over torch's intra-op threads of the calling thread (at::get_num_threads()).
// - The softmax scale is 1 / sqrt(E).
//
// Legend: B batch, H query heads, K key/value heads, G = H / K, T query positions, S key positions, E head_dim.
#pragma once

#include <torch/torch.h>

namespace meshtrain::model {

// Which keys each query sees. Positions are int64, [B, n] or [n] (the same for every row); they need not be sorted,
// but tiles of neighbouring positions are what lets whole tiles be skipped (causal: about half of [T, S]).
// Documents are optional (both or neither), int32 or int64 [B, n].
struct AttentionMask {
  torch::Tensor query_positions;  // [B, T] or [T]
  torch::Tensor key_positions;    // [B, S] or [S]
  torch::Tensor query_documents;  // [B, T] or undefined
  torch::Tensor key_documents;    // [B, S] or undefined

  // Queries at first_query_position .. + T - 1 against keys at 0 .. S - 1: causal self-attention (first = 0, T = S)
  // and decoding after first_query_position cached positions.
  static AttentionMask causal(int64_t first_query_position, int64_t queries, int64_t keys);
};

struct AttentionResult {
  torch::Tensor out_BHTE;  // the dtype of q, laid out as [B, T, H, E] (out_BHTE.transpose(1, 2) is contiguous)
  torch::Tensor lse_BHT;   // fp32 log-sum-exp of each query's scaled scores over the keys it sees (-inf: none)
};

// softmax(q k^T / sqrt(E) masked by `mask`) v for q [B, H, T, E], k and v [B, K, S, E].
AttentionResult flash_attention(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE,
                                const AttentionMask& mask);

// The tiles the kernel works on: kFlashQueryTile queries against kFlashKeyTile keys.
constexpr int64_t kFlashQueryTile = 64;
constexpr int64_t kFlashKeyTile = 64;

// Bytes flash_attention keeps for backward per query position and query head beyond its inputs and output: the fp32
// log-sum-exp.
constexpr int64_t kFlashSavedBytesPerQueryHead = 4;

// The fp32 working copies one backward allocates, in bytes per query position (self-attention: T = S) for H query
// and K key/value heads of `head_dim`: q, the output's gradient and q's gradient (up to 4 partial sums), k and v
// (plain and by tiles transposed) and their gradients. Freed when the backward returns.
int64_t flash_attention_backward_bytes_per_position(int64_t H, int64_t K, int64_t head_dim);

}  // namespace meshtrain::model
