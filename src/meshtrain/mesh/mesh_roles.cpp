// mesh_roles.cpp — the roles of a mesh's axes in training.
#include "meshtrain/mesh/mesh_roles.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>

namespace meshtrain::mesh {

std::vector<Axis> MeshRoles::batch_axes() const {
  if (experts_split()) return {Axis::data, Axis::fsdp, Axis::expert};
  return {Axis::data, Axis::fsdp};
}

std::vector<Axis> MeshRoles::token_axes() const {
  std::vector<Axis> axes = batch_axes();
  if (context_split()) axes.push_back(Axis::context);
  return axes;
}

std::vector<Axis> MeshRoles::loss_axes() const {
  std::vector<Axis> axes = token_axes();
  if (pipeline_split()) axes.push_back(Axis::pipeline);
  return axes;
}

std::vector<Axis> MeshRoles::dense_gradient_axes() const {
  std::vector<Axis> axes = {Axis::data};
  if (experts_split()) axes.push_back(Axis::expert);
  if (context_split()) axes.push_back(Axis::context);
  return axes;
}

std::vector<Axis> MeshRoles::expert_gradient_axes() const {
  if (context_split()) return {Axis::data, Axis::context};
  return {Axis::data};
}

int64_t MeshRoles::row_replicas(const std::vector<Axis>& row_axes) const {
  auto splits_over = [&](Axis a) { return std::find(row_axes.begin(), row_axes.end(), a) != row_axes.end(); };
  MT_USER_CHECK(!splits_over(Axis::tensor) || mesh_->size(Axis::tensor) == 1,
                "data.input_sharding splits the batch over tensor, but the ranks of a tensor-parallel group must see "
                "the same rows; shard the batch over data and fsdp only");
  MT_USER_CHECK(!splits_over(Axis::pipeline) || mesh_->size(Axis::pipeline) == 1,
                "data.input_sharding splits the batch over pipeline, but every stage of a pipeline must see the same "
                "rows (the first takes their tokens, the last their labels); shard the batch over data and fsdp only");
  MT_USER_CHECK(!splits_over(Axis::context),
                "data.input_sharding splits the batch's rows over context, but context splits each row's tokens; "
                "shard the second dimension over it (e.g. \"(data,fsdp),context\")");
  int64_t replicas = 1;
  for (Axis a : batch_axes())
    if (!splits_over(a)) replicas *= mesh_->size(a);
  return replicas;
}

std::vector<TokenRange> MeshRoles::context_chunks(int64_t block_size, int context_size, int context_rank) {
  const int64_t chunks = 2 * int64_t{context_size};
  MT_USER_CHECK(block_size % chunks == 0,
                "block_size={} does not split into 2 x context = {} equal chunks (context parallelism balances the "
                "causal work with two chunks per context rank); use a multiple of {}", block_size, chunks, chunks);
  MT_CHECK(context_rank >= 0 && context_rank < context_size, "context rank {} of {}", context_rank, context_size);
  const int64_t chunk = block_size / chunks, early = context_rank, late = chunks - 1 - context_rank;
  return {{early * chunk, (early + 1) * chunk}, {late * chunk, (late + 1) * chunk}};
}

}  // namespace meshtrain::mesh
