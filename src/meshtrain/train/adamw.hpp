// adamw.hpp — AdamW over a list of fp32 tensors updated in place (in practice the FSDP flat shards a device owns),
// with PyTorch's semantics op for op (torch.optim.AdamW / torch::optim::AdamW, amsgrad off): decoupled weight decay
// p *= 1 - lr * wd, moments m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g^2, then
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The same libtorch kernels in the same order give
// bitwise the same parameters as torch's optimizer, deterministically.
//
// The learning rate is passed to every step (the schedule lives in lr_schedule.hpp); the moments and the step count
// are exposed so the trainer can save and restore them beside a checkpoint.
#pragma once

#include "meshtrain/settings/settings.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace meshtrain::train {

// optimizer.{learning_rate, beta1, beta2, epsilon, weight_decay}, checked by settings::Settings::from_config.
using AdamWOptions = settings::OptimizerSettings;

class AdamW {
 public:
  // `params` are contiguous fp32 tensors of any shapes, updated in place by step(); the moments start at zero.
  AdamW(AdamWOptions options, std::vector<at::Tensor> params);

  // One update with `grads[i]` for `params[i]` (same shape, fp32) at learning rate `lr`. Runs under NoGradGuard.
  void step(const std::vector<at::Tensor>& grads, double lr);

  int64_t steps_taken() const { return steps_taken_; }
  // For restoring a checkpoint: the bias corrections of the next step use steps_taken + 1.
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  // The first and second moments, one per parameter (same shapes); copy into them to restore a checkpoint.
  std::vector<at::Tensor>& exp_avg() { return exp_avg_; }
  std::vector<at::Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  // Elements updated at once: a step goes through each parameter in chunks of this many, the chunk's parameter,
  // gradient and moments (4 MB) staying in the CPU caches across the update's operations (each element's result is
  // the same as a whole-tensor update's).
  static constexpr int64_t kChunkElements = int64_t{1} << 18;
  // The update's denominator for one chunk, reused: a step allocates nothing, and the scratch is 1 MB whatever the
  // model's size.
  at::Tensor denom_scratch_;
  int64_t steps_taken_ = 0;
};

}  // namespace meshtrain::train
