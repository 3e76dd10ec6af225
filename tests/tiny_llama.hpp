// tiny_llama.hpp — the small Llama (and Mixtral) the parallel and checkpoint tests build on simulated meshes: 2 layers
// (more for a pipeline's stages), hidden 32, 4 query heads over 2 K/V heads; shapes that every test layout (fsdp,
// tensor, expert up to 4) divides.
#pragma once

#include "meshtrain/config/llama_config.hpp"

namespace meshtrain::testing {

inline config::LlamaConfig tiny_llama_config(bool tied = false, bool moe = false, int64_t vocab_size = 40,
                                             int64_t layers = 2) {
  config::LlamaConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 10000;
  c.tie_word_embeddings = tied;
  if (moe) {  // a large coefficient, so that a wrong load-balancing gradient shows in every router's gradient
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    c.router_aux_loss_coef = 0.5;
  }
  return c;
}

}  // namespace meshtrain::testing
