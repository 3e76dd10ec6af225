// context_parallel.cpp — the context group's exchanges: whole rows of keys/values (differentiable) and of document
// numbers, gathered in rank order and put in row order.
#include "meshtrain/parallel/context_parallel.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: every rank's K and V [B, K, T, E] as the whole rows' [B, K, S, E] in row order (one all-gather of both).
// Backward: the whole rows' gradients back to their ranks, summed over the ranks that gathered them (one
// reduce-scatter, in fp32 so that a bf16 model's sums do not round at every addend).
struct GatherKeysValues : torch::autograd::Function<GatherKeysValues> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& k_BKTE, const at::Tensor& v_BKTE,
                               runtime::Comm* comm) {
    ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(comm));
    const int64_t C = comm->size();
    const at::Tensor kv_2BKTE = at::stack({k_BKTE, v_BKTE});
    std::vector<int64_t> pieces_shape = kv_2BKTE.sizes().vec();
    pieces_shape.insert(pieces_shape.begin(), C);
    const at::Tensor pieces_C2BKTE =
        comm->allgather(kv_2BKTE, {}, runtime::Collective::kv_exchange).view(pieces_shape);
    const at::Tensor kv_2BKSE = to_row_order(pieces_C2BKTE, 3);
    return {kv_2BKSE[0], kv_2BKSE[1]};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* comm = reinterpret_cast<runtime::Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
    const at::Tensor& defined = grads[0].defined() ? grads[0] : grads[1];
    auto fp32 = [&](const at::Tensor& g) { return g.defined() ? g.to(at::kFloat) : at::zeros_like(defined, at::kFloat); };
    const at::Tensor grad_2BKSE = at::stack({fp32(grads[0]), fp32(grads[1])});
    const at::Tensor pieces_C2BKTE = from_row_order(grad_2BKSE, 3, comm->size());
    std::vector<int64_t> flat_shape = pieces_C2BKTE.sizes().vec();
    flat_shape[1] *= flat_shape[0];
    flat_shape.erase(flat_shape.begin());
    const at::Tensor mine_2BKTE =
        comm->reduce_scatter_sum(pieces_C2BKTE.view(flat_shape), runtime::Collective::kv_exchange)
            .to(defined.scalar_type());
    return {mine_2BKTE[0], mine_2BKTE[1], at::Tensor()};
  }
};

}  // namespace

ContextParallel::ContextParallel(runtime::Comm& context_comm) : comm_(context_comm) {}

torch::Tensor ContextParallel::positions(int64_t T) {
  auto found = positions_.find(T);
  if (found != positions_.end()) return found->second;
  MT_CHECK(T % 2 == 0, "context parallelism: {} tokens per device is not two equal chunks", T);
  std::vector<torch::Tensor> ranges;
  for (const mesh::TokenRange& chunk : mesh::MeshRoles::context_chunks(row_length(T), comm_.size(), comm_.rank()))
    ranges.push_back(torch::arange(chunk.begin, chunk.end, torch::kInt64));
  return positions_[T] = torch::cat(ranges);
}

torch::Tensor ContextParallel::gather_rows(const torch::Tensor& x_BT) {
  const at::Tensor pieces_CBT =
      comm_.allgather(x_BT.contiguous(), {}, runtime::Collective::kv_exchange).view({comm_.size(), x_BT.size(0), -1});
  return to_row_order(pieces_CBT, 1);
}

std::pair<torch::Tensor, torch::Tensor> ContextParallel::gather_keys_values(const torch::Tensor& k_BKTE,
                                                                           const torch::Tensor& v_BKTE) {
  const variable_list kv = GatherKeysValues::apply(k_BKTE, v_BKTE, &comm_);
  return {kv[0], kv[1]};
}

torch::Tensor to_row_order(const torch::Tensor& pieces, int64_t seq_dim) {
  const int64_t C = pieces.size(0), T = pieces.size(seq_dim + 1);
  MT_CHECK(T % 2 == 0, "context parallelism: {} tokens per device is not two equal chunks", T);
  std::vector<int64_t> split_shape = pieces.sizes().vec();  // [C, ..., 2, c, ...]
  split_shape[seq_dim + 1] = 2;
  split_shape.insert(split_shape.begin() + seq_dim + 2, T / 2);
  const at::Tensor split = pieces.reshape(split_shape);
  // Chunk n of the row: rank n's early chunk for n < C, rank 2C - 1 - n's late chunk after.
  const at::Tensor chunks = at::cat({split.select(seq_dim + 1, 0), split.select(seq_dim + 1, 1).flip({0})});
  std::vector<int64_t> rows_shape = pieces.sizes().vec();
  rows_shape.erase(rows_shape.begin());
  rows_shape[seq_dim] = C * T;
  return chunks.movedim(0, seq_dim).reshape(rows_shape);
}

torch::Tensor from_row_order(const torch::Tensor& rows, int64_t seq_dim, int64_t C) {
  const int64_t S = rows.size(seq_dim);
  MT_CHECK(S % (2 * C) == 0, "context parallelism: a row of {} is not 2 x {} equal chunks", S, C);
  std::vector<int64_t> chunked_shape = rows.sizes().vec();  // [..., 2C, c, ...]
  chunked_shape[seq_dim] = 2 * C;
  chunked_shape.insert(chunked_shape.begin() + seq_dim + 1, S / (2 * C));
  const at::Tensor chunks = rows.reshape(chunked_shape).movedim(seq_dim, 0);  // [2C, ..., c, ...]
  const at::Tensor split = at::stack({chunks.narrow(0, 0, C), chunks.narrow(0, C, C).flip({0})}, seq_dim + 1);
  std::vector<int64_t> pieces_shape = rows.sizes().vec();
  pieces_shape.insert(pieces_shape.begin(), C);
  pieces_shape[seq_dim + 1] = S / C;
  return split.reshape(pieces_shape);
}

}  // namespace meshtrain::parallel
