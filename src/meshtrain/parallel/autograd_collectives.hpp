// autograd_collectives.hpp — collectives as differentiable operations, for tensor parallelism (Megatron's f and g):
//   copy_to_group(x)      forward: x (every rank already holds all of it)    backward: all-reduce sum of the gradient
//   reduce_from_group(x)  forward: all-reduce sum of the partial x           backward: the gradient as it is
// A column-parallel linear starts with copy_to_group (its input is replicated, each rank's gradient with respect
// to it is partial); a row-parallel linear ends with reduce_from_group (each rank's output is a partial sum).
// The Comm must outlive the autograd graph (it does: it lives in the device's context for the whole run).
#pragma once

#include "meshtrain/runtime/comm.hpp"

#include <ATen/ATen.h>

namespace meshtrain::parallel {

at::Tensor copy_to_group(const at::Tensor& x, runtime::Comm& comm);
at::Tensor reduce_from_group(const at::Tensor& x, runtime::Comm& comm);
}  // namespace meshtrain::parallel
