// llama_test.cpp — the Llama model's configs (published parameter counts), structure (HF names, swappable
// projections), properties (causality, GQA == MHA with repeated heads, bf16 close to fp32), KV-cached decoding against
// the full forward, greedy and seeded generation, and a short training run.
// Numerical parity with an independent reference is tests/python/test_model_reference.py.
#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"
#include "meshtrain/model/generation.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/settings/settings.hpp"

#include "bf16_path.hpp"

#include <gtest/gtest.h>

namespace meshtrain::model {
namespace {

// The model of the shipped defaults with `overrides` (a model=<name> group, model.* keys) on top.
LlamaConfig model_config(const std::vector<std::string>& overrides) {
  return settings::Settings::from_config(config::Config::load(config::default_config_dir(), overrides)).model;
}

LlamaConfig model_config(const std::string& name) { return model_config(std::vector<std::string>{"model=" + name}); }

LlamaConfig small_config(int64_t heads, int64_t kv_heads, bool tied = false) {
  LlamaConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 8;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  return c;
}

torch::Tensor random_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  return torch::randint(vocab, {B, T}, at::detail::createCPUGenerator(seed), torch::kInt64);
}

TEST(LlamaConfigTest, PublishedParameterCountsWithoutAllocating) {
  EXPECT_EQ(model_config("llama-3-8b").parameter_count(), 8'030'261'248);
  EXPECT_EQ(model_config("llama-3.1-8b").parameter_count(), 8'030'261'248);
  EXPECT_EQ(model_config("llama-3.1-70b").parameter_count(), 70'553'706'496);
  EXPECT_EQ(model_config("llama-3.1-405b").parameter_count(), 405'853'388'800);
  EXPECT_EQ(model_config("llama-3.2-1b").parameter_count(), 1'235'814'400);
  EXPECT_EQ(model_config("llama-3.2-3b").parameter_count(), 3'212'749'824);
  const int64_t m100 = model_config("llama-100m").parameter_count();
  EXPECT_GT(m100, 95'000'000);
  EXPECT_LT(m100, 105'000'000);
}

TEST(LlamaConfigTest, Llama31ConfigsCarryTheRopeScaling) {
  LlamaConfig c = model_config("llama-3.1-8b");
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(model_config("llama-3-8b").rope_scaling.has_value());
  const LlamaConfig small = model_config("llama-3.2-3b");
  ASSERT_TRUE(small.rope_scaling.has_value());
  EXPECT_EQ(small.rope_scaling->factor, 32.0);
  EXPECT_TRUE(small.tie_word_embeddings);
  EXPECT_EQ(small.head_dim, 128);
}

TEST(LlamaConfigTest, HfJsonRoundTripAndOverrides) {
  LlamaConfig c = model_config("llama-3.1-70b");
  EXPECT_EQ(LlamaConfig::from_hf_json(c.to_hf_json("bfloat16"), "test"), c);
  LlamaConfig tiny = model_config({"model=llama-tiny", "model.num_hidden_layers=3", "model.tie_word_embeddings=true"});
  EXPECT_EQ(tiny.num_hidden_layers, 3);
  EXPECT_TRUE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.head_dim, tiny.hidden_size / tiny.num_attention_heads);
}

TEST(LlamaConfigTest, InvalidShapesNameTheField) {
  LlamaConfig c = small_config(4, 3);
  try {
    c.validate("test config");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads"), std::string::npos) << e.what();
  }
  nlohmann::json j = small_config(4, 2).to_hf_json("float32");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THROW(LlamaConfig::from_hf_json(j, "config.json"), UserError);
}

TEST(LlamaConfigTest, TrainingFlopsPerToken) {
  LlamaConfig c = model_config("llama-3-8b");
  // 6 x (parameters - embedding table - norms) + 12 x layers x heads x head_dim x (seq + 1) / 2 (causal)
  const double norms = (2.0 * 32 + 1) * 4096;
  const double expected = 6.0 * (8'030'261'248.0 - 128256.0 * 4096 - norms) + 6.0 * 32 * 32 * 128 * 4097;
  EXPECT_DOUBLE_EQ(c.training_flops_per_token(4096), expected);
}

TEST(LlamaModelTest, ParametersHaveHuggingFaceNames) {
  LlamaForCausalLM model(small_config(4, 2));
  auto params = model.named_parameters();
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
        "lm_head.weight"})
    EXPECT_NE(params.find(name), nullptr) << name;
  int64_t total = 0;
  for (const auto& p : params) total += p.value().numel();
  EXPECT_EQ(total, model.config().parameter_count());
  EXPECT_EQ(params["model.layers.0.self_attn.k_proj.weight"].sizes(), (std::vector<int64_t>{16, 32}));

  LlamaForCausalLM tied(small_config(4, 2, /*tied=*/true));
  EXPECT_EQ(tied.named_parameters().find("lm_head.weight"), nullptr);
  EXPECT_EQ(tied.linear_names().size(), 2u * 7u);
}

TEST(LlamaModelTest, CausalAndBatchRowsIndependent) {
  LlamaForCausalLM model(small_config(4, 2));
  initialize_parameters(model, 1);
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = random_tokens(2, 12, 50, 2);
  torch::Tensor logits = model.forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 12, 50}));
  torch::Tensor changed = tokens.clone();
  changed.index_put_({0, 8}, (tokens.index({0, 8}) + 1) % 50);
  torch::Tensor logits2 = model.forward(changed);
  EXPECT_TRUE(torch::equal(logits.index({0, torch::indexing::Slice(0, 8)}),
                           logits2.index({0, torch::indexing::Slice(0, 8)})));
  EXPECT_FALSE(torch::allclose(logits.index({0, 8}), logits2.index({0, 8})));
  EXPECT_TRUE(torch::allclose(logits.index({1}), model.forward(tokens.narrow(0, 1, 1))[0], 1e-5, 1e-5));
}

TEST(LlamaModelTest, DocumentsPackedInARowAreEachRunAlone) {
  LlamaForCausalLM model(small_config(4, 2));
  initialize_parameters(model, 1);
  // Row 0 packs documents of 5, 80 and 15 tokens (the second spans two blocks of queries), row 1 is one document.
  const int64_t T = 100;
  const torch::Tensor tokens_BT = random_tokens(2, T, 50, 3), targets_BT = random_tokens(2, T, 50, 4);
  torch::Tensor documents_BT = torch::zeros({2, T}, torch::kInt64);
  documents_BT[0].narrow(0, 5, 80).fill_(1);
  documents_BT[0].narrow(0, 85, 15).fill_(2);
  EXPECT_TRUE(torch::equal(positions_in_documents(documents_BT)[0].narrow(0, 3, 4),
                           torch::tensor({3, 4, 0, 1}, torch::kInt64)));
  const std::vector<std::pair<int64_t, int64_t>> row0_documents = {{0, 5}, {5, 80}, {85, 15}};
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor packed_BTD = model.hidden_states(tokens_BT, documents_BT);
    for (const auto& [begin, length] : row0_documents) {
      const torch::Tensor alone_1TD = model.hidden_states(tokens_BT[0].narrow(0, begin, length).unsqueeze(0));
      EXPECT_TRUE(torch::allclose(packed_BTD[0].narrow(0, begin, length), alone_1TD[0], 1e-5, 1e-5)) << begin;
    }
    EXPECT_TRUE(torch::allclose(packed_BTD[1], model.hidden_states(tokens_BT.narrow(0, 1, 1))[0], 1e-5, 1e-5));
    // Without the documents, the later ones see the earlier ones.
    EXPECT_FALSE(torch::allclose(model.hidden_states(tokens_BT)[0].narrow(0, 5, 80), packed_BTD[0].narrow(0, 5, 80),
                                 1e-3, 1e-3));
  }
  // The loss and every gradient are those of the documents run one by one (each token keeps its target).
  auto gradients_of = [&](const std::function<torch::Tensor()>& loss_fn, double* loss) {
    for (torch::Tensor& p : model.parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor l = loss_fn();
    l.backward();
    *loss = l.item<double>();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : model.parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  double packed_loss = 0, alone_loss = 0;
  const std::vector<torch::Tensor> packed =
      gradients_of([&] { return model.loss_sum(tokens_BT, targets_BT, documents_BT); }, &packed_loss);
  const std::vector<torch::Tensor> alone = gradients_of(
      [&] {
        torch::Tensor sum = model.loss_sum(tokens_BT.narrow(0, 1, 1), targets_BT.narrow(0, 1, 1));
        for (const auto& [begin, length] : row0_documents)
          sum = sum + model.loss_sum(tokens_BT[0].narrow(0, begin, length).unsqueeze(0),
                                     targets_BT[0].narrow(0, begin, length).unsqueeze(0));
        return sum;
      },
      &alone_loss);
  EXPECT_NEAR(packed_loss, alone_loss, 1e-4 * alone_loss);
  for (size_t i = 0; i < packed.size(); ++i)
    EXPECT_TRUE(torch::allclose(packed[i], alone[i], 1e-4, 1e-6)) << "parameter " << i;
}

TEST(LlamaModelTest, KvCachedDecodingGivesTheFullForwardsLogits) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    LlamaForCausalLM model(small_config(4, 2));
    initialize_parameters(model, 5);
    if (bf16) model.set_compute_dtype(torch::kBFloat16);
    torch::NoGradGuard no_grad;
    const torch::Tensor tokens_BT = random_tokens(2, 12, 50, 3);
    const torch::Tensor full_BTV = model.forward(tokens_BT);
    // A prompt of 5 positions, then one position at a time, then the last 3 at once.
    KvCache cache = model.new_kv_cache(2, 12);
    std::vector<std::pair<int64_t, int64_t>> pieces = {{0, 5}, {5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 3}};
    for (const auto& [first, count] : pieces) {
      const torch::Tensor logits_BV = model.next_token_logits(tokens_BT.narrow(1, first, count), cache);
      EXPECT_EQ(cache.length, first + count);
      const torch::Tensor want_BV = full_BTV.select(1, first + count - 1);
      EXPECT_TRUE(torch::allclose(logits_BV, want_BV, bf16 ? 2e-2 : 1e-5, bf16 ? 2e-2 : 1e-5))
          << "positions " << first << ".." << first + count - 1 << ": max diff "
          << (logits_BV - want_BV).abs().max().item<double>();
    }
    EXPECT_THROW(model.next_token_logits(tokens_BT.narrow(1, 0, 1), cache), UserError);  // the cache is full
  }
}

TEST(LlamaModelTest, GreedyGenerationIsTheArgmaxOfTheFullForwardAndSamplingFollowsTheSeed) {
  LlamaForCausalLM model(small_config(4, 2));
  initialize_parameters(model, 9);
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> prompt = {3, 17, 42, 8};
  const std::vector<int64_t> greedy = generate(model, prompt, 10, {});
  ASSERT_EQ(greedy.size(), 10u);
  std::vector<int64_t> sequence = prompt;
  for (int64_t want : greedy) {  // without a cache: the whole sequence each time
    const torch::Tensor logits_TV = model.forward(torch::tensor(sequence, torch::kInt64).view({1, -1}))[0];
    EXPECT_EQ(logits_TV[-1].argmax().item<int64_t>(), want) << "after " << sequence.size() << " tokens";
    sequence.push_back(want);
  }
  SamplingOptions sampled;
  sampled.temperature = 1.5;
  sampled.seed = 7;
  const std::vector<int64_t> first = generate(model, prompt, 20, sampled);
  EXPECT_EQ(generate(model, prompt, 20, sampled), first);
  sampled.seed = 8;
  EXPECT_NE(generate(model, prompt, 20, sampled), first);
  sampled.top_k = 1;  // one candidate: greedy
  EXPECT_EQ(generate(model, prompt, 10, sampled), greedy);
  sampled.top_k = 0;
  sampled.top_p = 1e-9;  // the most likely token alone reaches it
  EXPECT_EQ(generate(model, prompt, 10, sampled), greedy);
  sampled.top_p = 0;
  EXPECT_THROW(generate(model, prompt, 1, sampled), UserError);
}

TEST(LlamaModelTest, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  LlamaForCausalLM gqa(small_config(4, 2)), mha(small_config(4, 4));
  initialize_parameters(gqa, 3);
  torch::NoGradGuard no_grad;
  auto g = gqa.named_parameters();
  for (auto& p : mha.named_parameters()) {
    torch::Tensor src = g[p.key()];
    const bool kv = p.key().find("k_proj") != std::string::npos || p.key().find("v_proj") != std::string::npos;
    // Query heads 0,1 read kv head 0 and 2,3 read kv head 1: repeat each kv head's rows twice.
    p.value().copy_(kv ? src.view({2, 1, 8, 32}).expand({2, 2, 8, 32}).reshape({32, 32}) : src);
  }
  torch::Tensor tokens = random_tokens(2, 10, 50, 4);
  EXPECT_TRUE(torch::allclose(gqa.forward(tokens), mha.forward(tokens), 1e-5, 1e-5));
}

// The MLP keeps only silu's and the product's inputs for backward (llama.cpp, SwiGlu): its output and every gradient
// are the same bits as autograd's silu(gate) * up.
TEST(LlamaModelTest, MlpGradientsAreThoseOfAutogradsSiluTimesUp) {
  LlamaConfig config = small_config(4, 2);
  config.intermediate_size = 2048;  // tensors of the vectorized kernels' sizes, with a remainder of none
  LlamaMLP mlp(config);
  torch::manual_seed(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : mlp.parameters()) p.normal_(0, 0.2);
  }
  const torch::Tensor x_BTD = torch::randn({2, 7, 32}).requires_grad_(true);
  const torch::Tensor grad_BTD = torch::randn({2, 7, 32});
  torch::Tensor y_BTD = mlp.forward(x_BTD);
  y_BTD.backward(grad_BTD);
  const torch::Tensor x_grad = x_BTD.grad().clone();
  std::vector<torch::Tensor> param_grads;
  for (auto& p : mlp.parameters()) param_grads.push_back(p.grad().clone());

  for (auto& p : mlp.parameters()) p.mutable_grad().reset();
  x_BTD.mutable_grad().reset();
  const torch::Tensor reference_BTD = mlp.down_proj->forward(torch::silu(mlp.gate_proj->forward(x_BTD)) *
                                                             mlp.up_proj->forward(x_BTD));
  reference_BTD.backward(grad_BTD);
  EXPECT_TRUE(torch::equal(y_BTD, reference_BTD));
  EXPECT_TRUE(torch::equal(x_grad, x_BTD.grad()));
  size_t i = 0;
  for (auto& p : mlp.parameters()) EXPECT_TRUE(torch::equal(param_grads[i++], p.grad()));
}

// RMSNorm keeps its input and inverse RMS for backward and computes the normed values again (llama.cpp,
// WeightTimesNormed): its output and gradients, with its input also used elsewhere (a residual), are the same bits as
// autograd's over the plain expression.
TEST(LlamaModelTest, RmsNormGradientsAreThoseOfAutogradsPlainExpression) {
  RMSNorm norm(768, 1e-5);
  torch::manual_seed(9);
  {
    torch::NoGradGuard no_grad;
    norm.weight.normal_(1, 0.1);
  }
  const torch::Tensor x_BTD = torch::randn({2, 9, 768}).requires_grad_(true);
  const torch::Tensor grad_BTD = torch::randn({2, 9, 768}), residual_grad_BTD = torch::randn({2, 9, 768});
  auto run = [&](const torch::Tensor& y_BTD) {
    ((y_BTD * grad_BTD).sum() + (x_BTD * residual_grad_BTD).sum()).backward();
    std::pair<torch::Tensor, torch::Tensor> grads{x_BTD.grad().clone(), norm.weight.grad().clone()};
    x_BTD.mutable_grad().reset();
    norm.weight.mutable_grad().reset();
    return grads;
  };
  const torch::Tensor y_BTD = norm.forward(x_BTD);
  const auto [x_grad, weight_grad] = run(y_BTD);
  const torch::Tensor inverse_rms_BT1 = torch::rsqrt(x_BTD.pow(2).mean(-1, /*keepdim=*/true) + 1e-5);
  const torch::Tensor reference_BTD = norm.weight * (x_BTD * inverse_rms_BT1);
  const auto [reference_x_grad, reference_weight_grad] = run(reference_BTD);
  EXPECT_TRUE(torch::equal(y_BTD, reference_BTD));
  EXPECT_TRUE(torch::equal(x_grad, reference_x_grad));
  EXPECT_TRUE(torch::equal(weight_grad, reference_weight_grad));
}

// A column-parallel q_proj done by hand: two halves of the rows, outputs concatenated.
class SplitLinear : public Linear {
 public:
  explicit SplitLinear(const torch::Tensor& weight) {
    top = register_parameter("top", weight.narrow(0, 0, weight.size(0) / 2).clone());
    bottom = register_parameter("bottom", weight.narrow(0, weight.size(0) / 2, weight.size(0) / 2).clone());
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    ++calls;
    return torch::cat({torch::matmul(x, top.t()), torch::matmul(x, bottom.t())}, -1);
  }
  torch::Tensor top, bottom;
  int calls = 0;
};

TEST(LlamaModelTest, ProjectionsCanBeReplacedFromOutside) {
  LlamaForCausalLM model(small_config(4, 2));
  initialize_parameters(model, 5);
  torch::Tensor tokens = random_tokens(1, 9, 50, 6);
  torch::Tensor before = model.forward(tokens).detach();
  const std::string name = "model.layers.1.self_attn.q_proj";
  auto dense = std::dynamic_pointer_cast<DenseLinear>(model.linear(name));
  ASSERT_TRUE(dense);
  auto split = std::make_shared<SplitLinear>(dense->weight.detach());
  model.replace_linear(name, split);
  EXPECT_EQ(model.linear(name), split);
  auto params = model.named_parameters();
  EXPECT_EQ(params.find(name + ".weight"), nullptr);
  EXPECT_NE(params.find(name + ".top"), nullptr);
  EXPECT_TRUE(torch::allclose(model.forward(tokens), before, 1e-5, 1e-5));
  EXPECT_EQ(split->calls, 1);
  EXPECT_THROW(model.replace_linear("model.layers.1.self_attn.x_proj", split), Error);
  EXPECT_THROW(model.replace_linear("model.layers.7.self_attn.q_proj", split), Error);
}

TEST(LlamaModelTest, LayerRunnerWrapsEveryLayer) {
  LlamaForCausalLM model(small_config(4, 2));
  initialize_parameters(model, 7);
  torch::Tensor tokens = random_tokens(1, 6, 50, 8);
  torch::Tensor before = model.forward(tokens).detach();
  std::vector<int64_t> seen;
  model.set_layer_runner([&](int64_t i, LlamaDecoderLayer& layer, const torch::Tensor& x, const RopeTables& rope) {
    seen.push_back(i);
    return layer.forward(x, rope);
  });
  EXPECT_TRUE(torch::equal(model.forward(tokens), before));
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1}));
}

TEST(LlamaModelTest, Bf16ComputeIsCloseToFp32AndGradientsStayFp32) {
  for (Bf16Matmul path : {Bf16Matmul::native, Bf16Matmul::fp32_gemm}) {  // both ways of running bf16 matmuls
    SCOPED_TRACE(bf16_matmul_name(path));
    const testing::Bf16PathScope scope(path);
    LlamaForCausalLM model(small_config(4, 2));
    initialize_parameters(model, 9);
    torch::Tensor tokens = random_tokens(2, 16, 50, 10);
    torch::Tensor inputs = tokens.narrow(1, 0, 15), targets = tokens.narrow(1, 1, 15);
    const double fp32_loss = token_cross_entropy(model.forward(inputs), targets).item<double>();
    model.set_compute_dtype(torch::kBFloat16);
    torch::Tensor loss = token_cross_entropy(model.forward(inputs), targets);
    EXPECT_NEAR(loss.item<double>(), fp32_loss, 0.02 * fp32_loss);
    loss.backward();
    for (const auto& p : model.named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_EQ(p.value().grad().scalar_type(), torch::kFloat32) << p.key();
    }
  }
}

TEST(LlamaModelTest, InitializationIsSeededAndHuggingFaceLike) {
  LlamaForCausalLM a(small_config(4, 2)), b(small_config(4, 2));
  initialize_parameters(a, 11);
  initialize_parameters(b, 11);
  auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters()) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  EXPECT_TRUE(torch::equal(a.named_parameters()["model.norm.weight"], torch::ones({32})));
  const double std = a.named_parameters()["lm_head.weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.002);
}

TEST(LlamaModelTest, TinyModelLearnsARepeatingSequence) {
  at::set_num_threads(2);
  LlamaConfig c = model_config("llama-tiny");
  LlamaForCausalLM model(c);
  initialize_parameters(model, 12);
  torch::Tensor tokens = torch::arange(33, torch::kInt64).remainder(7).mul(13).view({1, 33}).repeat({4, 1});
  torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(3e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    torch::Tensor loss = token_cross_entropy(model.forward(tokens.narrow(1, 0, 32)), tokens.narrow(1, 1, 32));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  // An untrained model is close to uniform: logits of std 0.02 x sqrt(64) = 0.16 add ~0.013 to the log-sum-exp,
  // and the 7 distinct targets' mean logit is off by ~0.16 / sqrt(7) = 0.06 either way (0.2: three of those).
  EXPECT_NEAR(first, std::log(256.0), 0.2);
  EXPECT_LT(last, 0.5);
}

TEST(LlamaModelTest, RejectsBadInputs) {
  LlamaForCausalLM model(small_config(4, 2));
  EXPECT_THROW(model.forward(torch::zeros({4}, torch::kInt64)), UserError);
  EXPECT_THROW(model.forward(torch::zeros({1, 4}, torch::kInt32)), UserError);
  EXPECT_THROW(model.set_compute_dtype(torch::kFloat16), UserError);
}

TEST(ParameterInitTest, AnySliceEqualsTheSameElementsOfTheWholeParameter) {
  const LlamaConfig config = model_config("llama-tiny");
  const std::vector<int64_t> shape{64, 48};
  const at::Tensor whole = initial_values(config, 5, ParameterSlice::whole("model.layers.0.mlp.up_proj.weight", shape));
  ASSERT_EQ(whole.numel(), 64 * 48);
  EXPECT_NEAR(whole.mean().item<double>(), 0.0, 0.002);
  EXPECT_NEAR(whole.std().item<double>(), config.initializer_range, 0.001);
  // A block of columns 16..32 (a row-parallel rank), elements 5..700 of it.
  ParameterSlice block = ParameterSlice::whole("model.layers.0.mlp.up_proj.weight", shape);
  block.col_begin = 16;
  block.cols = 16;
  const ParameterSlice slice = block.range(5, 700);
  const at::Tensor expected = whole.view({64, 48}).narrow(1, 16, 16).reshape({-1}).narrow(0, 5, 695);
  EXPECT_TRUE(at::equal(initial_values(config, 5, slice), expected));
  // Another seed or another name gives other values; 1-D parameters (RMSNorm weights) are ones.
  EXPECT_FALSE(at::equal(initial_values(config, 6, slice), expected));
  EXPECT_FALSE(at::equal(initial_values(config, 5, ParameterSlice{slice}.range(5, 700)), initial_values(config, 5, [&] {
    ParameterSlice other = slice;
    other.name = "model.layers.1.mlp.up_proj.weight";
    return other;
  }())));
  EXPECT_TRUE(at::equal(initial_values(config, 5, ParameterSlice::whole("model.norm.weight", {64})), at::ones({64})));
}

// The initial values are part of every run's results (losses, checkpoints): their bits are pinned, here by the
// CRC-32C of llama-100m's embedding table (24.6 M values) and of a tensor-parallel block of a projection, as the
// scalar initializer (glibc's log and cos) produced them at 1be5681.
TEST(ParameterInitTest, ValuesAreBitwiseThoseOfTheScalarInitializer) {
  const LlamaConfig config = model_config("llama-100m");
  const auto crc_of = [](const at::Tensor& values) {
    return crc32c(values.data_ptr<float>(), static_cast<size_t>(values.numel()) * sizeof(float));
  };
  EXPECT_EQ(crc_of(initial_values(config, 0, ParameterSlice::whole("model.embed_tokens.weight", {32000, 768}))),
            0xaeea4eb4u);
  ParameterSlice block = ParameterSlice::whole("model.layers.3.mlp.down_proj.weight", {768, 2048});
  block.col_begin = 1021;  // columns 1021..2045, elements 3..700003 of the block: runs that start and end mid-row
  block.cols = 1024;
  EXPECT_EQ(crc_of(initial_values(config, 1234, block.range(3, 700003))), 0x2aa31309u);
}

}  // namespace
}  // namespace meshtrain::model
