// llama.cpp — the Llama-3 modules, rotary embedding with Llama-3.1 scaling, loss helpers, HF-style initialization.
// Shape suffixes as in llama.hpp: B batch, T sequence, D hidden, V vocab, H/K query/key-value heads, G = H/K,
// E head_dim, F intermediate, S key positions.
#include "meshtrain/model/llama.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/flash_attention.hpp"
#include "meshtrain/model/fused_cross_entropy.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/model/parameter_init.hpp"

#include <cmath>
#include <tuple>

namespace meshtrain::model {

namespace {
thread_local bool parameters_without_storage = false;

// silu(gate) * up, keeping only its two inputs for backward: silu(gate) is computed again there (one elementwise
// pass) rather than held from forward to backward, a [B, T, F] tensor per layer (llama-100m at 1024 tokens: 8.4 MB
// a layer, 0.1 GB over 12). The gradients are autograd's own formulas for mul and silu (silu_backward), on the same
// values: the same bits.
struct SwiGlu : torch::autograd::Function<SwiGlu> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate_BTF,
                               const torch::Tensor& up_BTF) {
    ctx->save_for_backward({gate_BTF, up_BTF});
    return torch::silu(gate_BTF) * up_BTF;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &gate_BTF = saved[0], &up_BTF = saved[1], &grad_BTF = grads[0];
    torch::Tensor grad_gate_BTF, grad_up_BTF;
    if (ctx->needs_input_grad(0)) grad_gate_BTF = torch::silu_backward(grad_BTF * up_BTF, gate_BTF);
    if (ctx->needs_input_grad(1)) grad_up_BTF = grad_BTF * torch::silu(gate_BTF);
    return {grad_gate_BTF, grad_up_BTF};
  }
};

// RMSNorm's last step, weight * normed (normed = x * inverse_rms in the compute dtype), keeping for backward the
// norm's input and inverse RMS, which its earlier steps keep anyway, instead of `normed`, which is computed again from
// them there: one [B, T, D] tensor less from forward to backward per norm (two a layer). The gradients are autograd's
// for mul, the weight's reduced over B and T by the engine as it reduces mul's (InputMetadata::reduce_grad): the same
// bits.
struct WeightTimesNormed : torch::autograd::Function<WeightTimesNormed> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weight_D,
                               const torch::Tensor& normed_BTD, const torch::Tensor& x32_BTD,
                               const torch::Tensor& inverse_rms_BT1) {
    // x32 and inverse_rms come detached: the graph reaches them through normed only.
    ctx->save_for_backward({weight_D, x32_BTD, inverse_rms_BT1});
    return weight_D * normed_BTD;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &weight_D = saved[0], &x32_BTD = saved[1], &inverse_rms_BT1 = saved[2], &grad_BTD = grads[0];
    torch::Tensor grad_weight_BTD, grad_normed_BTD;
    if (ctx->needs_input_grad(0))
      grad_weight_BTD = grad_BTD * (x32_BTD * inverse_rms_BT1).to(weight_D.scalar_type());
    if (ctx->needs_input_grad(1)) grad_normed_BTD = grad_BTD * weight_D;
    return {grad_weight_BTD, grad_normed_BTD, torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

torch::Tensor new_parameter(const std::vector<int64_t>& shape) {
  if (!parameters_without_storage) return torch::empty(shape);
  torch::Tensor shaped = torch::empty({0});
  shaped.unsafeGetTensorImpl()->set_sizes_contiguous(shape);  // sizes only: the storage stays 0 bytes
  return shaped;
}

ParametersWithoutStorage::ParametersWithoutStorage() : outer_(parameters_without_storage) {
  parameters_without_storage = true;
}

ParametersWithoutStorage::~ParametersWithoutStorage() { parameters_without_storage = outer_; }

DenseLinear::DenseLinear(int64_t in_features, int64_t out_features) {
  weight = register_parameter("weight", new_parameter({out_features, in_features}));
}

torch::Tensor DenseLinear::forward(const torch::Tensor& x_NI) {
  return compute_matmul(x_NI, weight.to(x_NI.scalar_type()).t());
}

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) { weight = register_parameter("weight", new_parameter({dim})); }

Embedding::Embedding(int64_t vocab_size, int64_t hidden_size) {
  weight = register_parameter("weight", new_parameter({vocab_size, hidden_size}));
}

torch::Tensor Embedding::forward(const torch::Tensor& tokens_BT) { return torch::embedding(weight, tokens_BT); }

torch::Tensor RMSNorm::forward(const torch::Tensor& x_BTD) {
  torch::Tensor x32_BTD = x_BTD.to(torch::kFloat32);
  torch::Tensor inverse_rms_BT1 = torch::rsqrt(x32_BTD.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return WeightTimesNormed::apply(weight.to(x_BTD.scalar_type()), (x32_BTD * inverse_rms_BT1).to(x_BTD.scalar_type()),
                                  x32_BTD.detach(), inverse_rms_BT1.detach());
}

torch::Tensor rope_inverse_frequencies(const LlamaConfig& config) {
  const int64_t E = config.head_dim;
  torch::Tensor exponents = torch::arange(0, E, 2, torch::kInt64).to(torch::kFloat32) / static_cast<float>(E);
  torch::Tensor inverse_frequencies = 1.0 / torch::pow(config.rope_theta, exponents);
  if (!config.rope_scaling) return inverse_frequencies;

  const config::Llama3RopeScaling& s = *config.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelength = old_context / s.low_freq_factor;
  const double high_freq_wavelength = old_context / s.high_freq_factor;
  torch::Tensor wavelength = 2 * M_PI / inverse_frequencies;
  // Long wavelengths (low frequencies) are slowed by `factor`, short ones kept, the band between interpolated.
  torch::Tensor scaled =
      torch::where(wavelength > low_freq_wavelength, inverse_frequencies / s.factor, inverse_frequencies);
  torch::Tensor smooth = (old_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  torch::Tensor is_medium = (wavelength >= high_freq_wavelength).logical_and(wavelength <= low_freq_wavelength);
  return torch::where(is_medium, smoothed, scaled);
}

RopeTables rope_tables(const torch::Tensor& inverse_frequencies, int64_t seq_len, torch::Dtype dtype) {
  torch::Tensor positions_T = torch::arange(seq_len, torch::kInt64).to(torch::kFloat32);
  torch::Tensor angles_TE = torch::outer(positions_T, inverse_frequencies).repeat({1, 2});
  RopeTables tables;
  tables.cos = angles_TE.cos().to(dtype);
  tables.sin = angles_TE.sin().to(dtype);
  return tables;
}

torch::Tensor positions_in_documents(const torch::Tensor& documents_BT) {
  const int64_t T = documents_BT.size(1);
  const torch::Tensor t_BT = torch::arange(T, torch::kInt64).expand_as(documents_BT);
  // A document starts where the number changes (and at t = 0); cummax carries each start's index along the row.
  torch::Tensor starts_BT = torch::ones_like(documents_BT, torch::kBool);
  if (T > 1) starts_BT.narrow(1, 1, T - 1).copy_(documents_BT.narrow(1, 1, T - 1) != documents_BT.narrow(1, 0, T - 1));
  const torch::Tensor first_BT = std::get<0>(torch::cummax(t_BT * starts_BT, 1));
  return t_BT - first_BT;
}

torch::Tensor apply_rope(const torch::Tensor& x_BHTE, const RopeTables& rope, int64_t first_position) {
  const int64_t T = x_BHTE.size(2), half = x_BHTE.size(3) / 2;
  torch::Tensor cos, sin;  // [T, E], or [B, 1, T, E] per token
  if (rope.cos.dim() == 3) {
    MT_CHECK(first_position == 0, "apply_rope: per-token tables start at the row's first token");
    cos = rope.cos.unsqueeze(1);
    sin = rope.sin.unsqueeze(1);
  } else {
    cos = rope.cos.narrow(0, first_position, T);
    sin = rope.sin.narrow(0, first_position, T);
  }
  torch::Tensor rotated_BHTE = torch::cat({-x_BHTE.narrow(-1, half, half), x_BHTE.narrow(-1, 0, half)}, -1);
  return x_BHTE * cos + rotated_BHTE * sin;
}

LlamaAttention::LlamaAttention(const LlamaConfig& config)
    : head_dim_(config.head_dim), heads_per_kv_head_(config.num_attention_heads / config.num_key_value_heads) {
  const int64_t D = config.hidden_size, q_width = config.num_attention_heads * config.head_dim,
                kv_width = config.num_key_value_heads * config.head_dim;
  q_proj = register_module("q_proj", std::make_shared<DenseLinear>(D, q_width));
  k_proj = register_module("k_proj", std::make_shared<DenseLinear>(D, kv_width));
  v_proj = register_module("v_proj", std::make_shared<DenseLinear>(D, kv_width));
  o_proj = register_module("o_proj", std::make_shared<DenseLinear>(q_width, D));
}

torch::Tensor LlamaAttention::forward(const torch::Tensor& x_BTD, const RopeTables& rope, LayerKvCache* cache,
                                      int64_t first_position) {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1), E = head_dim_, G = heads_per_kv_head_;
  torch::Tensor q_BHTE = apply_rope(q_proj->forward(x_BTD).view({B, T, -1, E}).transpose(1, 2), rope, first_position);
  torch::Tensor k_BKSE = apply_rope(k_proj->forward(x_BTD).view({B, T, -1, E}).transpose(1, 2), rope, first_position);
  torch::Tensor v_BKSE = v_proj->forward(x_BTD).view({B, T, -1, E}).transpose(1, 2);
  const int64_t H = q_BHTE.size(1), K = k_BKSE.size(1);
  MT_CHECK(H == K * G, "attention: {} local query heads do not match {} key/value heads x {} per group", H, K, G);
  MT_CHECK(!cache || !rope.documents_BT.defined(), "attention: decoding with a KV cache keeps one document per row");
  MT_CHECK(!cache || !rope.exchange, "attention: decoding with a KV cache holds whole rows");
  if (rope.exchange) {  // context parallelism: this device's queries against the whole rows' keys
    std::tie(k_BKSE, v_BKSE) = rope.exchange->gather_keys_values(k_BKSE, v_BKSE);
    const int64_t S = k_BKSE.size(2);
    AttentionMask mask{rope.positions_T, torch::arange(S, torch::kInt64), rope.documents_BT, rope.key_documents_BS};
    const torch::Tensor out_BHTE = flash_attention(q_BHTE, k_BKSE, v_BKSE, mask).out_BHTE;
    return o_proj->forward(out_BHTE.transpose(1, 2).reshape({B, T, H * E}));
  }
  if (cache) {  // the keys and values of every position so far: S = first_position + T
    cache->keys_BKCE.narrow(2, first_position, T).copy_(k_BKSE);
    cache->values_BKCE.narrow(2, first_position, T).copy_(v_BKSE);
    k_BKSE = cache->keys_BKCE.narrow(2, 0, first_position + T);
    v_BKSE = cache->values_BKCE.narrow(2, 0, first_position + T);
  }
  // Query t sits at position S - T + t and sees the keys up to it (model/flash_attention.hpp: tiles, no [T, S] scores).
  const int64_t S = k_BKSE.size(2);
  AttentionMask mask = AttentionMask::causal(S - T, T, S);
  if (rope.documents_BT.defined()) {  // and only the keys of the query's own document
    mask.query_documents = rope.documents_BT;
    mask.key_documents = rope.documents_BT;
  }
  const torch::Tensor out_BHTE = flash_attention(q_BHTE, k_BKSE, v_BKSE, mask).out_BHTE;
  return o_proj->forward(out_BHTE.transpose(1, 2).reshape({B, T, H * E}));
}

std::shared_ptr<Linear>& LlamaAttention::linear_slot(const std::string& child) {
  if (child == "q_proj") return q_proj;
  if (child == "k_proj") return k_proj;
  if (child == "v_proj") return v_proj;
  MT_CHECK(child == "o_proj", "attention has no projection '{}' (q_proj, k_proj, v_proj, o_proj)", child);
  return o_proj;
}

LlamaMLP::LlamaMLP(const LlamaConfig& config) {
  const int64_t D = config.hidden_size, F = config.intermediate_size;
  gate_proj = register_module("gate_proj", std::make_shared<DenseLinear>(D, F));
  up_proj = register_module("up_proj", std::make_shared<DenseLinear>(D, F));
  down_proj = register_module("down_proj", std::make_shared<DenseLinear>(F, D));
}

torch::Tensor LlamaMLP::forward(const torch::Tensor& x_BTD) {
  const torch::Tensor gate_BTF = gate_proj->forward(x_BTD);
  torch::Tensor hidden_BTF = SwiGlu::apply(gate_BTF, up_proj->forward(x_BTD));
  return down_proj->forward(hidden_BTF);
}

std::shared_ptr<Linear>& LlamaMLP::linear_slot(const std::string& child) {
  if (child == "gate_proj") return gate_proj;
  if (child == "up_proj") return up_proj;
  MT_CHECK(child == "down_proj", "MLP has no projection '{}' (gate_proj, up_proj, down_proj)", child);
  return down_proj;
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, const std::shared_ptr<RouterStats>& router_stats) {
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(config));
  if (config.is_moe())
    block_sparse_moe = register_module("block_sparse_moe", std::make_shared<MixtralSparseMoe>(config, router_stats));
  else
    mlp = register_module("mlp", std::make_shared<LlamaMLP>(config));
  input_layernorm = register_module("input_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayer::forward(const torch::Tensor& x_BTD, const RopeTables& rope, LayerKvCache* cache,
                                         int64_t first_position) {
  torch::Tensor h_BTD = x_BTD + self_attn->forward(input_layernorm->forward(x_BTD), rope, cache, first_position);
  const torch::Tensor normed_BTD = post_attention_layernorm->forward(h_BTD);
  return h_BTD + (mlp ? mlp->forward(normed_BTD) : block_sparse_moe->forward(normed_BTD));
}

LlamaModel::LlamaModel(const LlamaConfig& config, const std::shared_ptr<RouterStats>& router_stats) {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(config.vocab_size, config.hidden_size));
  layer_list = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    layers.push_back(std::make_shared<LlamaDecoderLayer>(config, router_stats));
    layer_list->push_back(layers.back());
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps));
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& config) : config_(config) {
  config_.validate("model config");
  if (config_.is_moe())
    router_stats_ = std::make_shared<RouterStats>(config_.num_local_experts, config_.num_experts_per_tok,
                                                  config_.router_aux_loss_coef);
  model = register_module("model", std::make_shared<LlamaModel>(config_, router_stats_));
  if (!config_.tie_word_embeddings)
    lm_head = register_module("lm_head", std::make_shared<DenseLinear>(config_.hidden_size, config_.vocab_size));
  inverse_frequencies_ = rope_inverse_frequencies(config_);
}

void LlamaForCausalLM::set_compute_dtype(torch::Dtype dtype) {
  MT_USER_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16,
                "compute dtype must be float32 or bfloat16, got {}", c10::toString(dtype));
  compute_dtype_ = dtype;
  rope_cache_ = {};
}

const RopeTables& LlamaForCausalLM::rope_for(int64_t seq_len) {
  if (!rope_cache_.cos.defined() || rope_cache_.cos.size(0) < seq_len)
    rope_cache_ = rope_tables(inverse_frequencies_, seq_len, compute_dtype_);
  return rope_cache_;
}

RopeTables LlamaForCausalLM::rope_for(const torch::Tensor& documents_BT) {
  const int64_t B = documents_BT.size(0), T = documents_BT.size(1);
  const RopeTables& tables = rope_for(T);
  const torch::Tensor positions_N = positions_in_documents(documents_BT).reshape({-1});
  RopeTables rope;
  rope.cos = tables.cos.index_select(0, positions_N).view({B, T, -1});
  rope.sin = tables.sin.index_select(0, positions_N).view({B, T, -1});
  rope.documents_BT = documents_BT;
  return rope;
}

RopeTables LlamaForCausalLM::rope_for_chunks(int64_t T, const torch::Tensor& documents_BT) {
  ContextExchange& exchange = *context_exchange_;
  const int64_t S = exchange.row_length(T);
  MT_USER_CHECK(S <= config_.max_position_embeddings, "rows of {} tokens exceed max_position_embeddings {}", S,
                config_.max_position_embeddings);
  const RopeTables& tables = rope_for(S);
  RopeTables rope;
  rope.exchange = &exchange;
  rope.positions_T = exchange.positions(T);
  if (!documents_BT.defined()) {
    rope.cos = tables.cos.index_select(0, rope.positions_T);
    rope.sin = tables.sin.index_select(0, rope.positions_T);
    return rope;
  }
  // Positions in documents need the whole rows: a document may start in another device's chunk.
  const int64_t B = documents_BT.size(0);
  rope.documents_BT = documents_BT;
  rope.key_documents_BS = exchange.gather_rows(documents_BT);
  const torch::Tensor positions_N =
      positions_in_documents(rope.key_documents_BS).index_select(1, rope.positions_T).reshape({-1});
  rope.cos = tables.cos.index_select(0, positions_N).view({B, T, -1});
  rope.sin = tables.sin.index_select(0, positions_N).view({B, T, -1});
  return rope;
}

torch::Tensor LlamaForCausalLM::embed(const torch::Tensor& tokens_BT) {
  return embed(tokens_BT, [this](const torch::Tensor& tokens) { return model->embed_tokens->forward(tokens); });
}

torch::Tensor LlamaForCausalLM::embed(const torch::Tensor& tokens_BT,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& rows_of) {
  MT_USER_CHECK(tokens_BT.dim() == 2 && tokens_BT.scalar_type() == torch::kInt64,
                "model input must be int64 tokens [batch, seq], got {} {}", c10::toString(tokens_BT.scalar_type()),
                c10::str(tokens_BT.sizes()));
  MT_USER_CHECK(tokens_BT.size(1) <= config_.max_position_embeddings,
                "sequence of {} tokens exceeds max_position_embeddings {}", tokens_BT.size(1),
                config_.max_position_embeddings);
  if (router_stats_) router_stats_->begin_forward();
  return rows_of(tokens_BT).to(compute_dtype_);
}

torch::Tensor LlamaForCausalLM::run_layers(const torch::Tensor& x_BTD, const torch::Tensor& documents_BT, int64_t first,
                                           int64_t end) {
  const int64_t num_layers = static_cast<int64_t>(model->layers.size());
  if (end < 0) end = num_layers;
  MT_CHECK(first >= 0 && first <= end && end <= num_layers, "layers [{}, {}) of {}", first, end, num_layers);
  if (documents_BT.defined())
    MT_CHECK(documents_BT.scalar_type() == torch::kInt64 && documents_BT.sizes() == x_BTD.sizes().slice(0, 2),
             "document numbers must be int64 [B, T] like the tokens, got {} {}",
             c10::toString(documents_BT.scalar_type()), c10::str(documents_BT.sizes()));
  const RopeTables rope = context_exchange_       ? rope_for_chunks(x_BTD.size(1), documents_BT)
                          : documents_BT.defined() ? rope_for(documents_BT)
                                                   : rope_for(x_BTD.size(1));
  torch::Tensor y_BTD = x_BTD;
  for (int64_t i = first; i < end; ++i) {
    LlamaDecoderLayer& layer = *model->layers[i];
    y_BTD = layer_runner_ ? layer_runner_(i, layer, y_BTD, rope) : layer.forward(y_BTD, rope);
  }
  return y_BTD;
}

torch::Tensor LlamaForCausalLM::final_norm(const torch::Tensor& x_BTD) { return model->norm->forward(x_BTD); }

torch::Tensor LlamaForCausalLM::hidden_states(const torch::Tensor& tokens_BT, const torch::Tensor& documents_BT) {
  torch::Tensor hidden_BTD = final_norm(run_layers(embed(tokens_BT), documents_BT));
  if (router_stats_) router_stats_->close([](at::Tensor&) {});  // this device's tokens are the whole batch
  return hidden_BTD;
}

torch::Tensor LlamaForCausalLM::head_weight() {
  return lm_head ? lm_head->named_parameters()["weight"] : model->embed_tokens->weight;
}

torch::Tensor LlamaForCausalLM::forward(const torch::Tensor& tokens_BT, const torch::Tensor& documents_BT) {
  return compute_matmul(hidden_states(tokens_BT, documents_BT), head_weight().to(compute_dtype_).t())
      .to(torch::kFloat32);
}

torch::Tensor LlamaForCausalLM::loss_sum(const torch::Tensor& tokens_BT, const torch::Tensor& targets_BT,
                                         const torch::Tensor& documents_BT) {
  const torch::Tensor hidden_BTD = hidden_states(tokens_BT, documents_BT);
  return fused_cross_entropy_sum(hidden_BTD.reshape({-1, hidden_BTD.size(-1)}), head_weight(),
                                 targets_BT.reshape({-1}), cross_entropy_chunk_rows(config_.vocab_size));
}

KvCache LlamaForCausalLM::new_kv_cache(int64_t batch, int64_t capacity) {
  MT_USER_CHECK(capacity >= 1 && capacity <= config_.max_position_embeddings,
                "a sequence of {} positions does not fit the model's max_position_embeddings ({})", capacity,
                config_.max_position_embeddings);
  KvCache cache;
  cache.capacity = capacity;
  const std::vector<int64_t> shape = {batch, config_.num_key_value_heads, capacity, config_.head_dim};
  for (size_t i = 0; i < model->layers.size(); ++i)
    cache.layers.push_back({torch::empty(shape, compute_dtype_), torch::empty(shape, compute_dtype_)});
  return cache;
}

torch::Tensor LlamaForCausalLM::next_token_logits(const torch::Tensor& tokens_BT, KvCache& cache) {
  const int64_t first = cache.length, T = tokens_BT.size(1);
  MT_USER_CHECK(first + T <= cache.capacity, "{} more tokens after {} overflow the KV cache of {} positions", T, first,
                cache.capacity);
  const RopeTables& rope = rope_for(first + T);
  torch::Tensor x_BTD = embed(tokens_BT);
  for (size_t i = 0; i < model->layers.size(); ++i)
    x_BTD = model->layers[i]->forward(x_BTD, rope, &cache.layers[i], first);
  cache.length += T;
  const torch::Tensor last_BD = final_norm(x_BTD.select(1, T - 1));
  return compute_matmul(last_BD, head_weight().to(compute_dtype_).t()).to(torch::kFloat32);
}

std::vector<std::string> LlamaForCausalLM::linear_names() const {
  std::vector<std::string> names;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) names.push_back(layer + ".self_attn." + p);
    if (!config_.is_moe())
      for (const char* p : {"gate_proj", "up_proj", "down_proj"}) names.push_back(layer + ".mlp." + p);
  }
  if (lm_head) names.push_back("lm_head");
  return names;
}

std::shared_ptr<Linear>& LlamaForCausalLM::linear_slot(const std::string& child) {
  MT_CHECK(child == "lm_head" && lm_head, "the model has no projection '{}'", child);
  return lm_head;
}

namespace {

// The owner module and child name of the projection `name` ("model.layers.0.mlp.up_proj" -> (mlp, "up_proj")).
std::pair<LinearOwner*, torch::nn::Module*> linear_owner(LlamaForCausalLM& model, const std::string& name,
                                                         std::string& child) {
  auto dot = name.rfind('.');
  child = dot == std::string::npos ? name : name.substr(dot + 1);
  if (dot == std::string::npos) return {&model, &model};
  auto modules = model.named_modules(/*name_prefix=*/"", /*include_self=*/false);
  const std::shared_ptr<torch::nn::Module>* parent = modules.find(name.substr(0, dot));
  auto* owner = parent ? dynamic_cast<LinearOwner*>(parent->get()) : nullptr;
  MT_CHECK(owner, "'{}' is not a projection of the model", name);
  return {owner, parent->get()};
}

}  // namespace

std::shared_ptr<Linear> LlamaForCausalLM::linear(const std::string& name) {
  std::string child;
  return linear_owner(*this, name, child).first->linear_slot(child);
}

void LlamaForCausalLM::replace_linear(const std::string& name, std::shared_ptr<Linear> replacement) {
  std::string child;
  auto [owner, module] = linear_owner(*this, name, child);
  std::shared_ptr<Linear>& slot = owner->linear_slot(child);
  MT_CHECK(slot, "the model has no projection '{}'", name);
  module->replace_module(child, replacement);
  slot = std::move(replacement);
}

void initialize_parameters(LlamaForCausalLM& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& named : model.named_parameters()) {
    torch::Tensor& p = named.value();
    const ParameterSlice whole = ParameterSlice::whole(named.key(), p.sizes().vec());
    p.copy_(initial_values(model.config(), seed, whole).view(p.sizes()));
  }
}

torch::Tensor token_cross_entropy(const torch::Tensor& logits_BTV, const torch::Tensor& targets_BT) {
  const int64_t V = logits_BTV.size(-1);
  return torch::nn::functional::cross_entropy(logits_BTV.reshape({-1, V}).to(torch::kFloat32),
                                              targets_BT.reshape({-1}));
}

torch::Tensor target_logprobs(const torch::Tensor& logits_BTV, const torch::Tensor& targets_BT) {
  torch::Tensor logprobs_BTV = torch::log_softmax(logits_BTV.to(torch::kFloat32), -1);
  return logprobs_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1);
}

}  // namespace meshtrain::model
