// grad_clip.hpp — gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_ does it: gradients are scaled
// by max_norm / (norm + 1e-6) when that is below 1. The global norm (over every shard on every device) is computed
// by the parallel layer; these are the local pieces every device applies with the same numbers.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace meshtrain::train {

// min(1, max_norm / (global_norm + 1e-6)); 1 when max_norm <= 0 (clipping off). A non-finite norm gives a
// non-finite coefficient, as in torch (error_if_nonfinite=False): the loss check catches the run going bad.
double clip_coefficient(double global_norm, double max_norm);

// grads *= factor in place (under NoGradGuard); nothing to do when factor == 1. Undefined tensors are skipped.
void scale_(std::vector<at::Tensor>& grads, double factor);

}  // namespace meshtrain::train
