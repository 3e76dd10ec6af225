// lr_schedule.cpp — warmup, then cosine / linear / no decay.
#include "meshtrain/train/lr_schedule.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <cmath>

namespace meshtrain::train {

LrSchedule::LrSchedule(Decay decay, double learning_rate, int64_t warmup_steps, int64_t max_steps,
                       double min_lr_ratio)
    : decay_(decay),
      learning_rate_(learning_rate),
      warmup_steps_(warmup_steps),
      max_steps_(max_steps),
      min_lr_(min_lr_ratio * learning_rate) {
  MT_USER_CHECK(std::isfinite(learning_rate) && learning_rate >= 0,
                "config key 'optimizer.learning_rate' must be >= 0, got {}", learning_rate);
  MT_USER_CHECK(warmup_steps >= 0, "config key 'lr_scheduler.warmup_steps' must be >= 0, got {}", warmup_steps);
  MT_USER_CHECK(max_steps >= 1, "config key 'max_steps' must be >= 1, got {}", max_steps);
  MT_USER_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, "config key 'lr_scheduler.min_lr_ratio' must be in [0, 1], got {}",
                min_lr_ratio);
}

LrSchedule::LrSchedule(const settings::Settings& settings)
    : LrSchedule(settings.lr_scheduler.decay, settings.optimizer.learning_rate, settings.lr_scheduler.warmup_steps,
                 settings.max_steps, settings.lr_scheduler.min_lr_ratio) {}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps_) return learning_rate_ * static_cast<double>(std::max<int64_t>(step, 0)) / warmup_steps_;
  if (decay_ == Decay::constant) return learning_rate_;
  // progress 0 at the end of the warmup, 1 at max_steps (and after; also when the warmup reaches max_steps).
  const int64_t decay_steps = max_steps_ - warmup_steps_;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps_) / static_cast<double>(std::max<int64_t>(decay_steps, 1)));
  const double factor = decay_ == Decay::cosine ? 0.5 * (1 + std::cos(M_PI * progress)) : 1 - progress;
  return min_lr_ + (learning_rate_ - min_lr_) * factor;
}

}  // namespace meshtrain::train
