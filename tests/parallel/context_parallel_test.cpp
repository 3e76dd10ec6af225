// context_parallel_test.cpp — the context group's exchanges: the chunk order of gathered pieces (row order and back),
// and the keys and values of the whole rows with their gradients, counted as kv_exchange.
#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/parallel/context_parallel.hpp"

#include "simulated_devices.hpp"

#include <gtest/gtest.h>

#include <mutex>

namespace meshtrain::parallel {
namespace {

using testing::axis_sizes;
using testing::expect_no_failures;
using testing::run_on_all_devices;

// Rank r's row positions of a row of S tokens over C ranks, [T].
at::Tensor positions_of(int64_t S, int C, int r) {
  std::vector<at::Tensor> ranges;
  for (const mesh::TokenRange& chunk : mesh::MeshRoles::context_chunks(S, C, r))
    ranges.push_back(at::arange(chunk.begin, chunk.end, at::kLong));
  return at::cat(ranges);
}

TEST(ContextParallelTest, GatheredPiecesGoInRowOrderAndBack) {
  for (int C : {1, 2, 3, 4}) {
    const int64_t S = 8 * C, B = 2;
    std::vector<at::Tensor> pieces;  // [B, T] per rank: the row positions it holds (+ 100 in row 1)
    for (int r = 0; r < C; ++r) pieces.push_back(at::stack({positions_of(S, C, r), positions_of(S, C, r) + 100}));
    const at::Tensor pieces_CBT = at::stack(pieces);
    const at::Tensor rows_BS = to_row_order(pieces_CBT, 1);
    EXPECT_TRUE(at::equal(rows_BS, at::stack({at::arange(S, at::kLong), at::arange(S, at::kLong) + 100}))) << C;
    EXPECT_TRUE(at::equal(from_row_order(rows_BS, 1, C), pieces_CBT)) << C;
  }
  // Rank 1 of 3 holds chunks 1 and 4 of 6.
  EXPECT_TRUE(at::equal(positions_of(12, 3, 1), at::tensor({2, 3, 8, 9}, at::kLong)));
}

TEST(ContextParallelTest, KeysAndValuesOfTheWholeRowsWithTheirGradients) {
  const int C = 4;
  const int64_t B = 2, K = 3, S = 16, E = 5, T = S / C;
  const at::Tensor k_BKSE = at::randn({B, K, S, E}, at::detail::createCPUGenerator(1));
  const at::Tensor v_BKSE = at::randn({B, K, S, E}, at::detail::createCPUGenerator(2));
  const at::Tensor weight_k = at::randn({B, K, S, E}, at::detail::createCPUGenerator(3));
  const at::Tensor weight_v = at::randn({B, K, S, E}, at::detail::createCPUGenerator(4));
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 1, 2), axis_sizes(1, 1, 1, 1, 2), 2, 2);
  std::mutex mutex;
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    ContextParallel context(ctx.over(mesh::Axis::context));
    const at::Tensor positions_T = context.positions(T);
    EXPECT_EQ(context.row_length(T), S);
    const at::Tensor my_k = k_BKSE.index_select(2, positions_T).requires_grad_(true);
    const at::Tensor my_v = v_BKSE.index_select(2, positions_T).requires_grad_(true);
    auto [all_k, all_v] = context.gather_keys_values(my_k, my_v);
    // Every device uses the whole rows: the gradient of each device's piece is C times its own share.
    ((all_k * weight_k).sum() + (all_v * weight_v).sum()).backward();
    const at::Tensor rows_BS = context.gather_rows(positions_T.expand({B, T}).contiguous());
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(at::equal(all_k, k_BKSE) && at::equal(all_v, v_BKSE)) << "device " << ctx.device();
    EXPECT_TRUE(at::allclose(my_k.grad(), C * weight_k.index_select(2, positions_T))) << "device " << ctx.device();
    EXPECT_TRUE(at::allclose(my_v.grad(), C * weight_v.index_select(2, positions_T))) << "device " << ctx.device();
    EXPECT_TRUE(at::equal(rows_BS, at::arange(S, at::kLong).expand({B, S})));
    const runtime::CollectiveCounters& counters = ctx.counters();
    EXPECT_EQ(counters.calls(runtime::Collective::kv_exchange), 3) << counters.summary();
    EXPECT_EQ(counters.calls(runtime::Collective::allgather) + counters.calls(runtime::Collective::reduce_scatter), 0);
    // K and V of T tokens in fp32 gathered; their gradients' C x T tokens reduce-scattered; the rows' int64 numbers.
    EXPECT_EQ(counters.bytes(runtime::Collective::kv_exchange), (2 * B * K * T * E + 2 * B * K * S * E) * 4 + B * T * 8);
  }));
}

}  // namespace
}  // namespace meshtrain::parallel
