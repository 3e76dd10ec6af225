// fsdp.cpp — FsdpUnit: flat sharded storage, gather/free of the full parameters, gradient reduce-scatter.
#include "meshtrain/parallel/fsdp.hpp"

#include "meshtrain/common/error.hpp"

#include <ATen/native/Resize.h>
#include <torch/torch.h>

namespace meshtrain::parallel {

FsdpUnit::FsdpUnit(std::string label, const std::vector<Parameter>& params, runtime::Comm& fsdp_comm,
                   const model::SliceSource& values, at::ScalarType gather_dtype, bool holds_shard)
    : label_(std::move(label)), comm_(fsdp_comm), gather_dtype_(gather_dtype) {
  MT_CHECK(gather_dtype == at::kFloat || gather_dtype == at::kBFloat16, "unit {}: gathers travel as fp32 or bf16",
           label_);
  for (const Parameter& p : params) {
    Member m;
    m.name = p.name;
    m.param = p.param;
    m.shape = p.param.sizes().vec();
    m.offset = numel_;
    m.numel = p.param.numel();
    m.split = tensor_split_of(p.name);
    m.block = p.block;
    MT_CHECK(m.block.block_numel() == m.numel, "unit {}: {} holds {} elements but its block has {}", label_, m.name,
             m.numel, m.block.block_numel());
    numel_ += m.numel;
    members_.push_back(std::move(m));
  }
  const int n = comm_.size();
  padded_numel_ = (numel_ + n - 1) / n * n;
  torch::NoGradGuard no_grad;
  if (!holds_shard) {
    shard_ = grad_shard_ = at::empty({0}, at::kFloat);
    for (Member& m : members_) m.param.set_data(at::empty({0}, at::kFloat));
    return;
  }
  shard_ = at::empty({padded_numel_ / n}, at::kFloat);
  fill_shard(shard_, values);
  grad_shard_ = at::zeros_like(shard_);
  if (n == 1) {
    bind_params_to(shard_);
    gathered_ = true;
  } else {
    for (Member& m : members_) m.param.set_data(at::empty({0}, at::kFloat));
  }
}

void FsdpUnit::bind_params_to(const at::Tensor& full_flat) {
  for (Member& m : members_) m.param.set_data(full_flat.narrow(0, m.offset, m.numel).view(m.shape));
}

at::Tensor FsdpUnit::gather_destination() {
  if (!full_.defined()) {
    full_ = at::empty({padded_numel_}, at::kFloat);
    bind_params_to(full_);
  } else {
    // The parameters are views of full_'s storage: give it its bytes again.
    at::native::resize_bytes_cpu(full_.storage().unsafeGetStorageImpl(), full_.numel() * sizeof(float));
  }
  return gather_dtype_ == at::kFloat ? full_ : at::empty({padded_numel_}, gather_dtype_);
}

void FsdpUnit::prefetch() {
  if (gathered_ || pending_) return;
  // Between the devices of one host the destination is made when the gather is waited for (Comm::allgather_async).
  pending_ = comm_.allgather_async(shard_to_send(), [this](c10::IntArrayRef) { return gather_destination(); });
}

void FsdpUnit::gather() {
  if (gathered_) return;
  const at::Tensor gathered = pending_ ? pending_->wait() : comm_.allgather(shard_to_send(), gather_destination());
  pending_.reset();
  if (!gathered.is_same(full_)) full_.copy_(gathered);  // bf16 gathers: cast back into the fp32 parameters
  gathered_ = true;
}

runtime::PendingCollective FsdpUnit::gather_piece_async(int64_t begin, int64_t count) const {
  MT_CHECK(begin >= 0 && count >= 1 && begin + count <= shard_.numel(), "unit {}: a piece [{}, {}) of a shard of {}",
           label_, begin, begin + count, shard_.numel());
  const at::Tensor piece = shard_.narrow(0, begin, count);
  return comm_.allgather_async(gather_dtype_ == at::kFloat ? piece : piece.to(gather_dtype_));
}

void FsdpUnit::free_full() {
  if (comm_.size() == 1 || !gathered_) return;
  at::native::resize_bytes_cpu(full_.storage().unsafeGetStorageImpl(), 0);
  gathered_ = false;
}

void FsdpUnit::reduce_gradients_from_params() {
  start_reducing_gradients();
  finish_reducing_gradients();
}

void FsdpUnit::start_reducing_gradients() {
  MT_CHECK(pending_reduce_.empty(), "unit {}: a gradient reduction started while the last one is in flight", label_);
  if (comm_.size() == 1) {  // the shard is the whole unit: add each gradient in place, nothing to communicate
    for (Member& m : members_) {
      at::Tensor& grad = m.param.mutable_grad();
      if (!grad.defined()) continue;
      grad_shard_.narrow(0, m.offset, m.numel).add_(grad.reshape({-1}));
      grad.reset();
    }
    return;
  }
  std::vector<at::Tensor> grads;
  for (const Member& m : members_) grads.push_back(m.param.grad());
  for_each_reduce_piece(copy_from(grads), [this](PendingPiece piece) { pending_reduce_.push_back(std::move(piece)); });
  grads.clear();
  for (Member& m : members_) m.param.mutable_grad().reset();
  free_full();
}

void FsdpUnit::finish_reducing_gradients() {
  for (PendingPiece& piece : pending_reduce_) grad_shard_.narrow(0, piece.begin, piece.count).add_(piece.reduce.wait());
  pending_reduce_.clear();
}

at::Tensor FsdpUnit::reduce_scatter(const std::vector<at::Tensor>& member_grads) const {
  const int n = comm_.size();
  if (n == 1 && members_.size() == 1 && numel_ == padded_numel_ && member_grads[0].defined())
    return member_grads[0].reshape({-1});  // the shard is the whole unit: nothing to sum or copy
  return reduce_scatter(copy_from(member_grads));
}

at::Tensor FsdpUnit::reduce_scatter(const GradientWriter& write) const {
  at::Tensor shard = at::empty({padded_numel_ / comm_.size()}, at::kFloat);
  // One piece at a time: no buffer of the unit's size besides what `write` reads from.
  for_each_reduce_piece(write, [&](PendingPiece piece) {
    shard.narrow(0, piece.begin, piece.count).copy_(piece.reduce.wait());
  });
  return shard;
}

FsdpUnit::GradientWriter FsdpUnit::copy_from(const std::vector<at::Tensor>& member_grads) const {
  MT_CHECK(member_grads.size() == members_.size(), "unit {}: {} gradients for {} members", label_,
           member_grads.size(), members_.size());
  std::vector<at::Tensor> flat_grads;  // undefined: zeros
  for (const at::Tensor& grad : member_grads) flat_grads.push_back(grad.defined() ? grad.reshape({-1}) : grad);
  return [flat_grads = std::move(flat_grads)](size_t member, int64_t from, int64_t to, at::Tensor& into) {
    if (flat_grads[member].defined()) into.copy_(flat_grads[member].narrow(0, from, to - from));
  };
}

void FsdpUnit::for_each_reduce_piece(const GradientWriter& write,
                                     const std::function<void(PendingPiece)>& started) const {
  const int n = comm_.size();
  // The unit's flat gradient is never built: piece p holds elements [p * P, (p + 1) * P) of every rank's shard range,
  // written from the members' gradients into a send buffer of at most kReducePieceElements.
  const int64_t shard_numel = padded_numel_ / n;
  const int64_t piece_numel = std::max<int64_t>(1, std::min(shard_numel, kReducePieceElements / n));
  for (int64_t begin = 0; begin < shard_numel; begin += piece_numel) {
    const int64_t count = std::min(piece_numel, shard_numel - begin);
    at::Tensor send = at::zeros({n * count}, at::kFloat);
    for (int r = 0; r < n; ++r) {
      const int64_t lo = r * shard_numel + begin, hi = lo + count;  // in the unit's flat layout
      for (size_t i = 0; i < members_.size(); ++i) {
        const Member& m = members_[i];
        const int64_t from = std::max(lo, m.offset), to = std::min(hi, m.offset + m.numel);
        if (from >= to) continue;
        at::Tensor into = send.narrow(0, r * count + from - lo, to - from);
        write(i, from - m.offset, to - m.offset, into);
      }
    }
    started(PendingPiece{begin, count, comm_.reduce_scatter_sum_async(send)});
  }
}

std::optional<FsdpUnit::ShardPiece> FsdpUnit::piece_in_shard(const Member& m, int shard,
                                                              const model::ParameterSlice& block) const {
  const int64_t shard_numel = padded_numel_ / comm_.size();
  const int64_t lo = std::max(shard * shard_numel, m.offset);
  const int64_t hi = std::min((shard + 1) * shard_numel, m.offset + m.numel);
  if (lo >= hi) return std::nullopt;
  return ShardPiece{block.range(lo - m.offset, hi - m.offset), lo - shard * shard_numel};
}

void FsdpUnit::fill_shard(at::Tensor& shard_buffer, const model::SliceSource& values) const {
  MT_CHECK(shard_buffer.numel() == padded_numel_ / comm_.size(), "unit {}: a shard buffer of {} elements, expected {}",
           label_, shard_buffer.numel(), padded_numel_ / comm_.size());
  // The members' pieces tile the shard up to the end of the last member; only the padding after it is zeroed (the
  // pieces' values are the first bytes written to the rest: zeroing all of it first faulted it in twice as slowly).
  const int64_t shard_numel = shard_buffer.numel();
  const int64_t covered = std::clamp<int64_t>(numel_ - comm_.rank() * shard_numel, 0, shard_numel);
  shard_buffer.narrow(0, covered, shard_numel - covered).zero_();
  for (const Member& m : members_) {
    const std::optional<ShardPiece> piece = piece_in_shard(m, comm_.rank(), m.block);
    if (!piece) continue;
    values(piece->slice, shard_buffer.narrow(0, piece->offset_in_shard, piece->slice.numel()));
  }
}

std::pair<double, double> FsdpUnit::grad_square_sums() const {
  const int64_t shard_numel = grad_shard_.numel();
  const int64_t begin = comm_.rank() * shard_numel, end = begin + shard_numel;
  double split_sum = 0, replicated_sum = 0;
  for (const Member& m : members_) {
    const int64_t lo = std::max(begin, m.offset), hi = std::min(end, m.offset + m.numel);
    if (lo >= hi) continue;
    const at::Tensor part = grad_shard_.narrow(0, lo - begin, hi - lo);
    const double sum = part.dot(part).item<double>();
    (m.split == TensorSplit::none ? replicated_sum : split_sum) += sum;
  }
  return {split_sum, replicated_sum};
}

}  // namespace meshtrain::parallel
