// fsdp.hpp — FsdpUnit: one FSDP unit, a group of parameters (a decoder layer; the embedding table, the final norm or
// lm_head) kept as one flat fp32 buffer of the members' (tensor-parallel-local) parameters in order, padded with zeros
// to a multiple of the fsdp group size n and sharded over `fsdp`; the optimizer updates the shard in place.
//
// Every rank of the group calls, in the same order: gather() (prefetch() may start it early) before the unit runs,
// making the module's parameters views of the full buffer; free_full() after it when resharding; after its backward
// start_reducing_gradients() then finish_reducing_gradients() (or reduce_gradients_from_params() for both), which add
// this rank's piece into grad_shard(), summed over micro-batches. With n = 1 the shard is the full buffer and the
// parameters are views of it for the whole run: no copies. How a step uses it: docs/parallelism.md.
#pragma once

#include "meshtrain/parallel/tensor_parallel.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::parallel {

class FsdpUnit {
 public:
  // The largest send buffer of a gradient reduce-scatter (elements over all ranks): a unit's gradient goes in
  // pieces of this size instead of one flat copy of the whole unit (8 MB in fp32; the all-to-all under it receives
  // as much).
  static constexpr int64_t kReducePieceElements = int64_t{2} << 20;

  struct Member {
    std::string name;  // Hugging Face name
    at::Tensor param;  // the module's parameter (shares its TensorImpl); its (tensor-local) shape
    std::vector<int64_t> shape;
    int64_t offset = 0;  // in the full flat buffer
    int64_t numel = 0;
    TensorSplit split = TensorSplit::none;  // over `tensor`
    model::ParameterSlice block;             // the part of the whole parameter `param` is (its tensor block)
  };
  struct Parameter {
    std::string name;
    at::Tensor param;
    model::ParameterSlice block;
  };

  // Fills this rank's shard from `values` (only the pieces of each parameter the shard holds are asked for); the
  // parameters' own storage is released without being read.
  // `gather_dtype`: what the shards travel as in gather() (kFloat, or kBFloat16: half the bytes, cast back into
  // the fp32 full buffer once per gather; the bf16 compute path rounds the weights to bf16 anyway).
  // `holds_shard` false: a unit another pipeline stage holds, of which this device knows the layout only (members,
  // offsets, which shard holds which piece: piece_in_shard) and holds nothing (empty shard, `values` unused).
  FsdpUnit(std::string label, const std::vector<Parameter>& params, runtime::Comm& fsdp_comm,
           const model::SliceSource& values, at::ScalarType gather_dtype = at::kFloat, bool holds_shard = true);

  const std::string& label() const { return label_; }
  const std::vector<Member>& members() const { return members_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  at::Tensor& shard() { return shard_; }            // [padded_numel / n], what the optimizer updates
  const at::Tensor& shard() const { return shard_; }
  at::Tensor& grad_shard() { return grad_shard_; }  // same shape

  void gather();
  // Starts the all-gather now so that the next gather() only waits for what is left (no-op if gathered or started).
  void prefetch();
  void free_full();
  bool gathered() const { return gathered_; }
  // For a pass that takes the unit a piece at a time instead of gathered whole (the head's loss): starts the
  // all-gather of elements [begin, begin + count) of every rank's shard, [n * count] in the gather dtype, rank r's
  // piece (flat elements r * shard numel + begin onwards) at r * count. Collective over fsdp.
  runtime::PendingCollective gather_piece_async(int64_t begin, int64_t count) const;
  // Reads every member's .grad (zeros for a member that got none), reduce-scatters the flat gradient into
  // grad_shard() (added), resets the .grads and frees the full buffer.
  void reduce_gradients_from_params();
  // The same in two halves: start() copies the gradients out, resets the .grads, frees the full buffer and starts
  // the reduce-scatters; finish() waits for them and adds into grad_shard() (a no-op when none is in flight). With
  // fsdp=1 start() adds in place and finish() has nothing to do.
  void start_reducing_gradients();
  void finish_reducing_gradients();
  bool reducing() const { return !pending_reduce_.empty(); }
  // This rank's shard of the unit's flat gradient summed over the fsdp group, the gradient given per member (flat or
  // in the member's shape; undefined: zeros). Reduce-scattered in pieces of at most kReducePieceElements; with fsdp=1
  // a single member's gradient is returned itself. Collective over fsdp.
  at::Tensor reduce_scatter(const std::vector<at::Tensor>& member_grads) const;
  // The same with the gradients produced piece by piece: write(member, from, to, into) fills `into` (zeros, fp32)
  // with the flat elements [from, to) of the member's gradient. The gradients need never exist whole (the head's
  // weight gradient, made a block of vocabulary rows at a time: model/fused_cross_entropy.hpp).
  using GradientWriter = std::function<void(size_t member, int64_t from, int64_t to, at::Tensor& into)>;
  at::Tensor reduce_scatter(const GradientWriter& write) const;

  // The part of member `m` that FSDP shard `shard` of tensor block `block` holds (`block` is m's block on the tensor
  // rank in question: m.block for this device's), as a slice of the whole parameter and its offset in the shard;
  // nullopt when that shard holds none of m.
  struct ShardPiece {
    model::ParameterSlice slice;
    int64_t offset_in_shard = 0;
  };
  std::optional<ShardPiece> piece_in_shard(const Member& m, int shard, const model::ParameterSlice& block) const;

  // Writes this rank's shard of the members' values into `shard_buffer`, asking `values` for each member's piece in
  // the shard. No communication.
  void fill_shard(at::Tensor& shard_buffer, const model::SliceSource& values) const;

  // Sums of squares of grad_shard() over the members split over `tensor` and over the others.
  std::pair<double, double> grad_square_sums() const;

 private:
  void bind_params_to(const at::Tensor& full_flat);
  // Where the next all-gather writes: full_ itself (given its bytes again; created on the first gather) for fp32,
  // a buffer of the gather dtype otherwise (cast into full_ when it arrives).
  at::Tensor gather_destination();
  at::Tensor shard_to_send() const { return gather_dtype_ == at::kFloat ? shard_ : shard_.to(gather_dtype_); }

  std::string label_;
  runtime::Comm& comm_;
  at::ScalarType gather_dtype_;
  std::vector<Member> members_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  at::Tensor shard_;
  at::Tensor grad_shard_;
  at::Tensor full_;  // n > 1: the gathered flat buffer (storage released while not gathered)
  bool gathered_ = false;
  std::optional<runtime::PendingCollective> pending_;  // a prefetch in flight
  struct PendingPiece {
    int64_t begin = 0, count = 0;  // in the shard
    runtime::PendingCollective reduce;
  };
  std::vector<PendingPiece> pending_reduce_;  // gradient reduce-scatters in flight
  // Starts the reduce-scatters of the gradients `write` produces (as reduce_scatter() takes it) piece by piece,
  // handing each to `started` before the next piece is written.
  void for_each_reduce_piece(const GradientWriter& write, const std::function<void(PendingPiece)>& started) const;
  // A GradientWriter that copies from whole gradients (undefined: zeros).
  GradientWriter copy_from(const std::vector<at::Tensor>& member_grads) const;
};

}  // namespace meshtrain::parallel
