// moe_test.cpp — the Mixtral block on one device: routing (top-k of the softmax, renormalized) against a per-token
// loop, capacity dropping, experts without tokens, the load-balancing loss and its gradient, and the configs.
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/settings/settings.hpp"

#include "bf16_path.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace meshtrain::model {
namespace {

LlamaConfig moe_config(int64_t experts = 4, int64_t top_k = 2) {
  LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.num_local_experts = experts;
  c.num_experts_per_tok = top_k;
  c.router_aux_loss_coef = 0.1;
  return c;
}

// A block with every parameter drawn from N(0, 0.3) (a distinct stream per name).
std::shared_ptr<MixtralSparseMoe> random_block(const LlamaConfig& config, const std::shared_ptr<RouterStats>& stats) {
  auto block = std::make_shared<MixtralSparseMoe>(config, stats);
  torch::NoGradGuard no_grad;
  uint64_t seed = 11;
  for (auto& p : block->named_parameters())
    p.value().copy_(torch::randn(p.value().sizes(), at::detail::createCPUGenerator(seed++)) * 0.3);
  return block;
}

// The block's output for each token computed alone: top-k of the softmax of its router logits, renormalized, the
// weighted sum of those experts; a slot is kept when `kept(token, expert)` says so.
torch::Tensor per_token_reference(MixtralSparseMoe& block, const torch::Tensor& x_ND, int64_t top_k,
                                  const std::function<bool(int64_t, int64_t)>& kept) {
  torch::NoGradGuard no_grad;
  torch::Tensor out = torch::zeros_like(x_ND);
  for (int64_t n = 0; n < x_ND.size(0); ++n) {
    const torch::Tensor x_D = x_ND[n];
    const torch::Tensor probs_E = torch::softmax(torch::mv(block.gate->weight, x_D), 0);
    auto [top, experts] = probs_E.topk(top_k);
    const torch::Tensor weights = top / top.sum();
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = experts[j].item<int64_t>();
      if (!kept(n, e)) continue;
      out[n] += weights[j] * block.experts()[e]->forward(x_D.unsqueeze(0))[0];
    }
  }
  return out;
}

TEST(MixtralBlockTest, RoutesEachTokenToItsTopKExpertsWithRenormalizedWeights) {
  for (int64_t top_k : {1, 2, 3}) {
    const LlamaConfig config = moe_config(4, top_k);
    auto stats = std::make_shared<RouterStats>(4, top_k, 0.1);
    auto block = random_block(config, stats);
    const torch::Tensor x_BTD = torch::randn({3, 5, 16}, at::detail::createCPUGenerator(5));
    const torch::Tensor y_BTD = block->forward(x_BTD);
    const torch::Tensor expected =
        per_token_reference(*block, x_BTD.reshape({-1, 16}), top_k, [](int64_t, int64_t) { return true; });
    EXPECT_TRUE(torch::allclose(y_BTD.reshape({-1, 16}), expected, 1e-5, 1e-6)) << "top_k " << top_k;
    stats->close([](at::Tensor&) {});
    EXPECT_DOUBLE_EQ(stats->routed_slots().sum().item<double>(), 15.0 * top_k);
    EXPECT_DOUBLE_EQ(stats->dropped_fraction(), 0.0);
  }
}

TEST(MixtralBlockTest, CapacityDropsTheLaterSlotsOfAnOverloadedExpert) {
  const LlamaConfig config = moe_config(4, 2);
  auto stats = std::make_shared<RouterStats>(4, 2, 0.1);
  auto block = random_block(config, stats);
  const torch::Tensor x_ND = torch::randn({20, 16}, at::detail::createCPUGenerator(6));
  // Capacity ceil(0.5 * 20 * 2 / 4) = 5 slots per expert, taken in token order.
  block->set_capacity_factor(0.5);
  const torch::Tensor y_ND = block->forward(x_ND.unsqueeze(0)).squeeze(0);
  std::map<int64_t, int64_t> taken;  // expert -> slots kept so far, in token order
  std::map<std::pair<int64_t, int64_t>, bool> keep;
  int64_t dropped = 0;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor experts_NK =
        std::get<1>(torch::softmax(torch::matmul(x_ND, block->gate->weight.t()), -1).topk(2));
    for (int64_t n = 0; n < 20; ++n)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t e = experts_NK[n][j].item<int64_t>();
        keep[{n, e}] = taken[e] < 5;
        if (taken[e]++ >= 5) ++dropped;
      }
  }
  ASSERT_GT(dropped, 0) << "the test's tokens must overload an expert";
  const torch::Tensor expected =
      per_token_reference(*block, x_ND, 2, [&](int64_t n, int64_t e) { return keep.at({n, e}); });
  EXPECT_TRUE(torch::allclose(y_ND, expected, 1e-5, 1e-6));
  stats->close([](at::Tensor&) {});
  EXPECT_DOUBLE_EQ(stats->dropped_fraction(), static_cast<double>(dropped) / 40.0);
  EXPECT_DOUBLE_EQ(stats->routed_slots().sum().item<double>(), 40.0);  // routed counts are before the drop
}

TEST(MixtralBlockTest, AnExpertWithoutTokensGetsAZeroGradient) {
  const LlamaConfig config = moe_config(4, 2);
  auto stats = std::make_shared<RouterStats>(4, 2, 0.1);
  auto block = random_block(config, stats);
  {
    torch::NoGradGuard no_grad;
    block->gate->weight[3].fill_(-5.0);  // with positive inputs expert 3's logit is far below the others
  }
  const torch::Tensor x_BTD = torch::rand({2, 6, 16}, at::detail::createCPUGenerator(7)) + 0.1;
  const torch::Tensor y_BTD = block->forward(x_BTD);
  stats->close([](at::Tensor&) {});
  y_BTD.sum().backward();
  EXPECT_EQ(stats->routed_slots()[3].item<double>(), 0.0);
  for (auto& p : block->experts()[3]->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().abs().max().item<float>(), 0.0f) << p.key();
  }
  EXPECT_GT(block->experts()[0]->w1->weight.grad().abs().max().item<float>(), 0.0f);
}

// The grouped experts (one autograd node over all local experts, experts_forward/experts_backward) against each
// expert's own modules through autograd (MixtralExpert::forward, Hugging Face's expert): outputs and the gradients of
// the rows and of every weight, an expert without rows included; fp32 exactly as fp32 (up to summation order), bf16
// on both paths within bf16 rounding.
TEST(GroupedExpertsTest, MatchEachExpertThroughAutogradOnEveryComputePath) {
  const LlamaConfig config = moe_config(4, 2);
  auto stats = std::make_shared<RouterStats>(4, 2, 0.1);
  auto block = random_block(config, stats);
  const std::vector<int64_t> rows = {5, 0, 3, 7};  // expert 1 gets no rows
  const torch::Tensor x_RD = torch::randn({15, 16}, at::detail::createCPUGenerator(8));
  const torch::Tensor dy_RD = torch::randn({15, 16}, at::detail::createCPUGenerator(9));
  struct Case {
    torch::Dtype dtype;
    Bf16Matmul path;
    double tolerance;
  };
  for (const Case& c : {Case{torch::kFloat32, Bf16Matmul::native, 1e-5}, Case{torch::kBFloat16, Bf16Matmul::native, 3e-2},
                        Case{torch::kBFloat16, Bf16Matmul::fp32_gemm, 3e-2}}) {
    const testing::Bf16PathScope path(c.path);
    const std::string what = std::string(c10::toString(c.dtype)) + " on " + bf16_matmul_name(c.path);
    auto gradients = [&](bool grouped) {
      for (auto& p : block->parameters()) p.mutable_grad().reset();
      const torch::Tensor x = x_RD.to(c.dtype).clone().requires_grad_(true);
      torch::Tensor y;
      if (grouped) {
        y = block->run_local_experts(x, rows);
      } else {  // each expert's modules, a cast of its weights per projection as DenseLinear does
        std::vector<torch::Tensor> outputs;
        int64_t offset = 0;
        for (size_t j = 0; j < rows.size(); offset += rows[j], ++j)
          outputs.push_back(block->experts()[j]->forward(x.narrow(0, offset, rows[j])));
        y = torch::cat(outputs);
      }
      (y.to(torch::kFloat32) * dy_RD).sum().backward();
      std::vector<torch::Tensor> result{y.to(torch::kFloat32).detach(), x.grad().to(torch::kFloat32)};
      for (const auto& expert : block->experts())
        for (const auto& projection : {expert->w1, expert->w3, expert->w2}) {
          EXPECT_TRUE(projection->weight.grad().defined()) << what;
          result.push_back(projection->weight.grad().clone());
        }
      return result;
    };
    const std::vector<torch::Tensor> grouped = gradients(true), reference = gradients(false);
    ASSERT_EQ(grouped.size(), reference.size());
    for (size_t i = 0; i < grouped.size(); ++i) {
      const double scale = reference[i].abs().max().item<double>();
      EXPECT_LE((grouped[i] - reference[i]).abs().max().item<double>(), c.tolerance * std::max(scale, 1e-3))
          << what << ", output " << i << " (0: y, 1: the rows' gradient, then w1, w3, w2 of each expert)";
    }
    for (size_t i = 2 + 3; i < 2 + 6; ++i) EXPECT_EQ(grouped[i].abs().max().item<float>(), 0.0f) << what;
  }
}

TEST(RouterStatsTest, AuxLossAndItsGradientFollowTheFormula) {
  // Two layers over 3 tokens, E = 3, k = 1: f_e = C_e / 6, P_e = S_e / 6, aux = 3 * sum f_e P_e.
  RouterStats stats(3, 1, 0.25);
  stats.add_layer(torch::tensor({2, 1, 0}, torch::kLong), torch::tensor({1.2f, 0.9f, 0.9f}), 0);
  stats.add_layer(torch::tensor({1, 1, 1}, torch::kLong), torch::tensor({0.8f, 1.1f, 1.1f}), 0);
  // A device with other rows of the batch adds as much again: sum_over_batch doubles everything.
  stats.close([](at::Tensor& sums) { sums.mul_(2); });
  const double C[3] = {6, 4, 2}, S[3] = {4.0, 4.0, 4.0}, tokens = 12;  // layers x tokens, over both devices
  double aux = 0;
  for (int e = 0; e < 3; ++e) aux += 3 * (C[e] / tokens) * (S[e] / tokens);
  EXPECT_NEAR(stats.aux_loss(), aux, 1e-6);
  // d(coef * aux) / d(S_e) of one layer's local sums: coef * 3 * C_e / tokens^2, times the objective weight.
  stats.set_objective_weight(0.5);
  const torch::Tensor grad = stats.probability_gradient();
  for (int e = 0; e < 3; ++e) EXPECT_NEAR(grad[e].item<float>(), 0.5 * 0.25 * 3 * C[e] / (tokens * tokens), 1e-7);
  // A checkpointed layer's recomputation in backward adds nothing once closed.
  stats.add_layer(torch::tensor({3, 0, 0}, torch::kLong), torch::tensor({3.0f, 0.0f, 0.0f}), 0);
  EXPECT_NEAR(stats.aux_loss(), aux, 1e-6);
}

TEST(RouterStatsTest, TheModelsLoadBalancingGradientEqualsAutogradOfTheFormula) {
  // The model's router gradient from (coef x aux) alone, against autograd through the formula written out.
  LlamaConfig config = moe_config(4, 2);
  config.num_hidden_layers = 2;
  LlamaForCausalLM model(config);
  initialize_parameters(model, 3);
  const torch::Tensor tokens_BT = torch::randint(0, 32, {2, 7}, at::detail::createCPUGenerator(8));
  // The hidden states with no gradient of their own: only the injected load-balancing gradient reaches the routers.
  (model.hidden_states(tokens_BT) * 0).sum().backward();
  std::vector<torch::Tensor> injected;
  for (const auto& layer : model.model->layers) injected.push_back(layer->block_sparse_moe->gate->weight.grad().clone());
  model.zero_grad();

  // The same forward, by hand: each layer's router probabilities from its normed input (the model's own injection
  // weighted 0 now).
  model.router_stats()->set_objective_weight(0);
  std::vector<torch::Tensor> probs;
  model.set_layer_runner([&](int64_t, LlamaDecoderLayer& layer, const torch::Tensor& x_BTD, const RopeTables& rope) {
    const torch::Tensor h_BTD = x_BTD + layer.self_attn->forward(layer.input_layernorm->forward(x_BTD), rope);
    const torch::Tensor normed_ND = layer.post_attention_layernorm->forward(h_BTD).reshape({-1, 16});
    probs.push_back(torch::softmax(torch::matmul(normed_ND, layer.block_sparse_moe->gate->weight.t()), -1));
    return layer.forward(x_BTD, rope);
  });
  model.hidden_states(tokens_BT);
  const torch::Tensor all_NE = torch::cat(probs);
  const torch::Tensor mask_NE =
      torch::zeros_like(all_NE).scatter_(1, std::get<1>(all_NE.detach().topk(2)), 1.0);
  const torch::Tensor aux = 4 * (mask_NE.mean(0) * all_NE.mean(0)).sum();
  (0.1 * aux).backward();
  for (size_t i = 0; i < injected.size(); ++i) {
    const torch::Tensor expected = model.model->layers[i]->block_sparse_moe->gate->weight.grad();
    EXPECT_TRUE(torch::allclose(injected[i], expected, 1e-4, 1e-7))
        << "layer " << i << ": max diff " << (injected[i] - expected).abs().max().item<float>();
  }
}

TEST(MixtralConfigTest, PublishedShapesAndCounts) {
  const LlamaConfig c =
      settings::Settings::from_config(config::Config::load(config::default_config_dir(), {"model=mixtral-8x7b"})).model;
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.parameter_count(), 46'702'792'704);  // Mixtral-8x7B's published count
  EXPECT_GT(c.active_parameter_count(), 12'800'000'000);
  EXPECT_LT(c.active_parameter_count(), 13'000'000'000);
  // Its Hugging Face config.json round-trips, as a Mixtral.
  const nlohmann::json json = c.to_hf_json("bfloat16");
  EXPECT_EQ(json["model_type"], "mixtral");
  EXPECT_EQ(json["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(LlamaConfig::from_hf_json(json, "config.json"), c);
  nlohmann::json windowed = json;
  windowed["sliding_window"] = 4096;
  try {
    LlamaConfig::from_hf_json(windowed, "config.json");
    FAIL() << "a sliding window was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window=4096 is not supported"), std::string::npos) << e.what();
  }
  LlamaConfig bad = c;
  bad.num_experts_per_tok = 9;
  try {
    bad.validate("model");
    FAIL() << "top-9 of 8 experts was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok must be between 1 and num_local_experts (8)"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::model
