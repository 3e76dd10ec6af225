// flash_attention_test.cpp — the tiled attention kernel (model/flash_attention.hpp) against a float64 reference
// written from the definition (softmax over the keys each query sees, GQA by repeating K/V per query head): the output,
// the log-sum-exp and the gradients of q, k, v (through the output and through the log-sum-exp) for causal
// self-attention, GQA and MQA, lengths that are not a multiple of the tile, T = 1, queries after cached keys, zig-zag
// chunks of a row on both sides, shuffled positions, document ids, a query that sees nothing, head dims that are not
// a multiple of the kernel's columns, several threads, bf16 within bf16's tolerance, and grad mode off.
#include "meshtrain/model/flash_attention.hpp"

#include "meshtrain/runtime/compute_threads.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::model {
namespace {

struct AttentionCase {
  AttentionCase(std::string what, int64_t B, int64_t H, int64_t K, int64_t T, int64_t S, int64_t E)
      : what(std::move(what)), B(B), H(H), K(K), T(T), S(S), E(E) {}
  std::string what;
  int64_t B, H, K, T, S, E;
  AttentionMask mask;  // causal with the queries last when positions are left undefined
  torch::Dtype dtype = torch::kFloat32;
};

struct AttentionInputs {
  torch::Tensor q_BHTE, k_BKSE, v_BKSE, grad_out_BHTE, grad_lse_BHT;
};

AttentionInputs attention_inputs(const AttentionCase& c, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto values = [&](std::vector<int64_t> shape) { return torch::randn(shape, gen).to(c.dtype); };
  return {values({c.B, c.H, c.T, c.E}), values({c.B, c.K, c.S, c.E}), values({c.B, c.K, c.S, c.E}),
          values({c.B, c.H, c.T, c.E}), torch::randn({c.B, c.H, c.T}, gen)};
}

AttentionMask mask_of(const AttentionCase& c) {
  return c.mask.query_positions.defined() ? c.mask : AttentionMask::causal(c.S - c.T, c.T, c.S);
}

struct AttentionValues {
  torch::Tensor out_BHTE, lse_BHT, grad_q_BHTE, grad_k_BKSE, grad_v_BKSE;
};

// The definition in float64: p = softmax over the keys a query sees of q k^T / sqrt(E) (query head h reads K/V head
// h / G), out = p v, lse = log sum exp of those scores (-inf for a query that sees none, whose output is 0); the
// gradients of sum(out * grad_out) + sum(lse * grad_lse) over the queries that see a key.
AttentionValues attention_reference(const AttentionCase& c, const AttentionInputs& in) {
  const AttentionMask mask = mask_of(c);
  const int64_t G = c.H / c.K;
  torch::Tensor q = in.q_BHTE.to(torch::kDouble).requires_grad_();
  torch::Tensor k = in.k_BKSE.to(torch::kDouble).requires_grad_();
  torch::Tensor v = in.v_BKSE.to(torch::kDouble).requires_grad_();
  const torch::Tensor query_positions_BT = mask.query_positions.to(torch::kLong).expand({c.B, c.T});
  const torch::Tensor key_positions_BS = mask.key_positions.to(torch::kLong).expand({c.B, c.S});
  torch::Tensor sees_BTS = key_positions_BS.unsqueeze(1) <= query_positions_BT.unsqueeze(2);
  if (mask.query_documents.defined())
    sees_BTS = sees_BTS & (mask.key_documents.to(torch::kLong).unsqueeze(1) ==
                           mask.query_documents.to(torch::kLong).unsqueeze(2));
  const torch::Tensor sees_B1TS = sees_BTS.unsqueeze(1);
  const torch::Tensor scores_BHTS =
      torch::matmul(q, k.repeat_interleave(G, 1).transpose(-1, -2)).div(std::sqrt(static_cast<double>(c.E)))
          .masked_fill(sees_B1TS.logical_not(), -INFINITY);
  const torch::Tensor seen_BHT1 = sees_B1TS.any(-1, /*keepdim=*/true).expand({c.B, c.H, c.T, 1});
  const torch::Tensor max_BHT1 =
      torch::where(seen_BHT1, std::get<0>(scores_BHTS.max(-1, /*keepdim=*/true)), torch::zeros({}, torch::kDouble))
          .detach();
  const torch::Tensor exp_BHTS = (scores_BHTS - max_BHT1).exp();
  const torch::Tensor sum_BHT1 = torch::where(seen_BHT1, exp_BHTS.sum(-1, true), torch::ones({}, torch::kDouble));
  const torch::Tensor out = torch::matmul(exp_BHTS / sum_BHT1, v.repeat_interleave(G, 1));
  const torch::Tensor lse_BHT1 = max_BHT1 + sum_BHT1.log();
  const torch::Tensor seen_lse_BHT =
      torch::where(seen_BHT1, lse_BHT1, torch::zeros({}, torch::kDouble)).squeeze(-1);
  const torch::Tensor objective = (out * in.grad_out_BHTE.to(torch::kDouble)).sum() +
                                  (seen_lse_BHT * in.grad_lse_BHT.to(torch::kDouble)).sum();
  const auto grads = torch::autograd::grad({objective}, {q, k, v});
  const torch::Tensor lse_BHT =
      torch::where(seen_BHT1, lse_BHT1, torch::full({}, -INFINITY, torch::kDouble)).squeeze(-1);
  return {out.detach(), lse_BHT.detach(), grads[0], grads[1], grads[2]};
}

AttentionValues attention_kernel(const AttentionCase& c, const AttentionInputs& in) {
  torch::Tensor q = in.q_BHTE.clone().requires_grad_(), k = in.k_BKSE.clone().requires_grad_();
  torch::Tensor v = in.v_BKSE.clone().requires_grad_();
  const AttentionResult result = flash_attention(q, k, v, mask_of(c));
  const auto grads = torch::autograd::grad({result.out_BHTE, result.lse_BHT},
                                           {q, k, v}, {in.grad_out_BHTE, in.grad_lse_BHT});
  return {result.out_BHTE.detach(), result.lse_BHT.detach(), grads[0], grads[1], grads[2]};
}

// Within `relative` of the reference's largest magnitude (at least 1), element by element, with no NaN.
void expect_attention_near(const torch::Tensor& got, const torch::Tensor& want, double relative,
                           const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const torch::Tensor got64 = got.to(torch::kDouble);
  EXPECT_FALSE(got64.isnan().any().item<bool>()) << what;
  const double bound = relative * std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE((got64 - want).abs().max().item<double>(), bound) << what;
}

void expect_matches_definition(const AttentionCase& c, uint64_t seed = 1) {
  SCOPED_TRACE(c.what);
  const AttentionInputs in = attention_inputs(c, seed);
  const AttentionValues want = attention_reference(c, in), got = attention_kernel(c, in);
  EXPECT_EQ(got.out_BHTE.scalar_type(), c.dtype);
  EXPECT_EQ(got.grad_q_BHTE.scalar_type(), c.dtype);
  EXPECT_EQ(got.lse_BHT.scalar_type(), torch::kFloat32);
  const double relative = c.dtype == torch::kFloat32 ? 2e-5 : 2e-2;
  expect_attention_near(got.out_BHTE, want.out_BHTE, relative, "output");
  const torch::Tensor seen_BHT = want.lse_BHT.isfinite();
  EXPECT_TRUE(torch::equal(got.lse_BHT.isfinite(), seen_BHT)) << "the queries that see no key";
  const torch::Tensor unseen_BHT = seen_BHT.logical_not();
  expect_attention_near(got.lse_BHT.masked_fill(unseen_BHT, 0), want.lse_BHT.masked_fill(unseen_BHT, 0), relative,
                        "log-sum-exp");
  expect_attention_near(got.grad_q_BHTE, want.grad_q_BHTE, relative, "dq");
  expect_attention_near(got.grad_k_BKSE, want.grad_k_BKSE, relative, "dk");
  expect_attention_near(got.grad_v_BKSE, want.grad_v_BKSE, relative, "dv");
}

torch::Tensor position_ranges(std::vector<std::pair<int64_t, int64_t>> ranges) {  // [first, end) ranges, concatenated
  std::vector<torch::Tensor> parts;
  for (auto [first, end] : ranges) parts.push_back(torch::arange(first, end, torch::kLong));
  return torch::cat(parts);
}

TEST(FlashAttentionTest, CausalSelfAttentionMatchesTheDefinition) {
  expect_matches_definition({"GQA, T = S = 150 (two whole tiles and a partial one)", 2, 6, 2, 150, 150, 32});
  expect_matches_definition({"T = S = 1", 1, 4, 2, 1, 1, 16});
  expect_matches_definition({"no grouping (H = K), T = 64", 1, 3, 3, 64, 64, 16});
  expect_matches_definition({"MQA (K = 1), T = 65", 2, 4, 1, 65, 65, 16});
  expect_matches_definition({"head_dim 8 (padded to the kernel's 16 columns)", 1, 4, 2, 70, 70, 8});
  expect_matches_definition({"head_dim 20", 1, 2, 1, 33, 33, 20});
  expect_matches_definition({"head_dim 128", 1, 2, 1, 130, 130, 128});
}

TEST(FlashAttentionTest, QueriesAfterCachedKeys) {
  // Decoding: the queries sit at the positions after S - T cached ones and see every key up to their own.
  expect_matches_definition({"T = 5 after 128 cached positions", 2, 4, 2, 5, 133, 16});
  expect_matches_definition({"one new token after 199", 1, 4, 2, 1, 200, 16});
  expect_matches_definition({"a prompt of 70 after 60", 1, 4, 2, 70, 130, 16});
}

TEST(FlashAttentionTest, ChunksOfARowAtExplicitPositions) {
  // Context parallelism's zig-zag: a device holds an early and a late chunk of the queries (and of the keys).
  AttentionCase small{"queries {0..3, 12..15} against keys 0..15", 1, 4, 2, 8, 16, 16};
  small.mask = {position_ranges({{0, 4}, {12, 16}}), position_ranges({{0, 16}}), {}, {}};
  expect_matches_definition(small);
  AttentionCase zigzag{"queries {0..69, 210..279} against keys 0..279", 1, 4, 2, 140, 280, 16};
  zigzag.mask = {position_ranges({{0, 70}, {210, 280}}), position_ranges({{0, 280}}), {}, {}};
  expect_matches_definition(zigzag);
  AttentionCase both{"queries and keys both {0..69, 210..279}", 2, 4, 2, 140, 140, 16};
  both.mask = {position_ranges({{0, 70}, {210, 280}}), position_ranges({{0, 70}, {210, 280}}), {}, {}};
  expect_matches_definition(both);
  AttentionCase late_keys{"queries 0..99 against the keys of a later chunk 100..149 and 0..9", 1, 2, 1, 100, 60, 16};
  late_keys.mask = {position_ranges({{0, 100}}), position_ranges({{100, 150}, {0, 10}}), {}, {}};
  expect_matches_definition(late_keys);
  AttentionCase shuffled{"shuffled positions, one per row", 2, 4, 2, 90, 90, 16};
  auto gen = at::detail::createCPUGenerator(5);
  shuffled.mask = {torch::stack({torch::randperm(90, gen), torch::randperm(90, gen)}),
                   torch::stack({torch::randperm(90, gen), torch::randperm(90, gen)}), {}, {}};
  expect_matches_definition(shuffled);
}

TEST(FlashAttentionTest, DocumentIdsKeepEachQueryInItsDocument) {
  AttentionCase packed{"documents of 50, 70, 10 tokens in row 0, one of 130 in row 1 (int32)", 2, 4, 2, 130, 130, 16};
  const torch::Tensor row0 = torch::cat({torch::full({50}, 0), torch::full({70}, 1), torch::full({10}, 2)});
  const torch::Tensor documents = torch::stack({row0, torch::full({130}, 7)}).to(torch::kInt);
  packed.mask = AttentionMask::causal(0, 130, 130);
  packed.mask.query_documents = packed.mask.key_documents = documents;
  expect_matches_definition(packed);
  AttentionCase decode{"queries after cached keys, int64 ids", 1, 4, 2, 3, 70, 16};
  decode.mask = AttentionMask::causal(67, 3, 70);
  decode.mask.query_documents = torch::tensor({{3, 4, 4}}, torch::kLong);
  decode.mask.key_documents = torch::cat({torch::full({68}, 3), torch::full({2}, 4)}).to(torch::kLong).unsqueeze(0);
  expect_matches_definition(decode);
}

TEST(FlashAttentionTest, AQueryThatSeesNoKeyGetsZerosAndNoNaN) {
  // Query 1 (document 9) has no key of its document; query 0 sits before every key.
  AttentionCase c{"queries that see nothing", 1, 4, 2, 70, 70, 16};
  c.mask = AttentionMask::causal(0, 70, 70);
  c.mask.query_positions = c.mask.query_positions.clone();
  c.mask.query_positions[0].fill_(-1);
  c.mask.query_documents = torch::zeros({1, 70}, torch::kLong);
  c.mask.query_documents[0][1].fill_(9);
  c.mask.key_documents = torch::zeros({1, 70}, torch::kLong);
  expect_matches_definition(c);
  const AttentionInputs in = attention_inputs(c, 3);
  const AttentionValues got = attention_kernel(c, in);
  for (int64_t t : {0, 1}) {
    EXPECT_EQ(got.out_BHTE.select(2, t).abs().max().item<float>(), 0.0f) << "query " << t;
    EXPECT_EQ(got.grad_q_BHTE.select(2, t).abs().max().item<float>(), 0.0f) << "query " << t;
    EXPECT_TRUE(got.lse_BHT.select(2, t).isneginf().all().item<bool>()) << "query " << t;
  }
  // Keys no query sees: zero gradients.
  AttentionCase none{"no query sees any key", 1, 2, 1, 10, 20, 16};
  none.mask = {torch::arange(10, torch::kLong), torch::arange(100, 120, torch::kLong), {}, {}};
  expect_matches_definition(none);
  const AttentionValues nothing = attention_kernel(none, attention_inputs(none, 4));
  EXPECT_EQ(nothing.out_BHTE.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(nothing.grad_k_BKSE.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(nothing.grad_v_BKSE.abs().max().item<float>(), 0.0f);
}

TEST(FlashAttentionTest, SeveralThreadsGiveTheSameResults) {
  runtime::ThreadCountGuard threads(3);
  expect_matches_definition({"3 threads, B = 1, K = 1 (key ranges split for the threads)", 1, 3, 1, 300, 300, 16});
  expect_matches_definition({"3 threads, B = 2, K = 2", 2, 4, 2, 200, 200, 16});
}

TEST(FlashAttentionTest, Bf16InputsGiveBf16ResultsWithinBf16Tolerance) {
  AttentionCase c{"bf16, GQA, T = S = 100", 2, 4, 2, 100, 100, 32};
  c.dtype = torch::kBFloat16;
  expect_matches_definition(c);
  AttentionCase decode{"bf16, queries after cached keys", 1, 4, 2, 7, 90, 16};
  decode.dtype = torch::kBFloat16;
  expect_matches_definition(decode);
}

TEST(FlashAttentionTest, WithoutGradModeTheOutputIsTheSame) {
  const AttentionCase c{"no grad", 1, 4, 2, 80, 80, 16};
  const AttentionInputs in = attention_inputs(c, 6);
  const AttentionValues with_grad = attention_kernel(c, in);
  torch::NoGradGuard no_grad;
  const AttentionResult plain = flash_attention(in.q_BHTE, in.k_BKSE, in.v_BKSE, mask_of(c));
  EXPECT_FALSE(plain.out_BHTE.requires_grad());
  EXPECT_TRUE(torch::equal(plain.out_BHTE, with_grad.out_BHTE));
  EXPECT_TRUE(torch::equal(plain.lse_BHT, with_grad.lse_BHT));
}

TEST(FlashAttentionTest, RefusesMismatchedShapesAndDtypes) {
  const torch::Tensor q = torch::randn({1, 3, 4, 8}), kv = torch::randn({1, 2, 4, 8});
  EXPECT_ANY_THROW(flash_attention(q, kv, kv, AttentionMask::causal(0, 4, 4)));  // 3 heads over 2 K/V heads
  const torch::Tensor q4 = torch::randn({1, 4, 4, 8});
  EXPECT_ANY_THROW(flash_attention(q4, kv.to(torch::kBFloat16), kv, AttentionMask::causal(0, 4, 4)));
  EXPECT_ANY_THROW(flash_attention(q4, kv, kv, AttentionMask::causal(0, 5, 4)));  // 5 query positions for 4 queries
  AttentionMask one_side = AttentionMask::causal(0, 4, 4);
  one_side.query_documents = torch::zeros({1, 4}, torch::kLong);
  EXPECT_ANY_THROW(flash_attention(q4, kv, kv, one_side));
}

}  // namespace
}  // namespace meshtrain::model
