// mesh_test.cpp — device order against JAX's create_hybrid_device_mesh (golden layouts worked out by its rule:
// per-slice meshes reshaped from the slice's devices, tiled on the DCN grid with np.block), validation, groups.
#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh.hpp"

#include <gtest/gtest.h>

namespace meshtrain::mesh {
namespace {

AxisSizes sizes(int data, int fsdp, int tensor, int expert, int context = 1, int pipeline = 1) {
  return AxisSizes{{data, fsdp, tensor, expert, context, pipeline}};
}

std::vector<int> order(const Mesh& m) { return m.device_ids_in_mesh_order(); }

TEST(MeshTest, SingleSliceIsAReshapeOfTheDevices) {
  Mesh m = Mesh::create(sizes(1, 8, 1, 1), sizes(1, 1, 1, 1), 2, 4);
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.shape_string(), "OrderedDict([('data', 1), ('fsdp', 8), ('tensor', 1), ('expert', 1), ('context', 1), ('pipeline', 1)])");
  EXPECT_EQ(m.assignments_string(), "[0 1 2 3 4 5 6 7]");
  EXPECT_EQ(m.device(5).host, 1);
  EXPECT_EQ(m.device(5).local, 1);
  EXPECT_EQ(m.device(5).coords, (Coords{0, 5, 0, 0}));
}

TEST(MeshTest, IciFsdp4DcnFsdp2PutsTheSliceOnTheOuterStride) {
  Mesh m = Mesh::create(sizes(1, 4, 1, 1), sizes(1, 2, 1, 1), 2, 4);
  EXPECT_EQ(m.shape(), sizes(1, 8, 1, 1));
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.device(6).slice, 1);
  EXPECT_EQ(m.device(6).coords[static_cast<int>(Axis::fsdp)], 1 * 4 + 2);
}

TEST(MeshTest, TwoAxisSlicesTiledAlongFsdp) {
  // Slices [[0,1],[2,3]] and [[4,5],[6,7]] (data x fsdp) tiled along fsdp: [[0,1,4,5],[2,3,6,7]].
  Mesh m = Mesh::create(sizes(2, 2, 1, 1), sizes(1, 2, 1, 1), 2, 4);
  EXPECT_EQ(m.shape(), sizes(2, 4, 1, 1));
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
  EXPECT_EQ(m.device(4).coords, (Coords{0, 2, 0, 0}));
  EXPECT_EQ(m.device(3).coords, (Coords{1, 1, 0, 0}));
}

TEST(MeshTest, DcnDataStacksSlicesAlongData) {
  Mesh m = Mesh::create(sizes(2, 2, 1, 1), sizes(2, 1, 1, 1), 2, 4);
  EXPECT_EQ(m.shape(), sizes(4, 2, 1, 1));
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.device(5).coords, (Coords{2, 1, 0, 0}));
}

TEST(MeshTest, ThreeAxisMeshTiledAlongTensor) {
  // Per slice (fsdp=2 x tensor=2): [[0,1],[2,3]] and [[4,5],[6,7]]; tiled along tensor: [[0,1,4,5],[2,3,6,7]].
  Mesh m = Mesh::create(sizes(1, 2, 2, 1), sizes(1, 1, 2, 1), 4, 2);
  EXPECT_EQ(m.shape(), sizes(1, 2, 4, 1));
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
  Mesh m3 = Mesh::create(sizes(2, 2, 2, 1), sizes(1, 1, 1, 1), 2, 4);
  EXPECT_EQ(m3.device(5).coords, (Coords{1, 0, 1, 0}));
}

TEST(MeshTest, FourSlicesOnATwoByTwoDcnGrid) {
  // Slices of 2 (fsdp) on dcn data=2 x fsdp=2: slice s at dcn (s/2, s%2).
  Mesh m = Mesh::create(sizes(1, 2, 1, 1), sizes(2, 2, 1, 1), 4, 2);
  EXPECT_EQ(m.shape(), sizes(2, 4, 1, 1));
  EXPECT_EQ(order(m), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.device(5).coords, (Coords{1, 1, 0, 0}));
  Mesh swapped = Mesh::create(sizes(2, 1, 1, 1), sizes(1, 4, 1, 1), 4, 2);
  // Each slice is a column [a, a+1]; four slices side by side along fsdp.
  EXPECT_EQ(order(swapped), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
}

TEST(MeshTest, AutoAxisTakesTheRemainingDevices) {
  Mesh m = Mesh::create(sizes(2, -1, 1, 1), sizes(1, 1, 1, 1), 2, 4);
  EXPECT_EQ(m.shape(), sizes(2, 4, 1, 1));
  Mesh dcn = Mesh::create(sizes(1, 4, 1, 1), sizes(-1, 1, 1, 1), 2, 4);
  EXPECT_EQ(dcn.dcn(), sizes(2, 1, 1, 1));
  Mesh with_dcn = Mesh::create(sizes(1, -1, 1, 1), sizes(2, 1, 1, 1), 2, 4);
  EXPECT_EQ(with_dcn.ici(), sizes(1, 4, 1, 1));
}

TEST(MeshTest, MismatchSpellsOutTheEquation) {
  try {
    Mesh::create(sizes(1, 4, 1, 1), sizes(1, 1, 1, 1), 2, 4);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("data=1 x fsdp=4 x tensor=1 x expert=1 x context=1 x pipeline=1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2 hosts x 4 devices per host = 8 devices"), std::string::npos) << msg;
  }
  EXPECT_THROW(Mesh::create(sizes(1, 3, 1, 1), sizes(1, -1, 1, 1), 2, 4), UserError);
  EXPECT_THROW(Mesh::create(sizes(-1, -1, 1, 1), sizes(1, 1, 1, 1), 2, 4), UserError);
  EXPECT_THROW(Mesh::create(sizes(1, 0, 1, 1), sizes(1, 1, 1, 1), 1, 1), UserError);
}

TEST(MeshTest, GroupsAlongAxesFollowMeshOrder) {
  Mesh m = Mesh::create(sizes(2, 2, 1, 1), sizes(1, 2, 1, 1), 2, 4);  // [[0,1,4,5],[2,3,6,7]]
  EXPECT_EQ(m.group_of(4, {Axis::fsdp}), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(m.group_of(6, {Axis::data}), (std::vector<int>{4, 6}));
  EXPECT_EQ(m.index_along(6, {Axis::data}), 1);
  EXPECT_EQ(m.group_of(6, {Axis::data, Axis::fsdp}), (std::vector<int>{0, 1, 4, 5, 2, 3, 6, 7}));
  EXPECT_EQ(m.index_along(6, {Axis::data, Axis::fsdp}), 6);
  EXPECT_EQ(m.groups_along({Axis::data}).size(), 4u);
  EXPECT_EQ(m.groups_along({Axis::tensor}).size(), 8u);
  EXPECT_EQ(m.size_along({Axis::data, Axis::fsdp}), 8);
}

}  // namespace
}  // namespace meshtrain::mesh
