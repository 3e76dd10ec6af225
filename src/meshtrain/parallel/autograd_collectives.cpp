// autograd_collectives.cpp — copy_to_group and reduce_from_group as torch::autograd::Functions.
#include "meshtrain/parallel/autograd_collectives.hpp"

#include "meshtrain/common/error.hpp"

#include <torch/torch.h>

#include <numeric>

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The Comm travels through the autograd context as an integer (saved_data holds IValues only).
void save_comm(AutogradContext* ctx, runtime::Comm& comm) {
  ctx->saved_data["comm"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm));
}
runtime::Comm& saved_comm(AutogradContext* ctx) {
  return *reinterpret_cast<runtime::Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

at::Tensor all_reduced(const at::Tensor& x, runtime::Comm& comm) {
  at::Tensor sum = x.contiguous().clone();
  comm.allreduce_sum(sum);
  return sum;
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, runtime::Comm* comm) {
    save_comm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved_comm(ctx)), at::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, runtime::Comm* comm) { return all_reduced(x, *comm); }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

// Tags of the all-to-all's point-to-point messages (one group's messages between two ranks arrive in order).
constexpr int kAllToAllRowsTag = 0x4d6f45;

// Sends send_rows[r] rows of x to each rank r, receives receive_rows[s] rows from each rank s (rank order both).
at::Tensor exchange_rows(const at::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& receive_rows, runtime::Comm& comm) {
  const int size = comm.size(), me = comm.rank();
  MT_CHECK(static_cast<int>(send_rows.size()) == size && static_cast<int>(receive_rows.size()) == size,
           "all_to_all_rows over {} ranks got {} send and {} receive counts", size, send_rows.size(),
           receive_rows.size());
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape[0] = std::accumulate(receive_rows.begin(), receive_rows.end(), int64_t{0});
  at::Tensor out = at::empty(out_shape, x.options());
  const at::Tensor in = x.contiguous();
  std::vector<std::pair<int, at::Tensor>> sends, receives;
  int64_t send_offset = 0, receive_offset = 0;
  for (int r = 0; r < size; ++r) {
    const at::Tensor to_send = in.narrow(0, send_offset, send_rows[r]);
    const at::Tensor to_receive = out.narrow(0, receive_offset, receive_rows[r]);
    if (r == me) {
      MT_CHECK(send_rows[r] == receive_rows[r], "rank {} sends itself {} rows but receives {}", me, send_rows[r],
               receive_rows[r]);
      to_receive.copy_(to_send);
    } else {
      if (send_rows[r] > 0) sends.emplace_back(r, to_send);
      if (receive_rows[r] > 0) receives.emplace_back(r, to_receive);
    }
    send_offset += send_rows[r];
    receive_offset += receive_rows[r];
  }
  MT_CHECK(send_offset == x.size(0), "all_to_all_rows: the send counts add up to {}, x has {} rows", send_offset,
           x.size(0));
  if (!sends.empty() || !receives.empty())
    comm.exchange(sends, receives, kAllToAllRowsTag, runtime::Collective::all_to_all);
  return out;
}

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> send_rows,
                            std::vector<int64_t> receive_rows, runtime::Comm* comm) {
    save_comm(ctx, *comm);
    ctx->saved_data["send_rows"] = send_rows;
    ctx->saved_data["receive_rows"] = receive_rows;
    return exchange_rows(x, send_rows, receive_rows, *comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {exchange_rows(grads[0], ctx->saved_data["receive_rows"].toIntVector(),
                          ctx->saved_data["send_rows"].toIntVector(), saved_comm(ctx)),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& receive_rows, runtime::Comm& comm) {
  if (comm.size() == 1) return x;
  return AllToAllRows::apply(x, send_rows, receive_rows, &comm);
}

at::Tensor copy_to_group(const at::Tensor& x, runtime::Comm& comm) {
  return comm.size() == 1 ? x : CopyToGroup::apply(x, &comm);
}

at::Tensor reduce_from_group(const at::Tensor& x, runtime::Comm& comm) {
  return comm.size() == 1 ? x : ReduceFromGroup::apply(x, &comm);
}

}  // namespace meshtrain::parallel
