// mesh_roles_test.cpp — the roles of the mesh's axes: which axes split the batch, which hold gradient replicas,
// and how many devices hold each row for a given input sharding.
#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"

#include <gtest/gtest.h>

namespace meshtrain::mesh {
namespace {

Mesh mesh_of(int data, int fsdp, int tensor, int expert, int context = 1, int pipeline = 1) {
  return Mesh::create(AxisSizes{{data, fsdp, tensor, expert, context, pipeline}}, AxisSizes{}, 1,
                      data * fsdp * tensor * expert * context * pipeline);
}

using Axes = std::vector<Axis>;

TEST(MeshRolesTest, DenseMeshSplitsTheBatchOverDataAndFsdp) {
  const Mesh mesh = mesh_of(2, 2, 2, 1);
  const MeshRoles roles(mesh);
  EXPECT_FALSE(roles.experts_split());
  EXPECT_EQ(roles.batch_axes(), (Axes{Axis::data, Axis::fsdp}));
  EXPECT_EQ(roles.dense_gradient_axes(), (Axes{Axis::data}));
  EXPECT_EQ(roles.expert_gradient_axes(), (Axes{Axis::data}));
}

TEST(MeshRolesTest, SplitExpertsSplitTheBatchAndReplicateTheDenseParameters) {
  const Mesh mesh = mesh_of(2, 1, 1, 2);
  const MeshRoles roles(mesh);
  EXPECT_TRUE(roles.experts_split());
  EXPECT_EQ(roles.batch_axes(), (Axes{Axis::data, Axis::fsdp, Axis::expert}));
  EXPECT_EQ(roles.dense_gradient_axes(), (Axes{Axis::data, Axis::expert}));
  EXPECT_EQ(roles.expert_gradient_axes(), (Axes{Axis::data}));
}

TEST(MeshRolesTest, RowReplicasAreTheBatchAxesTheInputShardingLeavesOut) {
  const Mesh mesh = mesh_of(2, 4, 1, 1);
  const MeshRoles roles(mesh);
  EXPECT_EQ(roles.row_replicas({Axis::data, Axis::fsdp}), 1);
  EXPECT_EQ(roles.row_replicas({Axis::data}), 4);
  EXPECT_EQ(roles.row_replicas({Axis::fsdp}), 2);
  EXPECT_EQ(roles.row_replicas({}), 8);
  const Mesh experts = mesh_of(1, 2, 1, 2);
  EXPECT_EQ(MeshRoles(experts).row_replicas({Axis::fsdp}), 2);  // the expert axis holds copies of each row
}

TEST(MeshRolesTest, RowsSplitOverTensorAreRefused) {
  const Mesh mesh = mesh_of(1, 2, 2, 1);
  try {
    MeshRoles(mesh).row_replicas({Axis::fsdp, Axis::tensor});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.input_sharding splits the batch over tensor"), std::string::npos);
  }
  EXPECT_EQ(MeshRoles(mesh_of(1, 2, 1, 1)).row_replicas({Axis::fsdp, Axis::tensor}), 1);  // tensor = 1: harmless
}

TEST(MeshRolesTest, PipelineStagesSeeTheSameRowsAndAddTheirLosses) {
  const Mesh mesh = mesh_of(1, 2, 1, 1, 1, 2);
  const MeshRoles roles(mesh);
  EXPECT_TRUE(roles.pipeline_split());
  EXPECT_EQ(roles.batch_axes(), (Axes{Axis::data, Axis::fsdp}));
  EXPECT_EQ(roles.token_axes(), (Axes{Axis::data, Axis::fsdp}));
  EXPECT_EQ(roles.loss_axes(), (Axes{Axis::data, Axis::fsdp, Axis::pipeline}));
  EXPECT_EQ(roles.dense_gradient_axes(), (Axes{Axis::data}));  // each stage holds its own layers: no replicas
  EXPECT_EQ(roles.row_replicas({Axis::data, Axis::fsdp}), 1);
  try {
    roles.row_replicas({Axis::fsdp, Axis::pipeline});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data.input_sharding splits the batch over pipeline"), std::string::npos);
  }
  EXPECT_EQ(MeshRoles(mesh_of(1, 2, 1, 1)).loss_axes(), (Axes{Axis::data, Axis::fsdp}));
}

}  // namespace
}  // namespace meshtrain::mesh
