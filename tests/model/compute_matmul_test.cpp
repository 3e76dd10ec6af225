// compute_matmul_test.cpp — the model's matmuls on both bf16 paths (model/compute_matmul.hpp): the fp32 GEMM of bf16
// values against a reference (operands widened, fp32 matmul and its autograd gradients, rounded to bf16) and within
// bf16's tolerance of libtorch's bf16 GEMM, for the shapes the model multiplies; fp32 untouched; the setting's names,
// forced and probed choices; a tiny Llama's 20 training steps on each path within bf16's tolerance of fp32.
#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/parameter_init.hpp"

#include "bf16_path.hpp"
#include "tiny_llama.hpp"

#include <gtest/gtest.h>

namespace meshtrain::model {
namespace {

using testing::Bf16PathScope;

struct Operands {
  std::string what;
  std::vector<int64_t> a_shape, b_shape;
  bool b_transposed;  // b given as the transpose of a [O, I] weight, as a projection passes it
};

// The shapes the model multiplies: a projection on [B, T, I] and on [N, I] rows (b the transposed [O, I] weight), and
// the head's untransposed form. (Attention's products are the flash kernel's own: model/flash_attention.hpp.)
const std::vector<Operands> kShapes = {{"projection [B, T, I]", {2, 5, 24}, {24, 7}, true},
                                       {"projection [N, I]", {6, 24}, {24, 7}, true},
                                       {"plain [N, I] x [I, O]", {6, 24}, {24, 7}, false}};

torch::Tensor bf16_values(const std::vector<int64_t>& shape, uint64_t seed) {
  return torch::randn(shape, at::detail::createCPUGenerator(seed)).to(torch::kBFloat16);
}

// a @ b and the gradients of sum(out * grad_out) for a and b, all bf16, on the current path.
struct Product {
  torch::Tensor out, grad_a, grad_b;
};
Product bf16_product(const Operands& shapes, uint64_t seed) {
  torch::Tensor a = bf16_values(shapes.a_shape, seed).requires_grad_();
  std::vector<int64_t> stored = shapes.b_shape;
  if (shapes.b_transposed) std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
  torch::Tensor b_stored = bf16_values(stored, seed + 1).requires_grad_();
  const torch::Tensor b = shapes.b_transposed ? b_stored.transpose(-1, -2) : b_stored;
  torch::Tensor out = compute_matmul(a, b);
  out.backward(bf16_values(out.sizes().vec(), seed + 2));
  return {out.detach(), a.grad(), b_stored.grad()};
}

double max_abs(const torch::Tensor& t) { return t.to(torch::kFloat32).abs().max().item<double>(); }

// Within `relative` of want's largest magnitude, element by element.
void expect_within(const torch::Tensor& got, const torch::Tensor& want, double relative, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double bound = relative * max_abs(want), diff = max_abs(got.to(torch::kFloat32) - want.to(torch::kFloat32));
  EXPECT_LE(diff, bound) << what;
}

TEST(ComputeMatmulTest, Fp32GemmPathIsAnFp32MatmulOfTheBf16ValuesRoundedToBf16) {
  const Bf16PathScope path(Bf16Matmul::fp32_gemm);
  for (const Operands& shapes : kShapes) {
    SCOPED_TRACE(shapes.what);
    const Product got = bf16_product(shapes, 7);
    EXPECT_EQ(got.out.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(got.grad_a.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(got.grad_b.scalar_type(), torch::kBFloat16);

    // The reference: the same bf16 values widened to fp32, torch's fp32 matmul and its own autograd gradients.
    torch::Tensor a32 = bf16_values(shapes.a_shape, 7).to(torch::kFloat32).requires_grad_();
    std::vector<int64_t> stored = shapes.b_shape;
    if (shapes.b_transposed) std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
    torch::Tensor b32_stored = bf16_values(stored, 8).to(torch::kFloat32).requires_grad_();
    torch::Tensor out32 = torch::matmul(a32, shapes.b_transposed ? b32_stored.transpose(-1, -2) : b32_stored);
    out32.backward(bf16_values(out32.sizes().vec(), 9).to(torch::kFloat32));

    EXPECT_TRUE(torch::equal(got.out, out32.detach().to(torch::kBFloat16)));  // the same fp32 GEMM, rounded
    // The gradients' GEMMs may sum in another order than autograd's: a bf16 rounding step apart at most.
    expect_within(got.grad_a, a32.grad().to(torch::kBFloat16), 1.0 / 128, "grad a");
    expect_within(got.grad_b, b32_stored.grad().to(torch::kBFloat16), 1.0 / 128, "grad b");
  }
}

TEST(ComputeMatmulTest, Fp32GemmPathIsWithinBf16ToleranceOfTheNativeBf16Gemm) {
  for (const Operands& shapes : kShapes) {
    SCOPED_TRACE(shapes.what);
    Product native, fp32_gemm;
    {
      const Bf16PathScope path(Bf16Matmul::native);
      native = bf16_product(shapes, 11);
    }
    {
      const Bf16PathScope path(Bf16Matmul::fp32_gemm);
      fp32_gemm = bf16_product(shapes, 11);
    }
    expect_within(fp32_gemm.out, native.out, 2e-2, "out");
    expect_within(fp32_gemm.grad_a, native.grad_a, 2e-2, "grad a");
    expect_within(fp32_gemm.grad_b, native.grad_b, 2e-2, "grad b");
  }
}

TEST(ComputeMatmulTest, Fp32ComputeIsTorchsMatmulOnEitherPath) {
  const torch::Tensor a = torch::randn({3, 5, 6}), b = torch::randn({6, 4});
  for (Bf16Matmul p : {Bf16Matmul::native, Bf16Matmul::fp32_gemm}) {
    const Bf16PathScope path(p);
    EXPECT_TRUE(torch::equal(compute_matmul(a, b), torch::matmul(a, b)));
    EXPECT_EQ(gemm_dtype(torch::kFloat32), torch::kFloat32);
    EXPECT_TRUE(torch::equal(gemm_operand(a, torch::kFloat32), a));
  }
}

TEST(ComputeMatmulTest, GemmOperandsAreWhatEachPathMultiplies) {
  const torch::Tensor t = torch::randn({4, 6}), t_bf16 = t.to(torch::kBFloat16);
  {
    const Bf16PathScope path(Bf16Matmul::native);
    EXPECT_EQ(gemm_dtype(torch::kBFloat16), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(gemm_operand(t, torch::kBFloat16), t_bf16));
  }
  const Bf16PathScope path(Bf16Matmul::fp32_gemm);
  EXPECT_EQ(gemm_dtype(torch::kBFloat16), torch::kFloat32);
  EXPECT_TRUE(torch::equal(gemm_operand(t, torch::kBFloat16), t_bf16.to(torch::kFloat32)));  // rounded, widened
  EXPECT_TRUE(torch::equal(gemm_operand(t_bf16, torch::kBFloat16), t_bf16.to(torch::kFloat32)));
}

TEST(ComputeMatmulTest, RefusesShapesItHasNoGradientFor) {
  const Bf16PathScope path(Bf16Matmul::fp32_gemm);
  const torch::Tensor a = bf16_values({2, 3, 4}, 1);
  EXPECT_THROW(compute_matmul(a, bf16_values({2, 4, 5}, 2)), Error);  // b is a [I, O] weight, never batched
  EXPECT_THROW(compute_matmul(a, torch::randn({4, 5})), Error);        // mixed dtypes
}

TEST(ComputeMatmulTest, SettingNames) {
  for (Bf16Matmul p : {Bf16Matmul::automatic, Bf16Matmul::native, Bf16Matmul::fp32_gemm})
    EXPECT_EQ(bf16_matmul_from_name(bf16_matmul_name(p)), p);
  EXPECT_EQ(bf16_matmul_name(Bf16Matmul::automatic), std::string("auto"));
  EXPECT_FALSE(bf16_matmul_from_name("fp32").has_value());
  EXPECT_FALSE(bf16_matmul_from_name("").has_value());
  EXPECT_THROW(set_bf16_matmul(Bf16Matmul::automatic), Error);
}

TEST(ComputeMatmulTest, AForcedPathIsTakenWithoutAProbe) {
  for (Bf16Matmul p : {Bf16Matmul::native, Bf16Matmul::fp32_gemm}) {
    const Bf16MatmulChoice choice = choose_bf16_matmul(p, 768);
    EXPECT_EQ(choice.path, p);
    EXPECT_EQ(choice.probe_rows, 0);
    EXPECT_EQ(choice.bf16_flags, cpu_bf16_flags());
    const std::string line = choice.describe();
    EXPECT_NE(line.find(std::string("bf16_matmul=") + bf16_matmul_name(p)), std::string::npos) << line;
    EXPECT_NE(line.find(p == Bf16Matmul::native ? "libtorch's bf16 GEMMs" : "fp32 GEMMs of bf16 values"),
              std::string::npos)
        << line;
  }
}

TEST(ComputeMatmulTest, TheAutomaticChoiceFollowsTheFlagsAndTheProbe) {
  const Bf16MatmulChoice choice = choose_bf16_matmul(Bf16Matmul::automatic, 320);
  EXPECT_EQ(choice.probe_rows, 256);
  EXPECT_EQ(choice.probe_width, 320);
  EXPECT_GT(choice.probe_bf16_gflops, 0);
  EXPECT_GT(choice.probe_fp32_gflops, 0);
  const bool native = !choice.bf16_flags.empty() && choice.probe_bf16_gflops >= choice.probe_fp32_gflops;
  EXPECT_EQ(choice.path, native ? Bf16Matmul::native : Bf16Matmul::fp32_gemm);
  const std::string line = choice.describe();
  EXPECT_NE(line.find("probe [256 x 320] x [320 x 320]: bf16 "), std::string::npos) << line;
  EXPECT_NE(line.find(choice.bf16_flags.empty() ? "no avx512_bf16/amx_bf16" : choice.bf16_flags), std::string::npos)
      << line;
  // A tiny model's products would time mostly overheads: the probe is 256 wide at least, 1024 at most.
  EXPECT_EQ(choose_bf16_matmul(Bf16Matmul::automatic, 64).probe_width, 256);
}

// 20 AdamW steps of a tiny Llama through the training loss (the fused head loss) in fp32 and in bf16 on each path:
// every step's loss within bf16's tolerance (2%, as Bf16ComputeIsCloseToFp32 in llama_test.cpp and the bf16 parity
// test of slow_test_parallel_parity.py) of fp32's. Each step's rows follow x -> 5x + 3 (mod 64) from random starts, a
// rule the model learns within the 20 steps (the loss falls from 4.2 to 0.35; bf16 on either path stayed within 0.8%
// of fp32 at every step), so that rounding differences have 20 steps of learning to grow in.
std::vector<double> twenty_step_losses(torch::Dtype dtype) {
  LlamaForCausalLM model(testing::tiny_llama_config(/*tied=*/false, /*moe=*/false, /*vocab_size=*/64));
  initialize_parameters(model, 21);
  model.set_compute_dtype(dtype);
  torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    torch::Tensor tokens_BT = torch::empty({4, 33}, torch::kInt64);
    tokens_BT.select(1, 0).copy_(torch::randint(64, {4}, at::detail::createCPUGenerator(100 + step), torch::kInt64));
    for (int64_t t = 1; t < 33; ++t) tokens_BT.select(1, t).copy_((tokens_BT.select(1, t - 1) * 5 + 3) % 64);
    optimizer.zero_grad();
    const torch::Tensor loss = model.loss_sum(tokens_BT.narrow(1, 0, 32), tokens_BT.narrow(1, 1, 32)) / (4.0 * 32);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(ComputeMatmulTest, TwentyTrainingStepsOnEachBf16PathStayWithinBf16ToleranceOfFp32) {
  const std::vector<double> fp32 = twenty_step_losses(torch::kFloat32);
  for (Bf16Matmul p : {Bf16Matmul::native, Bf16Matmul::fp32_gemm}) {
    SCOPED_TRACE(bf16_matmul_name(p));
    const Bf16PathScope path(p);
    const std::vector<double> bf16 = twenty_step_losses(torch::kBFloat16);
    for (size_t step = 0; step < fp32.size(); ++step)
      EXPECT_NEAR(bf16[step], fp32[step], 2e-2 * fp32[step]) << "step " << step + 1;
  }
}

}  // namespace
}  // namespace meshtrain::model
