// moe.hpp — MixtralSparseMoe, the Mixtral sparse mixture-of-experts block (Hugging Face's MixtralSparseMoeBlock:
// `block_sparse_moe.gate.weight` [E, D], `block_sparse_moe.experts.<e>.{w1,w2,w3}.weight`) that replaces a Llama
// layer's MLP when num_local_experts > 0, and RouterStats, what one forward pass routed. Routing, capacity, the
// load-balancing loss and its gradient: docs/parallelism.md, "Mixture of experts".
//
// A parallelizer changes the block from outside: keep_experts, shard_over_tensor, set_exchange. RouterStats must be
// closed (summed over the batch) at the end of each forward pass, before backward asks it for the load-balancing
// gradient.
//
// Shape suffixes: N tokens, D hidden_size, E experts (all of them), K experts per token, S routed slots (rows sorted
// by expert), F intermediate_size (this tensor rank's part), R rows of the local experts.
#pragma once

#include "meshtrain/model/llama.hpp"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace meshtrain::model {

// What the MoE layers of one forward pass routed, on one device; global once close() has summed it over the batch.
class RouterStats {
 public:
  RouterStats(int64_t num_experts, int64_t experts_per_token, double aux_loss_coef);

  // A new forward pass (LlamaForCausalLM::embed calls it): the counts start from zero.
  void begin_forward();
  // One layer's routing: slots routed to each expert [E] (before any drop), the sum over its tokens of each expert's
  // router probability [E], and the slots dropped for capacity. Ignored once closed (a checkpointed layer's forward
  // run again in backward routes the same tokens again).
  void add_layer(const at::Tensor& routed_slots_E, const at::Tensor& probability_sums_E, int64_t dropped_slots);
  // Ends the forward pass: `sum_over_batch` sums a double tensor over the devices that hold other rows of the batch,
  // in place (the identity on one device), making the statistics those of the global batch.
  void close(const std::function<void(at::Tensor&)>& sum_over_batch);
  bool closed() const { return closed_; }

  // The weight of the load-balancing loss in what backward differentiates (1: the loss as Hugging Face adds it; the
  // trainer gives 1 / micro-batches, so a step's objective averages it over its micro-batches).
  void set_objective_weight(double weight) { objective_weight_ = weight; }
  // d(objective) / d(one layer's local probability sums) [E] fp32: weight * coef * E * f_e / (layers * tokens).
  at::Tensor probability_gradient() const;

  // After close(), of the global batch: HF's aux_loss (without the coefficient), the slots routed to each expert
  // summed over the layers [E] (double), and the fraction of routed slots dropped for capacity.
  double aux_loss() const;
  const at::Tensor& routed_slots() const { return routed_E_; }
  double dropped_fraction() const;

  int64_t num_experts() const { return num_experts_; }

 private:
  // Layers x tokens of the forward pass: every token routes k slots in each layer.
  double layer_tokens() const;

  int64_t num_experts_, experts_per_token_;
  double aux_loss_coef_, objective_weight_ = 1.0;
  bool closed_ = false;
  at::Tensor routed_E_, probability_sums_E_;  // double
  double dropped_ = 0;
};

// One expert: w2(silu(w1 x) * w3 x), HF's MixtralBlockSparseTop2MLP.
class MixtralExpert : public torch::nn::Module {
 public:
  MixtralExpert(int64_t hidden_size, int64_t intermediate_size);
  torch::Tensor forward(const torch::Tensor& x_RD);
  std::shared_ptr<DenseLinear> w1, w2, w3;  // [F, D], [D, F], [F, D]
};

// The local experts' MLPs run grouped, outside autograd (an autograd function wraps them: MixtralSparseMoe's
// run_local_experts on one device, parallel/expert_parallel.cpp around its exchanges). Rows come grouped by local
// expert, rows_per_expert[j] rows of the j-th kept expert in turn; each expert is one GEMM chain over its rows, written
// into one output (no per-expert autograd nodes, slices or concatenation). `weights` are the experts' projections in
// turn, w1, w3, w2 of each (MixtralSparseMoe::expert_weights); the GEMMs run in x's dtype on this process's bf16 path
// (compute_matmul.hpp).
struct ExpertActivations {  // what backward needs: the input and both F-wide projections (silu and product recomputed)
  at::Tensor x_RD, h1_RF, h3_RF;
  std::vector<int64_t> rows_per_expert;
};
// y = w2(silu(w1 x) * w3 x) of each row's expert; `keep` (when given) receives what experts_backward needs.
at::Tensor experts_forward(const std::vector<at::Tensor>& weights, const at::Tensor& x_RD,
                           const std::vector<int64_t>& rows_per_expert, ExpertActivations* keep);
// The input's gradient; each weight's gradient (in the weight's dtype) is added into weight_grads[i] (defined on
// return, zeros for an expert without rows).
at::Tensor experts_backward(const std::vector<at::Tensor>& weights, const ExpertActivations& kept,
                            const at::Tensor& grad_y_RD, std::vector<at::Tensor>& weight_grads);

// Sends rows grouped by expert (rows_per_expert[e] rows of expert e in turn, all E experts) to the devices of their
// experts, runs them there and returns each row's expert output in the same order (the default runs them all here).
using ExpertExchange =
    std::function<torch::Tensor(const torch::Tensor& x_SD, const std::vector<int64_t>& rows_per_expert)>;
// A tensor-parallel group's differentiable entry and exit (parallel/autograd_collectives.hpp's copy_to_group and
// reduce_from_group).
using TensorGroupStep = std::function<torch::Tensor(const torch::Tensor&)>;

class MixtralSparseMoe : public torch::nn::Module {
 public:
  MixtralSparseMoe(const LlamaConfig& config, std::shared_ptr<RouterStats> stats);
  torch::Tensor forward(const torch::Tensor& x_BTD);

  // Runs the local experts on rows grouped by local expert (rows_per_local_expert[j] rows of the j-th one kept).
  torch::Tensor run_local_experts(const torch::Tensor& x_RD, const std::vector<int64_t>& rows_per_local_expert);

  // Keeps experts [first, first + count) only (their modules keep their global names, `experts.<e>`).
  void keep_experts(int64_t first, int64_t count);
  // Each expert keeps one block of `size` (its values are the parallelizer's): w1/w3 rows and w2 columns of F / size;
  // `enter` and `exit` wrap the experts' part of the block (the router stays replicated).
  void shard_over_tensor(int size, TensorGroupStep enter, TensorGroupStep exit);
  void set_exchange(ExpertExchange exchange) { exchange_ = std::move(exchange); }
  // 0: dropless; c > 0: each expert takes at most ceil(c * N * k / E) slots of a forward pass.
  void set_capacity_factor(double factor) { capacity_factor_ = factor; }

  const std::vector<std::shared_ptr<MixtralExpert>>& experts() const { return experts_; }
  // The kept experts' projections in turn, w1, w3, w2 of each (as experts_forward takes them).
  std::vector<at::Tensor> expert_weights() const;

  std::shared_ptr<DenseLinear> gate;  // the router, [E, D]

 private:
  int64_t num_experts_, experts_per_token_;
  double capacity_factor_ = 0;
  std::shared_ptr<RouterStats> stats_;
  std::shared_ptr<torch::nn::Module> expert_modules_;  // registered as "experts": children "<e>"
  std::vector<std::shared_ptr<MixtralExpert>> experts_;
  ExpertExchange exchange_;
  TensorGroupStep tensor_enter_, tensor_exit_;
};

}  // namespace meshtrain::model
