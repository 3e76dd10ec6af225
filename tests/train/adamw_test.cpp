// adamw_test.cpp — AdamW against torch::optim::AdamW on random tensors over several steps with a changing learning
// rate (bitwise in practice, checked to 1e-6 relative), restoring its state mid-run, and the config checks.
#include "meshtrain/common/error.hpp"
#include "meshtrain/train/adamw.hpp"
#include "train/train_test_support.hpp"

#include <gtest/gtest.h>

namespace meshtrain::train {
namespace {

using testing::settings_for;

std::vector<at::Tensor> random_params() {
  // The last is updated in three chunks (AdamW::kChunkElements), the third a partial one.
  return {torch::randn({7}), torch::randn({3, 5}), torch::randn({2, 3, 4}), torch::randn({600001})};
}

std::vector<at::Tensor> random_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) grads.push_back(torch::randn_like(p));
  return grads;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(torch::allclose(got, want, /*rtol=*/1e-6, /*atol=*/1e-8))
      << what << ": max |diff| " << (got - want).abs().max().item<double>();
}

TEST(AdamWTest, MatchesTorchAdamWOverSeveralSteps) {
  torch::manual_seed(3);
  AdamWOptions options;
  options.learning_rate = 3e-3;
  options.beta1 = 0.9;
  options.beta2 = 0.95;
  options.epsilon = 1e-8;
  options.weight_decay = 0.1;
  std::vector<at::Tensor> ours = random_params(), theirs;
  for (const at::Tensor& p : ours) theirs.push_back(p.clone().requires_grad_(true));
  AdamW adamw(options, ours);
  torch::optim::AdamW reference(theirs, torch::optim::AdamWOptions(options.learning_rate)
                                            .betas({options.beta1, options.beta2})
                                            .eps(options.epsilon)
                                            .weight_decay(options.weight_decay));
  for (int step = 1; step <= 6; ++step) {
    const double lr = options.learning_rate * step / 6.0;  // a warmup: the rate differs every step
    std::vector<at::Tensor> grads = random_grads(ours);
    adamw.step(grads, lr);
    for (size_t i = 0; i < theirs.size(); ++i) theirs[i].mutable_grad() = grads[i].clone();
    static_cast<torch::optim::AdamWOptions&>(reference.param_groups()[0].options()).lr(lr);
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i)
      expect_close(ours[i], theirs[i].detach(), fmt::format("step {} param {}", step, i));
  }
  // The same kernels in the same order: in practice bitwise equal, not merely close.
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], theirs[i].detach())) << i;
  EXPECT_EQ(adamw.steps_taken(), 6);
}

TEST(AdamWTest, UpdatesParametersThatRequireGradInPlace) {
  torch::manual_seed(4);
  at::Tensor p = torch::randn({4, 4}).requires_grad_(true);
  const void* storage = p.data_ptr();
  AdamW adamw(AdamWOptions{}, {p});
  adamw.step({torch::ones({4, 4})}, 0.1);
  EXPECT_EQ(p.data_ptr(), storage);
  EXPECT_TRUE(p.requires_grad());
}

TEST(AdamWTest, RestoredStateContinuesBitwise) {
  torch::manual_seed(5);
  const std::vector<at::Tensor> start = random_params();
  std::vector<std::vector<at::Tensor>> grads;
  for (int s = 0; s < 5; ++s) grads.push_back(random_grads(start));
  auto lr_at = [](int s) { return 1e-2 / (s + 1); };

  std::vector<at::Tensor> uninterrupted;
  for (const at::Tensor& p : start) uninterrupted.push_back(p.clone());
  AdamW a(AdamWOptions{}, uninterrupted);
  for (int s = 0; s < 5; ++s) a.step(grads[s], lr_at(s));

  std::vector<at::Tensor> first, resumed;
  for (const at::Tensor& p : start) first.push_back(p.clone());
  AdamW b(AdamWOptions{}, first);
  for (int s = 0; s < 3; ++s) b.step(grads[s], lr_at(s));
  for (const at::Tensor& p : first) resumed.push_back(p.clone());
  AdamW c(AdamWOptions{}, resumed);
  for (size_t i = 0; i < resumed.size(); ++i) {
    c.exp_avg()[i].copy_(b.exp_avg()[i]);
    c.exp_avg_sq()[i].copy_(b.exp_avg_sq()[i]);
  }
  c.set_steps_taken(b.steps_taken());
  for (int s = 3; s < 5; ++s) c.step(grads[s], lr_at(s));
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_TRUE(torch::equal(resumed[i], uninterrupted[i])) << i;
}

TEST(AdamWTest, ReadsOptionsFromConfig) {
  const AdamWOptions o = settings_for({"optimizer.learning_rate=0.001", "optimizer.beta1=0.8", "optimizer.beta2=0.99",
                                       "optimizer.epsilon=1e-6", "optimizer.weight_decay=0.05"})
                             .optimizer;
  EXPECT_DOUBLE_EQ(o.learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(o.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.beta2, 0.99);
  EXPECT_DOUBLE_EQ(o.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.05);
}

TEST(AdamWTest, BadOptionsNameTheKey) {
  auto error_of = [](const std::string& override_text) -> std::string {
    try {
      settings_for({override_text});
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("optimizer.beta1=1.0").find("optimizer.beta1"), std::string::npos);
  EXPECT_NE(error_of("optimizer.beta2=-0.1").find("optimizer.beta2"), std::string::npos);
  EXPECT_NE(error_of("optimizer.epsilon=0").find("optimizer.epsilon"), std::string::npos);
  EXPECT_NE(error_of("optimizer.learning_rate=-1").find("optimizer.learning_rate"), std::string::npos);
  EXPECT_NE(error_of("optimizer.weight_decay=-0.1").find("optimizer.weight_decay"), std::string::npos);
  EXPECT_NE(error_of("optimizer.type=sgd").find("optimizer.type"), std::string::npos);
}

TEST(AdamWTest, RejectsMismatchedGradients) {
  AdamW adamw(AdamWOptions{}, {torch::zeros({3})});
  EXPECT_THROW(adamw.step({torch::zeros({4})}, 0.1), Error);
  EXPECT_THROW(adamw.step({}, 0.1), Error);
}

}  // namespace
}  // namespace meshtrain::train
