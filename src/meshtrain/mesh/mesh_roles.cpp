// mesh_roles.cpp — the roles of a mesh's axes in training.
#include "meshtrain/mesh/mesh_roles.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>

namespace meshtrain::mesh {

std::vector<Axis> MeshRoles::batch_axes() const {
  if (experts_split()) return {Axis::data, Axis::fsdp, Axis::expert};
  return {Axis::data, Axis::fsdp};
}

std::vector<Axis> MeshRoles::dense_gradient_axes() const {
  if (experts_split()) return {Axis::data, Axis::expert};
  return {Axis::data};
}

int64_t MeshRoles::row_replicas(const std::vector<Axis>& row_axes) const {
  auto splits_over = [&](Axis a) { return std::find(row_axes.begin(), row_axes.end(), a) != row_axes.end(); };
  MT_USER_CHECK(!splits_over(Axis::tensor) || mesh_->size(Axis::tensor) == 1,
                "data.input_sharding splits the batch over tensor, but the ranks of a tensor-parallel group must see "
                "the same rows; shard the batch over data and fsdp only");
  int64_t replicas = 1;
  for (Axis a : batch_axes())
    if (!splits_over(a)) replicas *= mesh_->size(a);
  return replicas;
}

}  // namespace meshtrain::mesh
