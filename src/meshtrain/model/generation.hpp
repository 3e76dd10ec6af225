// generation.hpp — text generation from a LlamaForCausalLM: the prompt runs once through the KV cache, then each new
// token costs one position (LlamaForCausalLM::next_token_logits).
//
// The next token is the argmax of the logits when the temperature is 0 (greedy); otherwise it is drawn from
// softmax(logits / temperature), kept to the top_k most likely tokens (0: all) and then to the smallest set of the
// most likely whose probability reaches top_p (1: all), renormalized. The draw for new token i uses the uniform
// number splitmix64(seed, i): the same seed gives the same tokens on any machine and thread count, whatever else
// the process draws.
//
// Shape suffixes: V vocab.
#pragma once

#include "meshtrain/model/llama.hpp"

#include <cstdint>
#include <vector>

namespace meshtrain::model {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: no limit
  double top_p = 1.0;      // 1: no limit
  uint64_t seed = 0;

  // UserError naming the option (--temperature, --top-k, --top-p) for a value out of range.
  void validate() const;
};

// The token chosen from fp32 logits [V] for new token number `index` (0-based).
int64_t choose_token(const torch::Tensor& logits_V, const SamplingOptions& options, int64_t index);

// The `max_new_tokens` tokens after `prompt` (at least one token). The prompt plus the new tokens must fit
// max_position_embeddings. No gradients are recorded.
std::vector<int64_t> generate(LlamaForCausalLM& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const SamplingOptions& options);

}  // namespace meshtrain::model
