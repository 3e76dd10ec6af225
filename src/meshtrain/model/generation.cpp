// generation.cpp — greedy and seeded top-k / top-p sampling over the KV-cached decoder.
#include "meshtrain/model/generation.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/mix.hpp"

namespace meshtrain::model {

void SamplingOptions::validate() const {
  MT_USER_CHECK(temperature >= 0, "--temperature must be 0 (greedy) or more, got {}", temperature);
  MT_USER_CHECK(top_k >= 0, "--top-k must be 0 (no limit) or more, got {}", top_k);
  MT_USER_CHECK(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1], got {}", top_p);
}

int64_t choose_token(const torch::Tensor& logits_V, const SamplingOptions& options, int64_t index) {
  if (options.temperature == 0) return logits_V.argmax().item<int64_t>();
  const torch::Tensor probs_V = torch::softmax(logits_V.to(torch::kFloat64) / options.temperature, 0);
  auto [sorted_V, order_V] = probs_V.sort(/*dim=*/0, /*descending=*/true);
  int64_t keep = sorted_V.size(0);
  if (options.top_k > 0) keep = std::min(keep, options.top_k);
  if (options.top_p < 1) {
    // The smallest prefix whose probability reaches top_p: the tokens before the first cumulative sum >= top_p, and
    // that one.
    const torch::Tensor reached = sorted_V.narrow(0, 0, keep).cumsum(0).ge(options.top_p);
    if (reached.any().item<bool>()) keep = std::min(keep, reached.to(torch::kInt64).argmax().item<int64_t>() + 1);
  }
  const torch::Tensor kept = sorted_V.narrow(0, 0, keep).contiguous();
  const double* p = kept.data_ptr<double>();
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  // A uniform number in [0, total) from (seed, index): 53 random bits.
  const uint64_t bits = splitmix64(options.seed ^ splitmix64(static_cast<uint64_t>(index)));
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += p[i];
    if (u < cumulative) return order_V[i].item<int64_t>();
  }
  return order_V[keep - 1].item<int64_t>();
}

std::vector<int64_t> generate(LlamaForCausalLM& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const SamplingOptions& options) {
  MT_USER_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  MT_USER_CHECK(max_new_tokens >= 1, "--max-new-tokens must be at least 1, got {}", max_new_tokens);
  options.validate();
  const int64_t vocab = model.config().vocab_size;
  for (int64_t id : prompt)
    MT_USER_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the model's vocabulary of {}", id, vocab);
  const torch::NoGradGuard no_grad;
  KvCache cache = model.new_kv_cache(1, static_cast<int64_t>(prompt.size()) + max_new_tokens);
  torch::Tensor logits_BV = model.next_token_logits(torch::tensor(prompt, torch::kInt64).view({1, -1}), cache);
  std::vector<int64_t> generated;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    generated.push_back(choose_token(logits_BV[0], options, i));
    if (i + 1 < max_new_tokens)
      logits_BV = model.next_token_logits(torch::tensor({generated.back()}, torch::kInt64).view({1, 1}), cache);
  }
  return generated;
}

}  // namespace meshtrain::model
