// adamw.cpp — the AdamW update in the op order of torch's single-tensor implementation.
#include "meshtrain/train/adamw.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <cmath>

namespace meshtrain::train {

AdamW::AdamW(AdamWOptions options, std::vector<at::Tensor> params) : options_(options), params_(std::move(params)) {
  int64_t largest = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    MT_CHECK(p.defined() && p.scalar_type() == at::kFloat && p.is_contiguous(),
             "AdamW: parameter {} must be a defined contiguous fp32 tensor", i);
    exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    largest = std::max(largest, p.numel());
  }
  denom_scratch_ = at::empty({std::min(largest, kChunkElements)}, at::kFloat);
}

void AdamW::step(const std::vector<at::Tensor>& grads, double lr) {
  MT_CHECK(grads.size() == params_.size(), "AdamW::step: {} gradients for {} parameters", grads.size(),
           params_.size());
  torch::NoGradGuard no_grad;
  ++steps_taken_;
  const double beta1 = options_.beta1, beta2 = options_.beta2;
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(steps_taken_));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(steps_taken_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = grads[i];
    MT_CHECK(g.defined() && g.scalar_type() == at::kFloat && g.sizes() == p.sizes(),
             "AdamW::step: gradient {} must be fp32 of shape {} like its parameter", i, fmt::join(p.sizes(), "x"));
    const at::Tensor p_flat = p.view({-1}), g_flat = g.reshape({-1}), m_flat = exp_avg_[i].view({-1}),
                     v_flat = exp_avg_sq_[i].view({-1});
    for (int64_t first = 0; first < p_flat.numel(); first += kChunkElements) {
      const int64_t count = std::min(kChunkElements, p_flat.numel() - first);
      at::Tensor param = p_flat.narrow(0, first, count), m = m_flat.narrow(0, first, count),
                 v = v_flat.narrow(0, first, count), denom = denom_scratch_.narrow(0, 0, count);
      const at::Tensor grad = g_flat.narrow(0, first, count);
      if (options_.weight_decay != 0) param.mul_(1 - lr * options_.weight_decay);
      m.mul_(beta1).add_(grad, 1 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      at::sqrt_out(denom, v).div_(bias_correction2_sqrt).add_(options_.epsilon);
      param.addcdiv_(m, denom, -step_size);
    }
  }
}

}  // namespace meshtrain::train
