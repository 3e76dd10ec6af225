// grad_clip.cpp — the clip coefficient and the in-place scaling.
#include "meshtrain/train/grad_clip.hpp"

#include <algorithm>
#include <cmath>

namespace meshtrain::train {

double clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coefficient = max_norm / (global_norm + 1e-6);
  return std::isnan(coefficient) ? coefficient : std::min(coefficient, 1.0);
}

void scale_(std::vector<at::Tensor>& grads, double factor) {
  if (factor == 1.0) return;
  torch::NoGradGuard no_grad;
  for (at::Tensor& g : grads)
    if (g.defined()) g.mul_(factor);
}

}  // namespace meshtrain::train
