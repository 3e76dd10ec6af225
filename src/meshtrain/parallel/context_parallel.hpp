// context_parallel.hpp — ContextParallel: context parallelism over the `context` mesh axis. Each device of a context
// group holds two chunks of every row of its batch (mesh::MeshRoles::context_chunks: an early one and a late one, so
// each device has the same share of the causal work), and each layer's attention gathers the keys and values of the
// whole rows from the group: one all-gather of K and V together (backward: one reduce-scatter of their gradients),
// then the flash kernel runs this device's queries against every key, the positions telling it which keys each query
// sees (whole tiles that no query of a tile sees are skipped). Why an all-gather rather than a ring of
// point-to-point exchanges: docs/parallelism.md, "Context parallelism".
//
// The model calls it through model::ContextExchange (llama.hpp); ParallelModel installs it when context > 1. Its
// collectives are counted as Collective::kv_exchange (comm_bytes' `kv_exchange`).
//
// Legend: B rows, T this device's tokens of a row (its two chunks), S the whole row's tokens (T x context), K
// key/value heads, E head_dim, C the context group's size, c = T / 2 (one chunk).
#pragma once

#include "meshtrain/model/llama.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <map>
#include <utility>

namespace meshtrain::parallel {

class ContextParallel : public model::ContextExchange {
 public:
  // `context_comm`: the device's group over `context` (it must outlive this object and every graph it appears in).
  explicit ContextParallel(runtime::Comm& context_comm);

  torch::Tensor positions(int64_t T) override;
  int64_t row_length(int64_t T) const override { return T * comm_.size(); }
  torch::Tensor gather_rows(const torch::Tensor& x_BT) override;
  std::pair<torch::Tensor, torch::Tensor> gather_keys_values(const torch::Tensor& k_BKTE,
                                                             const torch::Tensor& v_BKTE) override;

 private:
  runtime::Comm& comm_;
  std::map<int64_t, torch::Tensor> positions_;  // positions(T) by T
};

// The chunk order of a context group's gathered pieces and back, along dimension `seq_dim` of a tensor whose
// dimension 0 is the C ranks' pieces in rank order (an all-gather's result, [C, ..., T, ...]): to_row_order returns
// [..., S, ...] (dimension 0 gone) with the 2C chunks in row order; from_row_order is its inverse (the layout a
// reduce-scatter of the whole rows' gradients takes). Exposed for the tests.
torch::Tensor to_row_order(const torch::Tensor& pieces, int64_t seq_dim);
torch::Tensor from_row_order(const torch::Tensor& rows, int64_t seq_dim, int64_t C);

}  // namespace meshtrain::parallel
