// autograd_collectives.hpp — collectives as differentiable operations, for tensor parallelism (Megatron's f and g)
// and the expert-parallel exchange:
//   copy_to_group(x)      forward: x (every rank already holds all of it)    backward: all-reduce sum of the gradient
//   reduce_from_group(x)  forward: all-reduce sum of the partial x           backward: the gradient as it is
//   all_to_all_rows       forward: x's rows to their ranks (below)           backward: the same exchange, reversed
// A column-parallel linear starts with copy_to_group (its input is replicated, each rank's gradient with respect
// to it is partial); a row-parallel linear ends with reduce_from_group (each rank's output is a partial sum).
// The Comm must outlive the autograd graph (it does: it lives in the device's context for the whole run).
#pragma once

#include "meshtrain/runtime/comm.hpp"

#include <ATen/ATen.h>

#include <vector>

namespace meshtrain::parallel {

at::Tensor copy_to_group(const at::Tensor& x, runtime::Comm& comm);
at::Tensor reduce_from_group(const at::Tensor& x, runtime::Comm& comm);
// The all-to-all of variable sizes (expert parallelism): x [sum(send_rows), ...] holds send_rows[r] rows for rank r,
// rank by rank; the result [sum(receive_rows), ...] holds receive_rows[s] rows from rank s, rank by rank. Every rank
// must pass the counts its peers pass for it (exchange them first); any count may be 0.
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& receive_rows, runtime::Comm& comm);

}  // namespace meshtrain::parallel
