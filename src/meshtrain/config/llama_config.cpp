// llama_config.cpp — LlamaConfig from/to Hugging Face config.json; derived counts.
#include "meshtrain/config/llama_config.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"

#include <limits>
#include <tuple>
#include <type_traits>

namespace meshtrain::config {
namespace {

// `value` as an int64_t: a JSON integer within int64_t's range (1e30 or 4.5 is not one: nlohmann would convert it
// silently, and wrongly).
int64_t json_integer(const nlohmann::json& value, const char* key, const std::string& source) {
  MT_USER_CHECK(value.is_number_integer() &&
                    !(value.is_number_unsigned() &&
                      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
                "{}: key '{}' must be an integer, got {}", source, key, json_excerpt(value));
  return value.get<int64_t>();
}

template <typename T>
T json_or(const nlohmann::json& json, const char* key, T fallback, const std::string& source) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return fallback;
  if constexpr (std::is_same_v<T, int64_t>) return json_integer(*it, key, source);
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UserError(fmt::format("{}: key '{}' has the wrong type: {}", source, key, json_excerpt(*it)));
  }
}

template <typename T>
T json_required(const nlohmann::json& json, const char* key, const std::string& source) {
  MT_USER_CHECK(json.contains(key) && !json[key].is_null(), "{}: required key '{}' is missing", source, key);
  return json_or<T>(json, key, T{}, source);
}

// HF allows eos_token_id to be a list (Llama-3.1 instruct); the first entry is the end-of-text token.
int64_t token_id(const nlohmann::json& json, const char* key, const std::string& source) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return 0;
  if (it->is_array() && !it->empty()) return json_integer((*it)[0], key, source);
  return json_integer(*it, key, source);
}

}  // namespace

LlamaConfig LlamaConfig::from_hf_json(const nlohmann::json& json, const std::string& source) {
  MT_USER_CHECK(json.is_object(), "{}: expected a JSON object", source);
  std::string model_type = json_or<std::string>(json, "model_type", "llama", source);
  MT_USER_CHECK(model_type == "llama" || model_type == "mixtral",
                "{}: model_type is '{}'; only 'llama' and 'mixtral' are supported", source, model_type);
  MT_USER_CHECK(!json_or<bool>(json, "attention_bias", false, source), "{}: attention_bias=true is not supported",
                source);
  MT_USER_CHECK(!json_or<bool>(json, "mlp_bias", false, source), "{}: mlp_bias=true is not supported", source);
  std::string act = json_or<std::string>(json, "hidden_act", "silu", source);
  MT_USER_CHECK(act == "silu", "{}: hidden_act is '{}'; only 'silu' is supported", source, act);

  LlamaConfig c;
  c.vocab_size = json_required<int64_t>(json, "vocab_size", source);
  c.hidden_size = json_required<int64_t>(json, "hidden_size", source);
  c.intermediate_size = json_required<int64_t>(json, "intermediate_size", source);
  c.num_hidden_layers = json_required<int64_t>(json, "num_hidden_layers", source);
  c.num_attention_heads = json_required<int64_t>(json, "num_attention_heads", source);
  c.num_key_value_heads = json_or<int64_t>(json, "num_key_value_heads", c.num_attention_heads, source);
  c.head_dim = json_or<int64_t>(json, "head_dim", c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0,
                                source);
  c.max_position_embeddings = json_or<int64_t>(json, "max_position_embeddings", c.max_position_embeddings, source);
  c.rms_norm_eps = json_or<double>(json, "rms_norm_eps", c.rms_norm_eps, source);
  c.rope_theta = json_or<double>(json, "rope_theta", 10000.0, source);  // HF's default when the key is absent
  c.tie_word_embeddings = json_or<bool>(json, "tie_word_embeddings", false, source);
  c.initializer_range = json_or<double>(json, "initializer_range", c.initializer_range, source);
  c.bos_token_id = token_id(json, "bos_token_id", source);
  c.eos_token_id = token_id(json, "eos_token_id", source);
  if (model_type == "mixtral") {
    c.num_local_experts = json_required<int64_t>(json, "num_local_experts", source);
    c.num_experts_per_tok = json_or<int64_t>(json, "num_experts_per_tok", c.num_experts_per_tok, source);
    c.router_aux_loss_coef = json_or<double>(json, "router_aux_loss_coef", 0.001, source);  // HF's default
    MT_USER_CHECK(json.value("sliding_window", nlohmann::json()).is_null(),
                  "{}: sliding_window={} is not supported (attention is over the whole sequence); set it to null",
                  source, json_excerpt(json.value("sliding_window", nlohmann::json())));
    MT_USER_CHECK(json_or<double>(json, "router_jitter_noise", 0.0, source) == 0.0,
                  "{}: router_jitter_noise must be 0 (meshtrain's routing is deterministic)", source);
  }
  if (auto it = json.find("rope_scaling"); it != json.end() && !it->is_null()) {
    // Older files call the type "type"; both spellings name the same thing.
    std::string type = json_or<std::string>(*it, "rope_type", json_or<std::string>(*it, "type", "", source), source);
    MT_USER_CHECK(type == "llama3", "{}: rope_scaling type is '{}'; only 'llama3' is supported", source, type);
    Llama3RopeScaling s;
    s.factor = json_required<double>(*it, "factor", source + " rope_scaling");
    s.low_freq_factor = json_required<double>(*it, "low_freq_factor", source + " rope_scaling");
    s.high_freq_factor = json_required<double>(*it, "high_freq_factor", source + " rope_scaling");
    s.original_max_position_embeddings =
        json_required<int64_t>(*it, "original_max_position_embeddings", source + " rope_scaling");
    c.rope_scaling = s;
  }
  c.validate(source);
  return c;
}

nlohmann::json LlamaConfig::to_hf_json(const std::string& torch_dtype) const {
  nlohmann::json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"initializer_range", initializer_range},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"attention_dropout", 0.0},
      {"torch_dtype", torch_dtype},
  };
  if (is_moe()) {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["num_local_experts"] = num_local_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["router_aux_loss_coef"] = router_aux_loss_coef;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
  }
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j;
}

void LlamaConfig::validate(const std::string& source) const {
  // Bounds far above any published Llama (405B: hidden 16384, intermediate 53248, 126 layers, vocab 128256), so that
  // the counts derived from them cannot overflow.
  constexpr int64_t kMaxDimension = int64_t{1} << 22, kMaxLayers = 4096, kMaxExperts = 4096;
  for (const auto& [name, value, max] : {std::tuple{"vocab_size", vocab_size, kMaxDimension},
                                         std::tuple{"hidden_size", hidden_size, kMaxDimension},
                                         std::tuple{"intermediate_size", intermediate_size, kMaxDimension},
                                         std::tuple{"num_hidden_layers", num_hidden_layers, kMaxLayers},
                                         std::tuple{"num_attention_heads", num_attention_heads, kMaxDimension},
                                         std::tuple{"num_key_value_heads", num_key_value_heads, kMaxDimension},
                                         std::tuple{"head_dim", head_dim, kMaxDimension},
                                         std::tuple{"max_position_embeddings", max_position_embeddings, kMaxDimension},
                                         std::tuple{"num_local_experts", num_local_experts, kMaxExperts}})
    MT_USER_CHECK(value <= max, "{}: {} is {}, more than the {} meshtrain accepts", source, name, value, max);
  MT_USER_CHECK(vocab_size > 0, "{}: vocab_size must be positive, got {}", source, vocab_size);
  MT_USER_CHECK(hidden_size > 0, "{}: hidden_size must be positive, got {}", source, hidden_size);
  MT_USER_CHECK(intermediate_size > 0, "{}: intermediate_size must be positive, got {}", source, intermediate_size);
  MT_USER_CHECK(num_hidden_layers > 0, "{}: num_hidden_layers must be positive, got {}", source, num_hidden_layers);
  MT_USER_CHECK(num_attention_heads > 0, "{}: num_attention_heads must be positive, got {}", source,
                num_attention_heads);
  MT_USER_CHECK(num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
                "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", source,
                num_attention_heads, num_key_value_heads);
  MT_USER_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim must be even and positive, got {}", source, head_dim);
  MT_USER_CHECK(rms_norm_eps > 0, "{}: rms_norm_eps must be positive, got {}", source, rms_norm_eps);
  MT_USER_CHECK(rope_theta > 0, "{}: rope_theta must be positive, got {}", source, rope_theta);
  MT_USER_CHECK(num_local_experts >= 0, "{}: num_local_experts must be 0 (a dense Llama) or positive, got {}", source,
                num_local_experts);
  if (is_moe()) {
    MT_USER_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= num_local_experts,
                  "{}: num_experts_per_tok must be between 1 and num_local_experts ({}), got {}", source,
                  num_local_experts, num_experts_per_tok);
    MT_USER_CHECK(router_aux_loss_coef >= 0, "{}: router_aux_loss_coef must be >= 0, got {}", source,
                  router_aux_loss_coef);
  }
  if (rope_scaling) {
    MT_USER_CHECK(rope_scaling->factor > 0, "{}: rope_scaling.factor must be positive", source);
    MT_USER_CHECK(rope_scaling->high_freq_factor > rope_scaling->low_freq_factor,
                  "{}: rope_scaling.high_freq_factor ({}) must exceed low_freq_factor ({})", source,
                  rope_scaling->high_freq_factor, rope_scaling->low_freq_factor);
    MT_USER_CHECK(rope_scaling->original_max_position_embeddings > 0,
                  "{}: rope_scaling.original_max_position_embeddings must be positive", source);
  }
}

int64_t LlamaConfig::embedding_parameter_count() const { return vocab_size * hidden_size; }

namespace {

// Every parameter when each layer's MLP counts `experts_counted` experts (and the router, for a Mixtral).
int64_t parameters_with(const LlamaConfig& c, int64_t experts_counted) {
  const int64_t q_out = c.num_attention_heads * c.head_dim, kv_out = c.num_key_value_heads * c.head_dim;
  const int64_t attention = c.hidden_size * q_out + 2 * c.hidden_size * kv_out + q_out * c.hidden_size;
  const int64_t expert = 3 * c.hidden_size * c.intermediate_size;
  const int64_t mlp = c.is_moe() ? experts_counted * expert + c.num_local_experts * c.hidden_size : expert;
  const int64_t norms = 2 * c.hidden_size;
  const int64_t head = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
  return c.embedding_parameter_count() + c.num_hidden_layers * (attention + mlp + norms) + c.hidden_size + head;
}

}  // namespace

int64_t LlamaConfig::parameter_count() const { return parameters_with(*this, num_local_experts); }

int64_t LlamaConfig::active_parameter_count() const { return parameters_with(*this, num_experts_per_tok); }

double LlamaConfig::training_flops_per_token(int64_t seq_len) const {
  const int64_t norms = (2 * num_hidden_layers + 1) * hidden_size;
  // With tied embeddings the table is still multiplied once, by the output head.
  const int64_t matmul_params =
      active_parameter_count() - norms - (tie_word_embeddings ? 0 : embedding_parameter_count());
  // Causal attention: the token at position t scores and weighs t + 1 keys, (seq_len + 1) / 2 on average.
  return 6.0 * static_cast<double>(matmul_params) +
         6.0 * static_cast<double>(num_hidden_layers * num_attention_heads * head_dim * (seq_len + 1));
}

bool operator==(const LlamaConfig& a, const LlamaConfig& b) { return a.to_hf_json("") == b.to_hf_json(""); }

}  // namespace meshtrain::config
