// mesh_roles.hpp — what each axis of a mesh does in training, answered in one place (torchtitan's ParallelDims): the
// axes that split the batch's rows, the axes that split its tokens, the axes over which a parameter's gradient has
// replicas to sum, whether the experts are split, and which chunks of a row a context rank holds. The read plan, the
// parallel model, the trainer and the memory plan ask it; a new axis (pipeline) gets its role here.
//
// Roles on the axes data, fsdp, tensor, expert, context, pipeline (mesh.hpp):
//   data    splits the batch; replicates parameters (gradients summed over it)
//   fsdp    splits the batch; shards parameters (gathered for compute, gradients reduce-scattered over it)
//   tensor  splits parameters by blocks (Megatron); every tensor rank sees the same rows
//   expert  splits the experts of a Mixtral layer; when it is larger than 1 it also splits the batch (each expert rank
//           routes its own tokens), so the non-expert parameters have replicas over it
//   context splits each row's tokens (context parallelism); replicates parameters (gradients summed over it); the
//           attention of a layer gathers the keys and values of the whole row over it (docs/parallelism.md)
//   pipeline splits the layers into stages (parallel/pipeline_schedule.hpp); every stage sees the same rows (like
//           tensor); activations and their gradients travel point to point between neighbouring stages; only the
//           last stage has a loss, so a sum of losses runs over pipeline too (loss_axes)
#pragma once

#include "meshtrain/mesh/mesh.hpp"

#include <cstdint>
#include <vector>

namespace meshtrain::mesh {

// Tokens [begin, end) of a row.
struct TokenRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const TokenRange& other) const { return begin == other.begin && end == other.end; }
};

// Holds a pointer to the mesh, which must outlive it.
class MeshRoles {
 public:
  explicit MeshRoles(const Mesh& mesh) : mesh_(&mesh) {}

  // Whether the experts are split over `expert` (its size is larger than 1).
  bool experts_split() const { return mesh_->size(Axis::expert) > 1; }
  // Whether the rows' tokens are split over `context` (its size is larger than 1).
  bool context_split() const { return mesh_->size(Axis::context) > 1; }
  // Whether the layers are split into stages over `pipeline` (its size is larger than 1).
  bool pipeline_split() const { return mesh_->size(Axis::pipeline) > 1; }
  // The axes the batch's rows are split over: (data, fsdp), plus expert when the experts are split.
  std::vector<Axis> batch_axes() const;
  // The axes over which the devices hold other tokens of the batch: batch_axes(), plus context when it splits the
  // rows' tokens. A sum over the batch's tokens (the loss, routing statistics) runs over them.
  std::vector<Axis> token_axes() const;
  // The axes a sum of the training loss runs over: token_axes(), plus pipeline when it splits the layers (the last
  // stage has the loss, the others add zero).
  std::vector<Axis> loss_axes() const;
  // The axes over which a non-expert parameter's gradient has replicas to sum: data, plus expert when the experts
  // are split, plus context when it splits the tokens (fsdp's shards are reduce-scattered inside the FSDP unit).
  std::vector<Axis> dense_gradient_axes() const;
  // The axes over which an expert's parameter's gradient has replicas to sum: data, plus context when split.
  std::vector<Axis> expert_gradient_axes() const;
  // How many devices of batch_axes() hold each row of the batch when its rows are split over `row_axes` (the input
  // sharding's first dimension): the product of the batch axes it leaves out. UserError when `row_axes` splits the
  // rows over a tensor or pipeline axis larger than 1 (the ranks of a tensor-parallel group and the stages of a
  // pipeline must see the same rows) or over context (which splits tokens, not rows).
  int64_t row_replicas(const std::vector<Axis>& row_axes) const;

  // Load-balanced context parallelism (zig-zag): a row of `block_size` tokens is cut into 2 x `context_size` equal
  // chunks, and context rank r holds chunks r and 2 x context_size - 1 - r, in that order, so every rank has the
  // same share of causal attention work (an early chunk sees few keys, a late one many). With context_size 1 the
  // one rank holds the row in order. UserError naming block_size unless 2 x context_size divides it.
  static std::vector<TokenRange> context_chunks(int64_t block_size, int context_size, int context_rank);

 private:
  const Mesh* mesh_;
};

}  // namespace meshtrain::mesh
