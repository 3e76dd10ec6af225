// fused_cross_entropy_test.cpp — the chunked head loss against libtorch's unfused cross_entropy over full logits:
// loss and both gradients, for uneven chunks, fp32 and bf16 (on both bf16 matmul paths), a scaled incoming gradient, a
// tied weight used
// elsewhere in the graph, no gradients computed outside grad mode, and the weight's gradient made a range of elements
// at a time from the kept logits' gradient, and the weight given a block of rows at a time (online softmax).
#include "meshtrain/model/fused_cross_entropy.hpp"

#include "bf16_path.hpp"

#include <gtest/gtest.h>

namespace meshtrain::model {
namespace {

constexpr int64_t kN = 37, kD = 16, kV = 53;

struct Inputs {
  torch::Tensor hidden_ND, weight_VD, targets_N;
};

Inputs inputs(torch::Dtype hidden_dtype) {
  auto gen = at::detail::createCPUGenerator(11);
  Inputs in;
  in.hidden_ND = torch::randn({kN, kD}, gen).to(hidden_dtype).requires_grad_();
  in.weight_VD = (torch::randn({kV, kD}, gen) * 0.3).requires_grad_();
  in.targets_N = torch::randint(0, kV, {kN}, gen, torch::TensorOptions().dtype(torch::kLong));
  return in;
}

// The unfused reference, as the model computed it before: logits in the hidden dtype, fp32 softmax.
torch::Tensor unfused_sum(const Inputs& in) {
  const torch::Tensor logits_NV =
      torch::matmul(in.hidden_ND, in.weight_VD.to(in.hidden_ND.scalar_type()).t()).to(torch::kFloat32);
  return torch::nn::functional::cross_entropy(logits_NV, in.targets_N,
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

TEST(FusedCrossEntropyTest, LossAndGradientsEqualTheUnfusedOnesForAnyChunking) {
  const Inputs ref = inputs(torch::kFloat32);
  const torch::Tensor ref_loss = unfused_sum(ref);
  (ref_loss * 0.25).backward();
  for (int64_t chunk_rows : {int64_t{1}, int64_t{7}, kN, int64_t{100}}) {
    const Inputs in = inputs(torch::kFloat32);
    const torch::Tensor loss = fused_cross_entropy_sum(in.hidden_ND, in.weight_VD, in.targets_N, chunk_rows);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-4) << chunk_rows;
    (loss * 0.25).backward();
    EXPECT_TRUE(torch::allclose(in.hidden_ND.grad(), ref.hidden_ND.grad(), 1e-5, 1e-6)) << chunk_rows;
    EXPECT_TRUE(torch::allclose(in.weight_VD.grad(), ref.weight_VD.grad(), 1e-5, 1e-6)) << chunk_rows;
  }
}

TEST(FusedCrossEntropyTest, Bf16HiddenStatesGiveBf16AndFp32GradientsCloseToUnfused) {
  const Inputs ref = inputs(torch::kBFloat16);  // unfused_sum multiplies with libtorch's bf16 GEMM on either path
  const torch::Tensor ref_loss_tensor = unfused_sum(ref);
  ref_loss_tensor.backward();
  const double ref_loss = ref_loss_tensor.item<double>();
  for (Bf16Matmul path : {Bf16Matmul::native, Bf16Matmul::fp32_gemm}) {
    SCOPED_TRACE(bf16_matmul_name(path));
    const testing::Bf16PathScope scope(path);
    const Inputs in = inputs(torch::kBFloat16);
    const torch::Tensor loss = fused_cross_entropy_sum(in.hidden_ND, in.weight_VD, in.targets_N, 8);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-2 * std::abs(ref_loss));
    EXPECT_EQ(in.hidden_ND.grad().scalar_type(), torch::kBFloat16);
    EXPECT_EQ(in.weight_VD.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::allclose(in.hidden_ND.grad().to(torch::kFloat32), ref.hidden_ND.grad().to(torch::kFloat32),
                                2e-2, 2e-2));
    EXPECT_TRUE(torch::allclose(in.weight_VD.grad(), ref.weight_VD.grad(), 2e-2, 2e-2));
  }
}

TEST(FusedCrossEntropyTest, ATiedWeightGetsTheSumOfItsGradients) {
  // The weight is also an embedding table: its gradient is the head's plus the lookup's, as with tied embeddings.
  const Inputs ref = inputs(torch::kFloat32), in = inputs(torch::kFloat32);
  const torch::Tensor ids = torch::arange(5, torch::kLong);
  (unfused_sum(ref) + torch::embedding(ref.weight_VD, ids).sum()).backward();
  (fused_cross_entropy_sum(in.hidden_ND, in.weight_VD, in.targets_N, 5) + torch::embedding(in.weight_VD, ids).sum())
      .backward();
  EXPECT_TRUE(torch::allclose(in.weight_VD.grad(), ref.weight_VD.grad(), 1e-5, 1e-6));
}

// fp32, and bf16 on both matmul paths.
const std::vector<std::pair<torch::Dtype, Bf16Matmul>> kDtypesAndPaths = {
    {torch::kFloat32, Bf16Matmul::native}, {torch::kBFloat16, Bf16Matmul::native},
    {torch::kBFloat16, Bf16Matmul::fp32_gemm}};

TEST(FusedCrossEntropyTest, WeightGradientFromTheLogitGradientsEqualsTheWholeGradientAnyRangeAtATime) {
  for (const auto& [dtype, path] : kDtypesAndPaths) {
    SCOPED_TRACE(bf16_matmul_name(path));
    const testing::Bf16PathScope scope(path);
    const Inputs in = inputs(dtype);
    const CrossEntropyWithGradients whole = cross_entropy_with_gradients(in.hidden_ND, in.weight_VD, in.targets_N, 7);
    const CrossEntropyWithLogitGradients by_rows(in.hidden_ND, in.weight_VD, in.targets_N, 7);
    EXPECT_EQ(by_rows.loss().item<float>(), whole.loss.item<float>()) << dtype;
    EXPECT_TRUE(torch::equal(by_rows.grad_hidden_ND(), whole.grad_hidden_ND)) << dtype;
    // Summed over chunks of 7 rows (whole) or at once (by rows): equal up to the order of the additions.
    const double tolerance = dtype == torch::kFloat32 ? 1e-6 : 2e-2;
    const torch::Tensor whole_flat = whole.grad_weight_VD.reshape({-1});
    // Whole rows, parts of one row, ranges across row boundaries, the end, an empty range.
    for (auto [from, to] : {std::pair<int64_t, int64_t>{0, kV * kD}, {0, 1}, {3, 9}, {5, 7 * kD + 3}, {kD, 3 * kD},
                            {kV * kD - 20, kV * kD}, {40, 40}}) {
      const torch::Tensor elements = by_rows.weight_gradient_elements(from, to);
      EXPECT_EQ(elements.scalar_type(), torch::kFloat32);
      ASSERT_EQ(elements.numel(), to - from);
      EXPECT_TRUE(torch::allclose(elements, whole_flat.narrow(0, from, to - from), tolerance, tolerance))
          << dtype << " elements " << from << ".." << to;
    }
    EXPECT_THROW(by_rows.weight_gradient_elements(50, kV * kD + 1), std::exception);
  }
  // The logits' gradient of N rows against the V x D fp32 weight gradient: N * element size <= 4 D.
  EXPECT_TRUE(logit_gradients_fit_in_weight_gradient(768, 768, torch::kFloat32));
  EXPECT_FALSE(logit_gradients_fit_in_weight_gradient(769, 768, torch::kFloat32));
  EXPECT_TRUE(logit_gradients_fit_in_weight_gradient(1536, 768, torch::kBFloat16));
}

TEST(FusedCrossEntropyTest, AWeightGivenInBlocksOfRowsInAnyOrderGivesTheSameLossAndGradients) {
  for (const auto& [dtype, path] : kDtypesAndPaths) {
    SCOPED_TRACE(bf16_matmul_name(path));
    const testing::Bf16PathScope scope(path);
    const Inputs in = inputs(dtype);
    const CrossEntropyWithLogitGradients whole(in.hidden_ND, in.weight_VD, in.targets_N, 7);
    // Blocks of rows [40, 53) then [0, 5) + [20, 40) (two ranges in one block) then [5, 20), the weight in fp32.
    const std::vector<std::vector<std::pair<int64_t, int64_t>>> blocks = {{{40, 13}}, {{0, 5}, {20, 20}}, {{5, 15}}};
    size_t next = 0;
    const CrossEntropyWithLogitGradients by_blocks(in.hidden_ND, kV, in.targets_N, 7, [&] {
      CrossEntropyWithLogitGradients::WeightBlock block;
      if (next == blocks.size()) return block;
      std::vector<torch::Tensor> rows;
      for (const auto& [first, count] : blocks[next]) rows.push_back(in.weight_VD.detach().narrow(0, first, count));
      block.weight_RD = torch::cat(rows);
      block.row_ranges = blocks[next++];
      return block;
    });
    const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(by_blocks.loss().item<double>(), whole.loss().item<double>(), tolerance * kN) << dtype;
    EXPECT_EQ(by_blocks.grad_hidden_ND().scalar_type(), dtype);
    EXPECT_TRUE(torch::allclose(by_blocks.grad_hidden_ND().to(torch::kFloat32),
                                whole.grad_hidden_ND().to(torch::kFloat32), tolerance, tolerance)) << dtype;
    EXPECT_TRUE(torch::allclose(by_blocks.weight_gradient_elements(0, kV * kD),
                                whole.weight_gradient_elements(0, kV * kD), tolerance, tolerance)) << dtype;
  }
  // Every row exactly once: a block short of the vocabulary is refused.
  const Inputs in = inputs(torch::kFloat32);
  bool given = false;
  EXPECT_THROW(CrossEntropyWithLogitGradients(in.hidden_ND, kV, in.targets_N, 7, [&] {
                 CrossEntropyWithLogitGradients::WeightBlock block;
                 if (given) return block;
                 given = true;
                 block.weight_RD = in.weight_VD.detach().narrow(0, 0, kV - 1);
                 block.row_ranges = {{0, kV - 1}};
                 return block;
               }),
               std::exception);
}

TEST(FusedCrossEntropyTest, OutsideGradModeOnlyTheLossIsComputed) {
  const Inputs in = inputs(torch::kFloat32);
  torch::Tensor loss;
  {
    torch::NoGradGuard no_grad;
    loss = fused_cross_entropy_sum(in.hidden_ND, in.weight_VD, in.targets_N, 4);
  }
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), unfused_sum(in).item<double>(), 1e-4);
  EXPECT_EQ(cross_entropy_chunk_rows(32000), 262);
  EXPECT_EQ(cross_entropy_chunk_rows(int64_t{1} << 30), 1);
}

// The chunks' log-sum-exp is made a few rows at a time (no second chunk-sized buffer): the loss is still the bits of
// libtorch's logsumexp over each whole chunk, at a vocabulary the size of a real one (the vectorized kernels' paths)
// and with chunks of 1 and of 19 rows.
TEST(FusedCrossEntropyTest, LossIsTheBitsOfLibtorchsLogsumexpPerChunk) {
  constexpr int64_t N = 41, D = 24, V = 32000;
  auto gen = at::detail::createCPUGenerator(5);
  const torch::Tensor hidden_ND = torch::randn({N, D}, gen), weight_VD = torch::randn({V, D}, gen);
  const torch::Tensor targets_N = torch::randint(0, V, {N}, gen, torch::TensorOptions().dtype(torch::kLong));
  torch::NoGradGuard no_grad;
  for (const int64_t chunk_rows : {int64_t{1}, int64_t{19}, N}) {
    torch::Tensor expected = torch::zeros({}, torch::kFloat32);
    for (int64_t begin = 0; begin < N; begin += chunk_rows) {
      const int64_t rows = std::min(chunk_rows, N - begin);
      const torch::Tensor logits_CV = torch::matmul(hidden_ND.narrow(0, begin, rows), weight_VD.t());
      expected.add_((logits_CV.logsumexp(1, /*keepdim=*/true) -
                     logits_CV.gather(1, targets_N.narrow(0, begin, rows).unsqueeze(1)))
                        .sum());
    }
    EXPECT_TRUE(torch::equal(fused_cross_entropy_sum(hidden_ND, weight_VD, targets_N, chunk_rows), expected))
        << "chunks of " << chunk_rows;
  }
}

}  // namespace
}  // namespace meshtrain::model
