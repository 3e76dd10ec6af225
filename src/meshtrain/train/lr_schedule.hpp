// lr_schedule.hpp — the learning rate of each optimizer step: a linear warmup from 0, then a cosine or linear decay
// to min_lr_ratio * learning_rate at max_steps (or a constant rate), as in torchprime and Hugging Face's schedules.
//
// Steps are numbered from 1 like the logs: at(1) is the rate of the first update, at(warmup_steps) = learning_rate
// (the warmup line starts at 0 for step 0, so no update is wasted at rate 0), at(max_steps) = min_lr_ratio *
// learning_rate; past max_steps the rate stays there. A pure function of the step, so resuming needs no state.
#pragma once

#include "meshtrain/settings/settings.hpp"

#include <cstdint>
#include <string>

namespace meshtrain::train {

class LrSchedule {
 public:
  using Decay = settings::LrDecay;

  // UserError naming the key for warmup_steps < 0, min_lr_ratio outside [0, 1], learning_rate < 0, max_steps < 1.
  LrSchedule(Decay decay, double learning_rate, int64_t warmup_steps, int64_t max_steps, double min_lr_ratio);
  // lr_scheduler.*, optimizer.learning_rate and max_steps.
  explicit LrSchedule(const settings::Settings& settings);

  // The learning rate of optimizer step `step` (1-based; at(0) = 0 when there is a warmup).
  double at(int64_t step) const;

 private:
  Decay decay_;
  double learning_rate_;
  int64_t warmup_steps_, max_steps_;
  double min_lr_;
};

}  // namespace meshtrain::train
