// expert_parallel_test.cpp — the experts' exchange (uneven, one-way and empty splits, forward and backward) on
// simulated devices against one device, and the expert naming helpers. Loss parity of expert parallelism is in parallel_model_test.cpp.
#include "meshtrain/model/moe.hpp"
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

// A Mixtral block whose router sends token n to the two experts with the largest of its first E coordinates: x's
// rows pick their experts. Parameters drawn from N(0, 0.3) with one stream per name, the same on every device.
std::shared_ptr<model::MixtralSparseMoe> steerable_block(const std::shared_ptr<model::RouterStats>& stats) {
  config::LlamaConfig config;
  config.hidden_size = 16;
  config.intermediate_size = 24;
  config.num_local_experts = 6;
  config.num_experts_per_tok = 2;
  auto block = std::make_shared<model::MixtralSparseMoe>(config, stats);
  torch::NoGradGuard no_grad;
  uint64_t seed = 3;
  for (auto& p : block->named_parameters())
    p.value().copy_(torch::randn(p.value().sizes(), at::detail::createCPUGenerator(seed++)) * 0.3);
  block->gate->weight.zero_();
  for (int64_t e = 0; e < 6; ++e) block->gate->weight[e][e] = 1.0;
  return block;
}

// Tokens routed to the given expert pairs: coordinates e1 and e2 large (3 and 2), the rest small noise.
at::Tensor tokens_for(const std::vector<std::pair<int, int>>& pairs, uint64_t seed) {
  at::Tensor x_ND = torch::rand({static_cast<int64_t>(pairs.size()), 16}, at::detail::createCPUGenerator(seed)) * 0.1;
  for (size_t n = 0; n < pairs.size(); ++n) {
    x_ND[n][pairs[n].first] = 3.0;
    x_ND[n][pairs[n].second] = 2.0;
  }
  return x_ND;
}

TEST(ExpertExchangeTest, UnevenAndOneWaySplitsMatchOneDeviceForwardAndBackward) {
  // 6 experts over 3 devices (experts 2r, 2r+1 on rank r). Rank 0 sends nothing to rank 1; rank 2 routes only to its
  // own experts; rank 1 routes to all three and is the only sender to its own experts; own rows odd and even.
  const std::vector<std::vector<std::pair<int, int>>> routes = {
      {{0, 1}, {0, 4}, {1, 5}},
      {{2, 3}, {0, 5}, {1, 2}, {3, 4}},
      {{4, 5}, {5, 4}}};
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 3), axis_sizes(1, 1, 1, 1), 1, 3);
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    runtime::Comm& comm = ctx.over(mesh::Axis::expert);
    const int me = comm.rank();
    auto stats = std::make_shared<model::RouterStats>(6, 2, 0.1);
    auto reference_stats = std::make_shared<model::RouterStats>(6, 2, 0.1);
    auto block = steerable_block(stats), reference = steerable_block(reference_stats);
    distribute_experts(*block, comm);
    ASSERT_EQ(block->experts().size(), 2u);

    const at::Tensor x_ND = tokens_for(routes[me], 10 + me);
    const at::Tensor weight_ND = torch::randn({x_ND.size(0), 16}, at::detail::createCPUGenerator(20 + me));
    const at::Tensor x = x_ND.clone().requires_grad_(true), x_reference = x_ND.clone().requires_grad_(true);
    const at::Tensor y = block->forward(x.unsqueeze(0)).squeeze(0);
    const at::Tensor y_reference = reference->forward(x_reference.unsqueeze(0)).squeeze(0);
    EXPECT_TRUE(torch::allclose(y, y_reference, 1e-5, 1e-6)) << "rank " << me;
    stats->close([](at::Tensor&) {});
    reference_stats->close([](at::Tensor&) {});
    (y * weight_ND).sum().backward();
    (y_reference * weight_ND).sum().backward();
    EXPECT_TRUE(torch::allclose(x.grad(), x_reference.grad(), 1e-5, 1e-6)) << "rank " << me;
    // A kept expert's gradient sums every device's rows: the reference's gradients summed over the devices (every
    // device sums every expert's, in the same order, and compares those it keeps).
    for (int64_t e = 0; e < 6; ++e) {
      const auto& reference_expert = reference->experts()[e];
      const std::vector<at::Tensor> expected_grads = {reference_expert->w1->weight.grad().clone(),
                                                      reference_expert->w2->weight.grad().clone(),
                                                      reference_expert->w3->weight.grad().clone()};
      for (at::Tensor expected : expected_grads) comm.allreduce_sum(expected);
      if (e / 2 != me) continue;
      const auto& expert = block->experts()[e % 2];
      const std::vector<at::Tensor> grads = {expert->w1->weight.grad(), expert->w2->weight.grad(),
                                             expert->w3->weight.grad()};
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(torch::allclose(grads[i], expected_grads[i], 1e-5, 1e-6))
            << "rank " << me << " expert " << e << " projection " << i;
    }
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
