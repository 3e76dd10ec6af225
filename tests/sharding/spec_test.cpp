// spec_test.cpp — partition specs: parsing, validation messages, shard bounds and host-local layouts against a
// brute-force computation over many meshes (multi-host, multi-slice) and specs, type strings.
#include "meshtrain/common/error.hpp"
#include "meshtrain/sharding/spec.hpp"

#include "simulated_devices.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace meshtrain::sharding {
namespace {

using mesh::Axis;

mesh::Mesh make_mesh(mesh::AxisSizes ici, mesh::AxisSizes dcn, int hosts, int devices_per_host) {
  return mesh::Mesh::create(ici, dcn, hosts, devices_per_host);
}


// The meshes the brute-force checks run on: single device, one host, several hosts, several slices.
std::vector<mesh::Mesh> test_meshes() {
  return {
      make_mesh(testing::axis_sizes(1, 1, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 1),
      make_mesh(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4),
      make_mesh(testing::axis_sizes(2, 2, 2, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4),
      make_mesh(testing::axis_sizes(1, 4, 1, 1), testing::axis_sizes(2, 1, 1, 1), 2, 4),  // two slices over data
      make_mesh(testing::axis_sizes(1, 2, 2, 1), testing::axis_sizes(1, 2, 1, 2), 4, 4),  // four slices over fsdp x expert
      make_mesh(testing::axis_sizes(1, 1, 2, 3), testing::axis_sizes(1, 1, 1, 1), 3, 2),
  };
}

// Brute force, from the definition: along a dimension sharded over axes A, the blocks are ordered by the devices'
// coordinate tuples along A, compared lexicographically (first axis outermost).
ShardBounds brute_force_bounds(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec, int device) {
  ShardBounds bounds;
  for (size_t d = 0; d < shape.size(); ++d) {
    auto tuple_of = [&](int id) {
      std::vector<int> tuple;
      for (Axis axis : spec.dims[d]) tuple.push_back(mesh.device(id).coords[static_cast<int>(axis)]);
      return tuple;
    };
    std::set<std::vector<int>> tuples;
    for (const mesh::DeviceInfo& info : mesh.devices()) tuples.insert(tuple_of(info.device));
    const int64_t block = shape[d] / static_cast<int64_t>(tuples.size());
    const int64_t position = std::distance(tuples.begin(), tuples.find(tuple_of(device)));
    bounds.offset.push_back(position * block);
    bounds.shape.push_back(block);
  }
  return bounds;
}

// A random spec of rank 3: each axis goes to a random dimension (in random order), to partial, or unused.
PartitionSpec random_spec(std::mt19937& rng) {
  PartitionSpec spec = PartitionSpec::replicated(3);
  std::vector<Axis> axes(mesh::kAllAxes.begin(), mesh::kAllAxes.end());
  std::shuffle(axes.begin(), axes.end(), rng);
  for (Axis axis : axes) {
    const int where = std::uniform_int_distribution<int>(0, 4)(rng);
    if (where < 3) spec.dims[where].push_back(axis);
    if (where == 3) spec.partial.push_back(axis);
  }
  return spec;
}

TEST(PartitionSpecTest, ParsesEveryNotation) {
  const PartitionSpec expected{{{Axis::data, Axis::fsdp}, {}}, {}};
  EXPECT_EQ(PartitionSpec::parse("(data,fsdp),None"), expected);
  EXPECT_EQ(PartitionSpec::parse(" ( data , fsdp ) , null "), expected);
  EXPECT_EQ(PartitionSpec::parse("[[data, fsdp], null]"), expected);
  EXPECT_EQ(PartitionSpec::parse("[fsdp, null]"), (PartitionSpec{{{Axis::fsdp}, {}}, {}}));
  EXPECT_EQ(PartitionSpec::parse("None, tensor, ()"), (PartitionSpec{{{}, {Axis::tensor}, {}}, {}}));
  EXPECT_EQ(PartitionSpec::parse("(fsdp)"), (PartitionSpec{{{Axis::fsdp}}, {}}));
  EXPECT_EQ(PartitionSpec::parse("").rank(), 0);
  EXPECT_EQ(PartitionSpec::parse("(data,fsdp),None").to_string(), "[(data,fsdp), None]");
  PartitionSpec partial = PartitionSpec::replicated(1);
  partial.partial = {Axis::tensor};
  EXPECT_EQ(partial.to_string(), "[None] partial over tensor");
}

TEST(PartitionSpecTest, RejectsUnknownAxesAndEmptyEntries) {
  try {
    PartitionSpec::parse("(data,fsdq),None");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown mesh axis \"fsdq\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(PartitionSpec::parse("data,,None"), UserError);
}

TEST(PartitionSpecTest, ReplicaAxesAreTheUnusedOnes) {
  PartitionSpec spec = PartitionSpec::parse("fsdp, None");
  spec.partial = {Axis::expert};
  EXPECT_EQ(spec.replica_axes(), (std::vector<Axis>{Axis::data, Axis::tensor, Axis::context, Axis::pipeline}));
}

TEST(CheckSpecTest, NonDivisibleDimensionNamesDimensionSizeAxesAndProduct) {
  const mesh::Mesh mesh = make_mesh(testing::axis_sizes(2, 4, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  try {
    check_spec(mesh, {6, 4096}, PartitionSpec::parse("(data,fsdp), None"));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("dimension 0 of size 6 over (data,fsdp): (data,fsdp) = 8 does not divide 6"),
              std::string::npos) << message;
  }
}

TEST(CheckSpecTest, RejectsWrongRankAndRepeatedAxes) {
  const mesh::Mesh mesh = make_mesh(testing::axis_sizes(1, 2, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 2);
  EXPECT_THROW(check_spec(mesh, {4, 4}, PartitionSpec::parse("fsdp")), UserError);
  EXPECT_THROW(check_spec(mesh, {4, 4}, PartitionSpec::parse("fsdp, fsdp")), UserError);
  PartitionSpec partial_twice = PartitionSpec::parse("fsdp, None");
  partial_twice.partial = {Axis::fsdp};
  EXPECT_THROW(check_spec(mesh, {4, 4}, partial_twice), UserError);
}

TEST(ShardBoundsTest, MatchesBruteForceOnManyMeshesAndSpecs) {
  std::mt19937 rng(7);
  int checked = 0;
  for (const mesh::Mesh& mesh : test_meshes()) {
    for (int trial = 0; trial < 60; ++trial) {
      const PartitionSpec spec = random_spec(rng);
      Shape shape;
      for (int d = 0; d < 3; ++d)
        shape.push_back(mesh.size_along(spec.dims[d]) * std::uniform_int_distribution<int>(1, 3)(rng));
      check_spec(mesh, shape, spec);
      // Every element is held by exactly (devices / distinct shards) devices, and bounds match the brute force.
      const int64_t shards = mesh.size_along(spec.dims[0]) * mesh.size_along(spec.dims[1]) *
                             mesh.size_along(spec.dims[2]);
      std::vector<int> holders(shape[0] * shape[1] * shape[2], 0);
      for (const mesh::DeviceInfo& info : mesh.devices()) {
        const ShardBounds bounds = shard_bounds(mesh, shape, spec, info.device);
        ASSERT_EQ(bounds, brute_force_bounds(mesh, shape, spec, info.device))
            << "device " << info.device << " spec " << spec.to_string() << " shape " << shape_text(shape);
        for (int64_t i = 0; i < bounds.shape[0]; ++i)
          for (int64_t j = 0; j < bounds.shape[1]; ++j)
            for (int64_t k = 0; k < bounds.shape[2]; ++k)
              ++holders[((bounds.offset[0] + i) * shape[1] + bounds.offset[1] + j) * shape[2] + bounds.offset[2] + k];
      }
      for (int count : holders) ASSERT_EQ(count, mesh.num_devices() / shards) << spec.to_string();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 360);
}

TEST(HostLocalLayoutTest, HoldsExactlyTheIndicesTheHostsDevicesNeed) {
  std::mt19937 rng(11);
  for (const mesh::Mesh& mesh : test_meshes()) {
    for (int trial = 0; trial < 30; ++trial) {
      const PartitionSpec spec = random_spec(rng);
      Shape shape;
      for (int d = 0; d < 3; ++d) shape.push_back(mesh.size_along(spec.dims[d]) * 2);
      for (int host = 0; host < mesh.hosts(); ++host) {
        const HostLocalLayout layout = host_local_layout(mesh, shape, spec, host);
        for (int d = 0; d < 3; ++d) {
          std::set<int64_t> needed;
          for (int device : mesh.devices_of_host(host)) {
            const ShardBounds bounds = shard_bounds(mesh, shape, spec, device);
            for (int64_t i = 0; i < bounds.shape[d]; ++i) needed.insert(bounds.offset[d] + i);
          }
          EXPECT_EQ(layout.global_indices(d), std::vector<int64_t>(needed.begin(), needed.end()))
              << "host " << host << " dimension " << d << " spec " << spec.to_string();
          EXPECT_EQ(layout.shape()[d], static_cast<int64_t>(needed.size()));
        }
      }
    }
  }
}

TEST(HostLocalLayoutTest, SeedScenarioEachHostReadsItsFourRows) {
  // 2 hosts x 4 devices, fsdp=8, batch [8, 4096] over (data, fsdp): device k holds row k.
  const mesh::Mesh mesh = make_mesh(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const PartitionSpec spec = PartitionSpec::sharded_rows(2, {Axis::data, Axis::fsdp});
  for (int device = 0; device < 8; ++device)
    EXPECT_EQ(shard_bounds(mesh, {8, 4096}, spec, device), (ShardBounds{{device, 0}, {1, 4096}}));
  const HostLocalLayout host1 = host_local_layout(mesh, {8, 4096}, spec, 1);
  EXPECT_EQ(host1.shape(), (Shape{4, 4096}));
  EXPECT_EQ(host1.global_indices(0), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(host1.local_offset(shard_bounds(mesh, {8, 4096}, spec, 6)), (Shape{2, 0}));
}

TEST(HostLocalLayoutTest, TensorParallelReplicasAreReadOncePerHost) {
  // fsdp=4 x tensor=2 on 2 hosts x 4 devices: devices 2k and 2k+1 hold the same rows; each host reads its 4 rows once.
  const mesh::Mesh mesh = make_mesh(testing::axis_sizes(1, 4, 2, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const PartitionSpec spec = PartitionSpec::sharded_rows(2, {Axis::data, Axis::fsdp});
  const HostLocalLayout host0 = host_local_layout(mesh, {8, 16}, spec, 0);
  EXPECT_EQ(host0.global_indices(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(host0.local_offset(shard_bounds(mesh, {8, 16}, spec, 3)), (Shape{2, 0}));
}

TEST(HostLocalLayoutTest, MultiSliceBlocksArePackedInGlobalOrder) {
  // Two slices over data; rows over (fsdp, data): device with fsdp=f on slice s holds block 2f+s, so host 0 (slice
  // 0) holds the even rows, packed densely.
  const mesh::Mesh mesh = make_mesh(testing::axis_sizes(1, 4, 1, 1), testing::axis_sizes(2, 1, 1, 1), 2, 4);
  const PartitionSpec spec = PartitionSpec::sharded_rows(2, {Axis::fsdp, Axis::data});
  const HostLocalLayout host0 = host_local_layout(mesh, {8, 2}, spec, 0);
  EXPECT_EQ(host0.global_indices(0), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(host0.local_offset(shard_bounds(mesh, {8, 2}, spec, 2)), (Shape{2, 0}));  // device 2 holds row 4
}

TEST(TypeStringTest, NamesShapeAndPlacement) {
  EXPECT_EQ(type_string(c10::ScalarType::Int, {8, 4096}, PartitionSpec::parse("(data,fsdp), None")),
            "i32[8@(data,fsdp), 4096]");
  EXPECT_EQ(type_string(c10::ScalarType::BFloat16, {4096, 1024}, PartitionSpec::parse("fsdp, tensor")),
            "bf16[4096@fsdp, 1024@tensor]");
  PartitionSpec loss = PartitionSpec::replicated(0);
  loss.partial = {Axis::data, Axis::fsdp};
  EXPECT_EQ(type_string(c10::ScalarType::Float, {}, loss), "f32[] partial over (data,fsdp)");
}

TEST(ParseShapeTest, ParsesListsAndRejectsNonNumbers) {
  EXPECT_EQ(parse_shape("8,4096"), (Shape{8, 4096}));
  EXPECT_EQ(parse_shape("[4, 16, 2]"), (Shape{4, 16, 2}));
  EXPECT_EQ(parse_shape(""), Shape{});
  EXPECT_THROW(parse_shape("8,x"), UserError);
  EXPECT_THROW(parse_shape("8,-1"), UserError);
}

}  // namespace
}  // namespace meshtrain::sharding
