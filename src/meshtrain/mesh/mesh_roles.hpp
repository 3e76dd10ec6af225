// mesh_roles.hpp — what each axis of a mesh does in training, answered in one place (torchtitan's ParallelDims): the
// axes that split the batch's rows, the axes over which a parameter's gradient has replicas to sum, and whether the
// experts are split. The read plan, the parallel model, the trainer and the memory plan ask it; a new axis (context,
// pipeline) gets its role here.
//
// Roles on the axes data, fsdp, tensor, expert (mesh.hpp):
//   data    splits the batch; replicates parameters (gradients summed over it)
//   fsdp    splits the batch; shards parameters (gathered for compute, gradients reduce-scattered over it)
//   tensor  splits parameters by blocks (Megatron); every tensor rank sees the same rows
//   expert  splits the experts of a Mixtral layer; when it is larger than 1 it also splits the batch (each expert rank
//           routes its own tokens), so the non-expert parameters have replicas over it
#pragma once

#include "meshtrain/mesh/mesh.hpp"

#include <cstdint>
#include <vector>

namespace meshtrain::mesh {

// Holds a pointer to the mesh, which must outlive it.
class MeshRoles {
 public:
  explicit MeshRoles(const Mesh& mesh) : mesh_(&mesh) {}

  // Whether the experts are split over `expert` (its size is larger than 1).
  bool experts_split() const { return mesh_->size(Axis::expert) > 1; }
  // The axes the batch's rows are split over: (data, fsdp), plus expert when the experts are split.
  std::vector<Axis> batch_axes() const;
  // The axes over which a non-expert parameter's gradient has replicas to sum: data, plus expert when the experts
  // are split (fsdp's shards are reduce-scattered inside the FSDP unit).
  std::vector<Axis> dense_gradient_axes() const;
  // The axes over which an expert's parameter's gradient has replicas to sum: data.
  std::vector<Axis> expert_gradient_axes() const { return {Axis::data}; }
  // How many devices of batch_axes() hold each row of the batch when its rows are split over `row_axes` (the input
  // sharding's first dimension): the product of the batch axes it leaves out. UserError when `row_axes` splits the
  // rows over a tensor axis larger than 1 (the ranks of a tensor-parallel group must see the same rows).
  int64_t row_replicas(const std::vector<Axis>& row_axes) const;

 private:
  const Mesh* mesh_;
};

}  // namespace meshtrain::mesh
