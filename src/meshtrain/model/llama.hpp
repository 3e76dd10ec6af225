// llama.hpp — the Llama-3 decoder for one device (no communication in it), as a torch::nn::Module tree whose
// parameter names are Hugging Face's (`model.embed_tokens.weight`, `model.layers.0.self_attn.q_proj.weight`, ...,
// `model.norm.weight`, `lm_head.weight`), so checkpoints map one to one. A parallelizer works from outside:
// replace_linear swaps a projection, set_layer_runner runs each decoder layer (docs/model.md, "For a parallelizer").
// Parameters stay fp32; set_compute_dtype(kBFloat16) runs the matmuls in bf16 (weights cast on the fly, gradients
// land in fp32), with RMSNorm statistics, softmax and the logits in fp32.
// Every projection goes through compute_matmul (model/compute_matmul.hpp): on a CPU without bf16 instructions a bf16
// one is an fp32 GEMM of the bf16 values. Attention is model/flash_attention.hpp's kernel (fp32 products and softmax).
//
// Shape suffixes: B batch, T sequence (positions), D hidden_size, V vocab, H query heads (local), K key/value heads
// (local), G query heads per key/value head (H = K*G), E head_dim, F intermediate_size, S key positions (= T, or the
// whole row's with context parallelism).
#pragma once

#include "meshtrain/config/llama_config.hpp"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::model {

// The architecture a model is built from lives with the run's settings (config/llama_config.hpp).
using config::LlamaConfig;

// A parameter tensor of `shape` (fp32) for a module to register. Normally allocated and unwritten (its values come
// from initialize_parameters or a checkpoint). On a thread inside a ParametersWithoutStorage scope it has its shape
// and no storage, as torchtitan builds a model on the meta device: a parallelizer gives every parameter its own
// pieces (parallel/parallel_model.hpp), and nothing may read one before that.
torch::Tensor new_parameter(const std::vector<int64_t>& shape);

class ParametersWithoutStorage {
 public:
  ParametersWithoutStorage();
  ~ParametersWithoutStorage();
  ParametersWithoutStorage(const ParametersWithoutStorage&) = delete;
  ParametersWithoutStorage& operator=(const ParametersWithoutStorage&) = delete;

 private:
  bool outer_;
};

// y = x W^T with W [out_features, in_features] registered as "weight" (nn.Linear layout, no bias).
class Linear : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x_NI) = 0;
};

// The single-device projection: one dense weight, cast to the input's dtype for the matmul.
class DenseLinear : public Linear {
 public:
  DenseLinear(int64_t in_features, int64_t out_features);
  torch::Tensor forward(const torch::Tensor& x_NI) override;
  torch::Tensor weight;  // [out_features, in_features]
};

// A module that holds Linear children by name (attention, MLP, the model's head).
class LinearOwner {
 public:
  virtual ~LinearOwner() = default;
  // The slot of the child projection `child` ("q_proj", ...); Error if there is none of that name.
  virtual std::shared_ptr<Linear>& linear_slot(const std::string& child) = 0;
};

// x / sqrt(mean(x^2) + eps) * weight, the statistics in fp32 (torch 1.13 has no rms_norm op).
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x_BTD);
  torch::Tensor weight;  // [D]
 private:
  double eps_;
};

// The rotary embedding's inverse frequencies [E/2] for `config` (rope_theta, and the Llama-3.1 scaling if set),
// computed as Hugging Face's `_compute_llama3_parameters` does.
torch::Tensor rope_inverse_frequencies(const LlamaConfig& config);

// Context parallelism, seen from the model: this device holds some chunks of each row (T of the row's S tokens), and
// the attention needs the keys and values of the whole rows. A parallelizer implements it
// (parallel/context_parallel.hpp: it communicates); the model only calls it.
class ContextExchange {
 public:
  virtual ~ContextExchange() = default;
  // The row positions of this device's T tokens, int64 [T] (its chunks, in the order it holds them).
  virtual torch::Tensor positions(int64_t T) = 0;
  // S, the length of the whole rows when this device holds T tokens of each.
  virtual int64_t row_length(int64_t T) const = 0;
  // The whole rows [B, S], in row order, of a per-token tensor [B, T] every device passes its part of (not
  // differentiable: document numbers).
  virtual torch::Tensor gather_rows(const torch::Tensor& x_BT) = 0;
  // The whole rows' keys and values [B, K, S, E] each, in row order, from this device's [B, K, T, E]; differentiable
  // (each device's keys and values get the gradients of every device's attention to them).
  virtual std::pair<torch::Tensor, torch::Tensor> gather_keys_values(const torch::Tensor& k_BKTE,
                                                                     const torch::Tensor& v_BKTE) = 0;
};

// What attention needs to know of a batch's positions: the rotary tables in HF's rotate-half layout (each frequency
// twice: [f, f]), with documents kept apart (data.document_mask) each token's document, and with context parallelism
// where this device's tokens sit in their rows.
struct RopeTables {
  // [T, E] for positions 0..T-1 of every row (for the row positions of this device's tokens with context
  // parallelism); or, with documents, [B, T, E] for each token's position in its document (the positions restart at
  // each document start).
  torch::Tensor cos;
  torch::Tensor sin;
  // int64 [B, T], non-decreasing along each row (of whole rows): a token attends only to earlier tokens of the same
  // number. Undefined: each row is one sequence.
  torch::Tensor documents_BT;
  // Context parallelism (null `exchange`: this device holds whole rows): the row positions of this device's tokens
  // (int64 [T]), and with documents the whole rows' document numbers [B, S] (the keys').
  ContextExchange* exchange = nullptr;
  torch::Tensor positions_T;
  torch::Tensor key_documents_BS;
};
RopeTables rope_tables(const torch::Tensor& inverse_frequencies, int64_t seq_len, torch::Dtype dtype);
// Each token's position in its document: t minus the index of its document's first token in the row, for document
// numbers [B, T] that are non-decreasing along each row.
torch::Tensor positions_in_documents(const torch::Tensor& documents_BT);

// x * cos + rotate_half(x) * sin with rotate_half([x1, x2]) = [-x2, x1]; x is [B, heads, T, E] at positions
// first_position..first_position + T - 1 of [T, E] tables (which must cover them), or at the positions of [B, T, E]
// ones (first_position 0).
torch::Tensor apply_rope(const torch::Tensor& x_BHTE, const RopeTables& rope, int64_t first_position = 0);

// One decoder layer's keys and values of the positions decoded so far, [B, K, capacity, E] each (rotated keys).
struct LayerKvCache {
  torch::Tensor keys_BKCE;
  torch::Tensor values_BKCE;
};

// Every layer's cache and how many positions it holds (LlamaForCausalLM::new_kv_cache, next_token_logits).
struct KvCache {
  std::vector<LayerKvCache> layers;
  int64_t length = 0;
  int64_t capacity = 0;
};

class LlamaAttention : public torch::nn::Module, public LinearOwner {
 public:
  explicit LlamaAttention(const LlamaConfig& config);
  // With a cache, x holds the positions after the cache's first `first_position` ones: their keys and values are
  // written into the cache and each attends to every position before it, cached ones included.
  torch::Tensor forward(const torch::Tensor& x_BTD, const RopeTables& rope, LayerKvCache* cache = nullptr,
                        int64_t first_position = 0);
  std::shared_ptr<Linear>& linear_slot(const std::string& child) override;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  int64_t head_dim_;
  int64_t heads_per_kv_head_;  // G
};

class LlamaMLP : public torch::nn::Module, public LinearOwner {
 public:
  explicit LlamaMLP(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x_BTD);  // down(silu(gate(x)) * up(x))
  std::shared_ptr<Linear>& linear_slot(const std::string& child) override;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

class MixtralSparseMoe;
class RouterStats;

// A Llama decoder layer; a Mixtral one (config.is_moe()) has block_sparse_moe (model/moe.hpp) instead of mlp.
class LlamaDecoderLayer : public torch::nn::Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, const std::shared_ptr<RouterStats>& router_stats);
  torch::Tensor forward(const torch::Tensor& x_BTD, const RopeTables& rope, LayerKvCache* cache = nullptr,
                        int64_t first_position = 0);
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMLP> mlp;                        // null in a Mixtral layer
  std::shared_ptr<MixtralSparseMoe> block_sparse_moe;  // null in a Llama layer
};

// Runs layer `index` on x (the default calls layer.forward(x, rope)).
using LayerRunner =
    std::function<torch::Tensor(int64_t index, LlamaDecoderLayer& layer, const torch::Tensor& x_BTD, const RopeTables&)>;

// The token embedding table [V, D] as "weight" (allocated, not written: see LlamaForCausalLM).
class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t vocab_size, int64_t hidden_size);
  torch::Tensor forward(const torch::Tensor& tokens_BT);  // [B, T, D]
  torch::Tensor weight;  // [V, D]
};

// HF's LlamaModel: embedding, decoder layers, final norm (registered as "model" in LlamaForCausalLM).
class LlamaModel : public torch::nn::Module {
 public:
  LlamaModel(const LlamaConfig& config, const std::shared_ptr<RouterStats>& router_stats);
  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<LlamaDecoderLayer>> layers;  // the children of layer_list, typed
  torch::nn::ModuleList layer_list{nullptr};              // registered as "layers": names "layers.<i>"
  std::shared_ptr<RMSNorm> norm;
};

// Construction allocates every parameter without writing it (untouched pages cost no memory): the values come from
// initialize_parameters, a checkpoint, or a parallelizer that keeps only its pieces (parallel/parallel_model.hpp).
class LlamaForCausalLM : public torch::nn::Module, public LinearOwner {
 public:
  explicit LlamaForCausalLM(const LlamaConfig& config);

  // Logits [B, T, V] in fp32 for int64 tokens [B, T] (T <= max_position_embeddings); documents_BT as for
  // hidden_states.
  torch::Tensor forward(const torch::Tensor& tokens_BT, const torch::Tensor& documents_BT = {});
  // The final-normed hidden states [B, T, D] in the compute dtype: the output head's input.
  // `documents_BT` (int64 [B, T], optional): keeps the documents packed in a row apart (RopeTables).
  torch::Tensor hidden_states(const torch::Tensor& tokens_BT, const torch::Tensor& documents_BT = {});
  // The output head's weight [V, D]: lm_head's, or the embedding table when tied.
  torch::Tensor head_weight();
  // Sum over tokens of the cross entropy of targets_BT, as an fp32 scalar, without the [B, T, V] logits
  // (model/fused_cross_entropy.hpp): the training loss.
  torch::Tensor loss_sum(const torch::Tensor& tokens_BT, const torch::Tensor& targets_BT,
                         const torch::Tensor& documents_BT = {});

  // Decoding with a KV cache: an empty cache for `batch` sequences of up to `capacity` positions (at most
  // max_position_embeddings), then next_token_logits on the prompt and on each new token in turn. It runs the
  // tokens [B, T] at the positions after the cached ones (appending their keys and values) and returns the fp32
  // logits [B, V] of the token after the last one. Runs the layers itself (not through a layer runner).
  KvCache new_kv_cache(int64_t batch, int64_t capacity);
  torch::Tensor next_token_logits(const torch::Tensor& tokens_BT, KvCache& cache);

  // The forward pass in stages, for a caller that gathers each stage's parameters around it (hidden_states =
  // final_norm(run_layers(embed(tokens)))):
  torch::Tensor embed(const torch::Tensor& tokens_BT);    // [B, T, D] in the compute dtype; checks the tokens
  // The same with the table's rows for the tokens given by `rows_of` (fp32 [B, T, D]; a sharded table's lookup).
  torch::Tensor embed(const torch::Tensor& tokens_BT,
                      const std::function<torch::Tensor(const torch::Tensor&)>& rows_of);
  // Decoder layers [first, end) (end -1: to the last; a pipeline stage's) through the layer runner; documents_BT as
  // for hidden_states.
  torch::Tensor run_layers(const torch::Tensor& x_BTD, const torch::Tensor& documents_BT = {}, int64_t first = 0,
                           int64_t end = -1);
  torch::Tensor final_norm(const torch::Tensor& x_BTD);   // model.norm

  const LlamaConfig& config() const { return config_; }
  void set_compute_dtype(torch::Dtype dtype);  // kFloat32 (default) or kBFloat16
  torch::Dtype compute_dtype() const { return compute_dtype_; }
  void set_layer_runner(LayerRunner runner) { layer_runner_ = std::move(runner); }
  // Context parallelism: the tokens given to the forward passes are chunks of rows, whose keys and values `exchange`
  // gathers (it must outlive the model's use; null: whole rows, the default).
  void set_context_exchange(ContextExchange* exchange) { context_exchange_ = exchange; }
  // A Mixtral's routing of the current forward pass (null for a dense Llama): embed() starts it, hidden_states()
  // closes it on this device alone; a parallelizer that runs the stages itself closes it over the batch.
  const std::shared_ptr<RouterStats>& router_stats() const { return router_stats_; }

  // HF names of every projection, e.g. "model.layers.3.self_attn.q_proj", "lm_head" (absent when tied); a Mixtral's
  // experts are not among them (MixtralSparseMoe shards them itself).
  std::vector<std::string> linear_names() const;
  std::shared_ptr<Linear> linear(const std::string& name);
  // Replaces the projection `name` (module and parameter names follow: "<name>.weight" if the new one has a weight).
  void replace_linear(const std::string& name, std::shared_ptr<Linear> replacement);
  std::shared_ptr<Linear>& linear_slot(const std::string& child) override;

  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<Linear> lm_head;  // nullptr when tie_word_embeddings (the embedding table is the head)

 private:
  const RopeTables& rope_for(int64_t seq_len);
  // The tables of `documents_BT`'s positions (rope_for's without documents).
  RopeTables rope_for(const torch::Tensor& documents_BT);
  // The tables of this device's T tokens of each row with context parallelism (documents_BT optional).
  RopeTables rope_for_chunks(int64_t T, const torch::Tensor& documents_BT);

  LlamaConfig config_;
  std::shared_ptr<RouterStats> router_stats_;
  torch::Dtype compute_dtype_ = torch::kFloat32;
  LayerRunner layer_runner_;
  ContextExchange* context_exchange_ = nullptr;
  torch::Tensor inverse_frequencies_;
  RopeTables rope_cache_;  // for the longest T seen so far, in compute_dtype_
};

// Fills every parameter with its initial values (model/parameter_init.hpp: the values any mesh initializes).
void initialize_parameters(LlamaForCausalLM& model, uint64_t seed);

// Mean cross entropy of targets [B, T] under logits [B, T, V] (for next-token training: inputs = tokens[:, :-1],
// targets = tokens[:, 1:]). fp32.
torch::Tensor token_cross_entropy(const torch::Tensor& logits_BTV, const torch::Tensor& targets_BT);
// log p(targets[b, t]) under logits[b, t] as [B, T] (fp32).
torch::Tensor target_logprobs(const torch::Tensor& logits_BTV, const torch::Tensor& targets_BT);

}  // namespace meshtrain::model
