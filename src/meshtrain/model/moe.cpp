// moe.cpp — Mixtral's sparse MoE block: routing, grouped expert compute, capacity, and the load-balancing
// gradient. Shape suffixes as in moe.hpp.
#include "meshtrain/model/moe.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"

#include <cmath>

namespace meshtrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity on a layer's output that, in backward, gives the layer's router probability sums their gradient from the
// load-balancing loss (RouterStats::probability_gradient: known once the whole forward has routed).
struct LoadBalancingGradient : torch::autograd::Function<LoadBalancingGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& /*probability_sums_E*/,
                            RouterStats* stats) {
    ctx->saved_data["stats"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(stats));
    return y.view_as(y);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* stats = reinterpret_cast<RouterStats*>(static_cast<intptr_t>(ctx->saved_data["stats"].toInt()));
    return {grads[0], stats->probability_gradient(), at::Tensor()};
  }
};

// The local experts on one device: experts_forward and experts_backward as one autograd node. Inputs: the rows, their
// counts per expert, and the experts' weights (expert_weights' order), which get their gradients.
struct GroupedExperts : torch::autograd::Function<GroupedExperts> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_RD, const std::vector<int64_t>& rows_per_expert,
                            at::TensorList weights) {
    ExpertActivations kept;
    at::Tensor y_RD = experts_forward(weights.vec(), x_RD, rows_per_expert, &kept);
    std::vector<at::Tensor> saved{kept.x_RD, kept.h1_RF, kept.h3_RF};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["rows_per_expert"] = rows_per_expert;
    return y_RD;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const ExpertActivations kept{saved[0], saved[1], saved[2], ctx->saved_data["rows_per_expert"].toIntVector()};
    const std::vector<at::Tensor> weights(saved.begin() + 3, saved.end());
    std::vector<at::Tensor> weight_grads(weights.size());
    variable_list result{experts_backward(weights, kept, grads[0], weight_grads), at::Tensor()};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    return result;
  }
};

}  // namespace

at::Tensor experts_forward(const std::vector<at::Tensor>& weights, const at::Tensor& x_RD,
                           const std::vector<int64_t>& rows_per_expert, ExpertActivations* keep) {
  MT_CHECK(weights.size() == 3 * rows_per_expert.size(), "{} weights for {} experts", weights.size(),
           rows_per_expert.size());
  const torch::Dtype dtype = x_RD.scalar_type();
  const int64_t R = x_RD.size(0), D = x_RD.size(1), F = weights.empty() ? 0 : weights[0].size(0);
  at::Tensor y_RD = at::empty({R, D}, x_RD.options());
  at::Tensor h1_RF = at::empty({R, F}, x_RD.options()), h3_RF = at::empty({R, F}, x_RD.options());
  int64_t offset = 0;
  for (size_t j = 0; j < rows_per_expert.size(); ++j) {
    const int64_t rows = rows_per_expert[j];
    if (rows == 0) continue;
    const at::Tensor x = x_RD.narrow(0, offset, rows), h1 = h1_RF.narrow(0, offset, rows),
                     h3 = h3_RF.narrow(0, offset, rows);
    gemm(x, weights[3 * j].to(dtype).t(), h1);
    gemm(x, weights[3 * j + 1].to(dtype).t(), h3);
    gemm(at::silu(h1) * h3, weights[3 * j + 2].to(dtype).t(), y_RD.narrow(0, offset, rows));
    offset += rows;
  }
  MT_CHECK(offset == R, "the experts' row counts add up to {}, not the {} rows given", offset, R);
  if (keep) *keep = ExpertActivations{x_RD, h1_RF, h3_RF, rows_per_expert};
  return y_RD;
}

at::Tensor experts_backward(const std::vector<at::Tensor>& weights, const ExpertActivations& kept,
                            const at::Tensor& grad_y_RD, std::vector<at::Tensor>& weight_grads) {
  MT_CHECK(weight_grads.size() == weights.size(), "{} gradient slots for {} weights", weight_grads.size(),
           weights.size());
  const torch::Dtype dtype = kept.x_RD.scalar_type();
  const at::Tensor grad_y = grad_y_RD.to(dtype).contiguous();
  at::Tensor grad_x_RD = at::empty_like(kept.x_RD);
  auto add_grad = [&](size_t i, const at::Tensor& grad) {
    const at::Tensor g = grad.to(weights[i].scalar_type());
    weight_grads[i] = weight_grads[i].defined() ? weight_grads[i] + g : g;
  };
  int64_t offset = 0;
  for (size_t j = 0; j < kept.rows_per_expert.size(); ++j) {
    const int64_t rows = kept.rows_per_expert[j];
    if (rows == 0) {
      for (size_t i = 3 * j; i < 3 * j + 3; ++i) add_grad(i, at::zeros_like(weights[i]));
      continue;
    }
    const at::Tensor w1 = weights[3 * j].to(dtype), w3 = weights[3 * j + 1].to(dtype),
                     w2 = weights[3 * j + 2].to(dtype);
    const at::Tensor x = kept.x_RD.narrow(0, offset, rows), h1 = kept.h1_RF.narrow(0, offset, rows),
                     h3 = kept.h3_RF.narrow(0, offset, rows), dy = grad_y.narrow(0, offset, rows);
    const at::Tensor silu_h1 = at::silu(h1);
    add_grad(3 * j + 2, gemm(dy.t(), silu_h1 * h3));  // d w2 [D, F]
    const at::Tensor d_product = gemm(dy, w2);          // [rows, F]
    const at::Tensor d_h3 = d_product * silu_h1, d_h1 = at::silu_backward(d_product * h3, h1);
    add_grad(3 * j, gemm(d_h1.t(), x));
    add_grad(3 * j + 1, gemm(d_h3.t(), x));
    const at::Tensor grad_x = grad_x_RD.narrow(0, offset, rows);
    gemm(d_h1, w1, grad_x);
    gemm(d_h3, w3, grad_x, /*accumulate=*/true);
    offset += rows;
  }
  return grad_x_RD;
}

RouterStats::RouterStats(int64_t num_experts, int64_t experts_per_token, double aux_loss_coef)
    : num_experts_(num_experts), experts_per_token_(experts_per_token), aux_loss_coef_(aux_loss_coef) {
  begin_forward();
}

void RouterStats::begin_forward() {
  closed_ = false;
  dropped_ = 0;
  routed_E_ = at::zeros({num_experts_}, at::kDouble);
  probability_sums_E_ = at::zeros({num_experts_}, at::kDouble);
}

void RouterStats::add_layer(const at::Tensor& routed_slots_E, const at::Tensor& probability_sums_E,
                            int64_t dropped_slots) {
  if (closed_) return;
  routed_E_ += routed_slots_E.to(at::kDouble);
  probability_sums_E_ += probability_sums_E.detach().to(at::kDouble);
  dropped_ += static_cast<double>(dropped_slots);
}

void RouterStats::close(const std::function<void(at::Tensor&)>& sum_over_batch) {
  MT_CHECK(!closed_, "the router statistics of this forward pass were already closed");
  at::Tensor all = at::cat({routed_E_, probability_sums_E_, at::full({1}, dropped_, at::kDouble)});
  sum_over_batch(all);
  routed_E_ = all.narrow(0, 0, num_experts_).clone();
  probability_sums_E_ = all.narrow(0, num_experts_, num_experts_).clone();
  dropped_ = all[2 * num_experts_].item<double>();
  closed_ = true;
}

double RouterStats::layer_tokens() const {
  return routed_E_.sum().item<double>() / static_cast<double>(experts_per_token_);
}

at::Tensor RouterStats::probability_gradient() const {
  MT_CHECK(closed_, "the load-balancing gradient is asked for before the forward pass ended (RouterStats::close)");
  const double tokens = layer_tokens();
  if (tokens == 0) return at::zeros({num_experts_}, at::kFloat);
  const double scale = objective_weight_ * aux_loss_coef_ * static_cast<double>(num_experts_) / (tokens * tokens);
  return (routed_E_ * scale).to(at::kFloat);
}

double RouterStats::aux_loss() const {
  MT_CHECK(closed_, "the load-balancing loss is asked for before the forward pass ended (RouterStats::close)");
  const double tokens = layer_tokens();
  if (tokens == 0) return 0;
  return static_cast<double>(num_experts_) * (routed_E_ * probability_sums_E_).sum().item<double>() /
         (tokens * tokens);
}

double RouterStats::dropped_fraction() const {
  const double routed = routed_E_.sum().item<double>();
  return routed == 0 ? 0 : dropped_ / routed;
}

MixtralExpert::MixtralExpert(int64_t hidden_size, int64_t intermediate_size) {
  w1 = register_module("w1", std::make_shared<DenseLinear>(hidden_size, intermediate_size));
  w2 = register_module("w2", std::make_shared<DenseLinear>(intermediate_size, hidden_size));
  w3 = register_module("w3", std::make_shared<DenseLinear>(hidden_size, intermediate_size));
}

torch::Tensor MixtralExpert::forward(const torch::Tensor& x_RD) {
  return w2->forward(torch::silu(w1->forward(x_RD)) * w3->forward(x_RD));
}

MixtralSparseMoe::MixtralSparseMoe(const LlamaConfig& config, std::shared_ptr<RouterStats> stats)
    : num_experts_(config.num_local_experts), experts_per_token_(config.num_experts_per_tok), stats_(std::move(stats)) {
  gate = register_module("gate", std::make_shared<DenseLinear>(config.hidden_size, num_experts_));
  expert_modules_ = register_module("experts", std::make_shared<torch::nn::Module>());
  for (int64_t e = 0; e < num_experts_; ++e)
    experts_.push_back(expert_modules_->register_module(
        std::to_string(e), std::make_shared<MixtralExpert>(config.hidden_size, config.intermediate_size)));
}

void MixtralSparseMoe::keep_experts(int64_t first, int64_t count) {
  MT_CHECK(static_cast<int64_t>(experts_.size()) == num_experts_ && first >= 0 && count >= 1 &&
               first + count <= num_experts_,
           "keep_experts({}, {}) on a block of {} experts", first, count, num_experts_);
  for (int64_t e = 0; e < num_experts_; ++e)
    if (e < first || e >= first + count) expert_modules_->unregister_module(std::to_string(e));
  experts_ = std::vector<std::shared_ptr<MixtralExpert>>(experts_.begin() + first, experts_.begin() + first + count);
}

void MixtralSparseMoe::shard_over_tensor(int size, TensorGroupStep enter, TensorGroupStep exit) {
  for (const std::shared_ptr<MixtralExpert>& expert : experts_) {
    const int64_t F = expert->w1->weight.size(0), D = expert->w1->weight.size(1);
    MT_CHECK(F % size == 0, "an expert's intermediate size {} does not split over {} tensor ranks", F, size);
    expert->w1 = expert->replace_module("w1", std::make_shared<DenseLinear>(D, F / size));
    expert->w2 = expert->replace_module("w2", std::make_shared<DenseLinear>(F / size, D));
    expert->w3 = expert->replace_module("w3", std::make_shared<DenseLinear>(D, F / size));
  }
  tensor_enter_ = std::move(enter);
  tensor_exit_ = std::move(exit);
}

std::vector<at::Tensor> MixtralSparseMoe::expert_weights() const {
  std::vector<at::Tensor> weights;
  for (const std::shared_ptr<MixtralExpert>& expert : experts_)
    for (const auto& projection : {expert->w1, expert->w3, expert->w2}) weights.push_back(projection->weight);
  return weights;
}

torch::Tensor MixtralSparseMoe::run_local_experts(const torch::Tensor& x_RD,
                                                  const std::vector<int64_t>& rows_per_local_expert) {
  MT_CHECK(rows_per_local_expert.size() == experts_.size(), "{} row counts for {} local experts",
           rows_per_local_expert.size(), experts_.size());
  const std::vector<at::Tensor> weights = expert_weights();
  return GroupedExperts::apply(x_RD, rows_per_local_expert, at::TensorList(weights));  // a list: one input each
}

torch::Tensor MixtralSparseMoe::forward(const torch::Tensor& x_BTD) {
  const int64_t D = x_BTD.size(-1), E = num_experts_, K = experts_per_token_;
  const torch::Tensor x_ND = x_BTD.reshape({-1, D});
  const int64_t N = x_ND.size(0);
  const torch::Tensor logits_NE = torch::matmul(x_ND.to(torch::kFloat32), gate->weight.t());
  const torch::Tensor probs_NE = torch::softmax(logits_NE, -1);
  const torch::Tensor probability_sums_E = probs_NE.sum(0);  // for the load-balancing loss and its gradient
  auto [top_probs_NK, experts_NK] = probs_NE.topk(K, -1);
  const torch::Tensor weights_NK = top_probs_NK / top_probs_NK.sum(-1, /*keepdim=*/true);

  // The slots (token n's j-th choice is slot n*K + j) sorted by expert, token order within an expert.
  const torch::Tensor experts_S = experts_NK.reshape({-1});
  torch::Tensor order_S = std::get<1>(experts_S.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const torch::Tensor routed_E = torch::bincount(experts_S, {}, E);
  torch::Tensor kept_E = routed_E;
  int64_t dropped = 0;
  if (capacity_factor_ > 0) {
    const int64_t capacity =
        static_cast<int64_t>(std::ceil(capacity_factor_ * static_cast<double>(N * K) / static_cast<double>(E)));
    const torch::Tensor sorted_experts_S = experts_S.index_select(0, order_S);
    const torch::Tensor first_slot_E = routed_E.cumsum(0) - routed_E;
    const torch::Tensor rank_in_expert_S =
        torch::arange(order_S.size(0), torch::kInt64) - first_slot_E.index_select(0, sorted_experts_S);
    order_S = order_S.masked_select(rank_in_expert_S < capacity);
    kept_E = routed_E.clamp_max(capacity);
    dropped = N * K - order_S.size(0);
  }
  stats_->add_layer(routed_E, probability_sums_E, dropped);

  const torch::Tensor tokens_S = order_S.div(K, "floor");
  const torch::Tensor expert_input_ND = tensor_enter_ ? tensor_enter_(x_ND) : x_ND;
  const torch::Tensor x_SD = expert_input_ND.index_select(0, tokens_S);
  const std::vector<int64_t> rows_E(kept_E.data_ptr<int64_t>(), kept_E.data_ptr<int64_t>() + E);
  torch::Tensor y_SD = exchange_ ? exchange_(x_SD, rows_E) : run_local_experts(x_SD, rows_E);
  if (tensor_exit_) y_SD = tensor_exit_(y_SD);  // whole before the routing weights multiply it (their gradient)
  const torch::Tensor weights_S = weights_NK.reshape({-1}).index_select(0, order_S).to(y_SD.scalar_type());
  torch::Tensor out_ND = torch::zeros_like(x_ND).index_add(0, tokens_S, y_SD * weights_S.unsqueeze(1));
  if (torch::GradMode::is_enabled() && probability_sums_E.requires_grad())
    out_ND = LoadBalancingGradient::apply(out_ND, probability_sums_E, stats_.get());
  return out_ND.view(x_BTD.sizes());
}

}  // namespace meshtrain::model
