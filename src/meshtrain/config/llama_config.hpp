// llama_config.hpp — the Llama-3 architecture hyperparameters (Hugging Face LlamaConfig field names), read from the
// run's settings (`model.*`, configs/model/<name>.yaml: settings/settings.hpp) or from a checkpoint's config.json,
// and the parameter and FLOP counts derived from them without allocating anything. With num_local_experts > 0 it is a
// Mixtral (Hugging Face MixtralConfig, model_type "mixtral"): every MLP is a sparse mixture of that many SwiGLU
// experts (model/moe.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace meshtrain::config {

// Llama-3.1 frequency scaling of the rotary embedding (HF `rope_scaling` with `rope_type: llama3`).
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // 0 in files means hidden_size / num_attention_heads; always resolved here
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  // Mixture of experts (Mixtral): 0 experts is a dense Llama. Each token goes to num_experts_per_tok experts; the
  // load-balancing loss times router_aux_loss_coef is added to the training objective.
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 2;
  double router_aux_loss_coef = 0.02;

  bool is_moe() const { return num_local_experts > 0; }

  // Reads a Hugging Face config.json object (unknown keys are ignored; unsupported features are errors naming the
  // key). `source` names the file in messages.
  static LlamaConfig from_hf_json(const nlohmann::json& json, const std::string& source);
  // The config.json object Hugging Face's LlamaForCausalLM reads; `torch_dtype` is "float32" or "bfloat16".
  nlohmann::json to_hf_json(const std::string& torch_dtype) const;

  // Throws UserError naming the field when the shapes do not fit together (heads divide, GQA groups divide...).
  void validate(const std::string& source) const;

  // Every parameter, counted from the shapes (tied embeddings counted once), as the published counts do.
  int64_t parameter_count() const;
  // The parameters one token passes through: every expert counts num_experts_per_tok times of num_local_experts.
  int64_t active_parameter_count() const;
  // The parameters of the token embedding table (excluded from the matmul FLOP count).
  int64_t embedding_parameter_count() const;
  // Training FLOPs per token for sequences of `seq_len` tokens (forward + backward = 3x forward): 6 x the active
  // matmul parameters (all but the embedding table and the norms; k of E experts) plus, for the attention scores and
  // values, 12 x layers x heads x head_dim x the keys a token sees under the causal mask, (seq_len + 1) / 2 on
  // average (the FLOPs causal attention needs; PaLM's count without the causal discount is twice that).
  double training_flops_per_token(int64_t seq_len) const;
};

bool operator==(const LlamaConfig& a, const LlamaConfig& b);

}  // namespace meshtrain::config
