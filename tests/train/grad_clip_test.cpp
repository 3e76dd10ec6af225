// grad_clip_test.cpp — the clip coefficient's cases, and clipping that matches torch::nn::utils::clip_grad_norm_.
#include "meshtrain/train/grad_clip.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace meshtrain::train {
namespace {

TEST(GradClipTest, Coefficient) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);                 // under the limit: unchanged
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));  // over: scaled to max_norm
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 0.0), 1.0);                 // clipping off
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, -1.0), 1.0);
  EXPECT_TRUE(std::isnan(clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
}

TEST(GradClipTest, MatchesTorchClipGradNorm) {
  torch::manual_seed(7);
  std::vector<at::Tensor> grads = {torch::randn({10}) * 3, torch::randn({4, 6}) * 3};
  std::vector<at::Tensor> params;
  for (const at::Tensor& g : grads) {
    params.push_back(torch::zeros_like(g).requires_grad_(true));
    params.back().mutable_grad() = g.clone();
  }
  double norm_squared = 0;
  for (const at::Tensor& g : grads) norm_squared += g.pow(2).sum().item<double>();
  const double norm = std::sqrt(norm_squared);
  const double max_norm = 1.5;
  ASSERT_GT(norm, max_norm);
  const double torch_norm = torch::nn::utils::clip_grad_norm_(params, max_norm);
  EXPECT_NEAR(torch_norm, norm, 1e-4);
  scale_(grads, clip_coefficient(norm, max_norm));
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(grads[i], params[i].grad(), 1e-6, 1e-7)) << i;
}

TEST(GradClipTest, ScaleByOneLeavesGradientsAndSkipsUndefined) {
  std::vector<at::Tensor> grads = {torch::full({3}, 2.0f), at::Tensor()};
  scale_(grads, 1.0);
  EXPECT_TRUE(torch::equal(grads[0], torch::full({3}, 2.0f)));
  scale_(grads, 0.25);
  EXPECT_TRUE(torch::equal(grads[0], torch::full({3}, 0.5f)));
  EXPECT_FALSE(grads[1].defined());
}

}  // namespace
}  // namespace meshtrain::train
