// expert_parallel_test.cpp — the variable-size all-to-all (uneven and empty splits, forward and backward) on
// simulated devices, and the expert naming helpers. Loss parity of expert parallelism is in parallel_model_test.cpp.
#include "meshtrain/parallel/autograd_collectives.hpp"
#include "meshtrain/parallel/expert_parallel.hpp"
#include "meshtrain/parallel/tensor_parallel.hpp"

#include "simulated_devices.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace meshtrain::parallel {
namespace {

using testing::axis_sizes;
using testing::expect_no_failures;
using testing::run_on_all_devices;

TEST(AllToAllRowsTest, UnevenAndEmptySplitsArriveInRankOrderAndGradientsGoBack) {
  // rows[s][r]: rows rank s sends to rank r. Rank 2 sends nothing at all; rank 1 receives nothing from rank 0.
  const std::vector<std::vector<int64_t>> rows = {{2, 0, 3}, {1, 4, 0}, {0, 0, 0}};
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 3), axis_sizes(1, 1, 1, 1), 1, 3);
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    runtime::Comm& comm = ctx.over(mesh::Axis::expert);
    const int me = comm.rank();
    std::vector<int64_t> send(3), receive(3);
    for (int r = 0; r < 3; ++r) {
      send[r] = rows[me][r];
      receive[r] = rows[r][me];
    }
    // Row i of what rank s sends to rank r holds the value 100 s + 10 r + i, in 2 columns.
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < 3; ++r)
      blocks.push_back((at::arange(send[r], at::kFloat) + 100 * me + 10 * r).unsqueeze(1).repeat({1, 2}));
    const at::Tensor x = at::cat(blocks).requires_grad_(true);
    const at::Tensor y = all_to_all_rows(x, send, receive, comm);
    ASSERT_EQ(y.size(0), receive[0] + receive[1] + receive[2]);
    int64_t at_row = 0;
    for (int s = 0; s < 3; ++s)
      for (int64_t i = 0; i < receive[s]; ++i, ++at_row)
        EXPECT_EQ(y[at_row][1].item<float>(), 100 * s + 10 * me + i) << "rank " << me << " row " << at_row;
    // The gradient of sum(y * w) with w = the receiving rank + 1 comes back to each sent row as its receiver + 1.
    (y * static_cast<float>(me + 1)).sum().backward();
    int64_t row = 0;
    for (int r = 0; r < 3; ++r)
      for (int64_t i = 0; i < send[r]; ++i, ++row)
        EXPECT_EQ(x.grad()[row][0].item<float>(), static_cast<float>(r + 1)) << "rank " << me << " row " << row;
    ctx.world().barrier();
  }));
}

TEST(ExpertNamesTest, ExpertIndexOfAParameterAndItsPeers) {
  EXPECT_EQ(expert_of_parameter("model.layers.3.block_sparse_moe.experts.5.w1.weight"), 5);
  EXPECT_EQ(expert_of_parameter("model.layers.3.block_sparse_moe.gate.weight"), -1);
  EXPECT_EQ(expert_of_parameter("model.layers.3.mlp.up_proj.weight"), -1);
  EXPECT_EQ(with_expert_index("model.layers.12.block_sparse_moe.experts.5.w2.weight", 13),
            "model.layers.12.block_sparse_moe.experts.13.w2.weight");
  EXPECT_EQ(expert_holder(5, 8, 4), 2);
  EXPECT_EQ(expert_holder(7, 8, 1), 0);
  EXPECT_EQ(tensor_split_of("model.layers.0.block_sparse_moe.experts.5.w1.weight"), TensorSplit::rows);
  EXPECT_EQ(tensor_split_of("model.layers.0.block_sparse_moe.experts.5.w3.weight"), TensorSplit::rows);
  EXPECT_EQ(tensor_split_of("model.layers.0.block_sparse_moe.experts.5.w2.weight"), TensorSplit::columns);
  EXPECT_EQ(tensor_split_of("model.layers.0.block_sparse_moe.gate.weight"), TensorSplit::none);
}

}  // namespace
}  // namespace meshtrain::parallel
