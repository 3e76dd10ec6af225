// visualize_test.cpp — golden pictures of 1-D, 2-D and 3-D tensors on several meshes (multi-host, replicas,
// partial), and the colour switch.
#include "meshtrain/sharding/visualize.hpp"

#include "simulated_devices.hpp"

#include <gtest/gtest.h>

namespace meshtrain::sharding {
namespace {

using mesh::Axis;


// Compares with the golden picture; on a mismatch prints the picture as drawn, to read (or to paste once checked).
void expect_picture(const std::string& drawn, const std::string& golden) {
  EXPECT_TRUE(drawn == golden) << "drawn:\n" << drawn << "golden:\n" << golden;
}

// The input batch with its sequence over context: tiles of rows x sequence blocks, each naming the natural tokens of
// its block (load-balanced order: block r holds chunks r and 2C-1-r), and a line saying so.
TEST(VisualizeTest, InputBatchWithTheSequenceOverContextNamesEachTilesTokens) {
  const mesh::Mesh mesh =
      mesh::Mesh::create(testing::axis_sizes(1, 2, 1, 1), testing::axis_sizes(1, 1, 1, 1, 2), 2, 2);
  expect_picture(render_input_batch(mesh, 2, 8, {}, PartitionSpec::parse("(data,fsdp),context")), R"(input_ids i32[2@(data,fsdp), 8@context] on mesh data=1 x fsdp=2 x tensor=1 x expert=1 x context=2 x pipeline=1 (2 hosts x 2 devices per host)
┌──────────────────────────────────────┬──────────────────────────────────────┐
│              [0:1, 0:4]              │              [0:1, 4:8]              │
│           tokens 0:2, 6:8            │           tokens 2:4, 4:6            │
│ device 0 (host 0, fsdp=0, context=0) │ device 2 (host 1, fsdp=0, context=1) │
├──────────────────────────────────────┼──────────────────────────────────────┤
│              [1:2, 0:4]              │              [1:2, 4:8]              │
│           tokens 0:2, 6:8            │           tokens 2:4, 4:6            │
│ device 1 (host 0, fsdp=1, context=0) │ device 3 (host 1, fsdp=1, context=1) │
└──────────────────────────────────────┴──────────────────────────────────────┘
The sequence is in load-balanced order: block r holds chunks r and 3-r of the row's 4 (tokens under each range).
)");
}

TEST(VisualizeTest, OneDimensionalTensorIsAColumnOfTiles) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 4, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 4);
  expect_picture(render_sharding(mesh, "bias", c10::ScalarType::Float, {16}, PartitionSpec::parse("fsdp")), R"(bias f32[16@fsdp] on mesh data=1 x fsdp=4 x tensor=1 x expert=1 x context=1 x pipeline=1 (1 host x 4 devices per host)
┌───────────────────────────┐
│           [0:4]           │
│ device 0 (host 0, fsdp=0) │
├───────────────────────────┤
│           [4:8]           │
│ device 1 (host 0, fsdp=1) │
├───────────────────────────┤
│          [8:12]           │
│ device 2 (host 0, fsdp=2) │
├───────────────────────────┤
│          [12:16]          │
│ device 3 (host 0, fsdp=3) │
└───────────────────────────┘
)");
}

TEST(VisualizeTest, SeedScenarioInputBatchOnTwoHosts) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  expect_picture(render_input_batch(mesh, 8, 4096), R"(input_ids i32[8@(data,fsdp), 4096] on mesh data=1 x fsdp=8 x tensor=1 x expert=1 x context=1 x pipeline=1 (2 hosts x 4 devices per host)
┌───────────────────────────┐
│       [0:1, 0:4096]       │
│ device 0 (host 0, fsdp=0) │
├───────────────────────────┤
│       [1:2, 0:4096]       │
│ device 1 (host 0, fsdp=1) │
├───────────────────────────┤
│       [2:3, 0:4096]       │
│ device 2 (host 0, fsdp=2) │
├───────────────────────────┤
│       [3:4, 0:4096]       │
│ device 3 (host 0, fsdp=3) │
├───────────────────────────┤
│       [4:5, 0:4096]       │
│ device 4 (host 1, fsdp=4) │
├───────────────────────────┤
│       [5:6, 0:4096]       │
│ device 5 (host 1, fsdp=5) │
├───────────────────────────┤
│       [6:7, 0:4096]       │
│ device 6 (host 1, fsdp=6) │
├───────────────────────────┤
│       [7:8, 0:4096]       │
│ device 7 (host 1, fsdp=7) │
└───────────────────────────┘
)");
}

TEST(VisualizeTest, TwoDimensionalGridListsReplicasTogether) {
  // data=2 x fsdp=2 x tensor=2 on 2 hosts: rows over data, columns over tensor, replicas along fsdp.
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(2, 2, 2, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  expect_picture(render_sharding(mesh, "w", c10::ScalarType::BFloat16, {4, 8}, PartitionSpec::parse("data, tensor")),
                 R"(w bf16[4@data, 8@tensor] on mesh data=2 x fsdp=2 x tensor=2 x expert=1 x context=1 x pipeline=1 (2 hosts x 4 devices per host)
┌─────────────────────────────────────────────┬─────────────────────────────────────────────┐
│                 [0:2, 0:4]                  │                 [0:2, 4:8]                  │
│ device 0 (host 0, data=0, fsdp=0, tensor=0) │ device 1 (host 0, data=0, fsdp=0, tensor=1) │
│ device 2 (host 0, data=0, fsdp=1, tensor=0) │ device 3 (host 0, data=0, fsdp=1, tensor=1) │
├─────────────────────────────────────────────┼─────────────────────────────────────────────┤
│                 [2:4, 0:4]                  │                 [2:4, 4:8]                  │
│ device 4 (host 1, data=1, fsdp=0, tensor=0) │ device 5 (host 1, data=1, fsdp=0, tensor=1) │
│ device 6 (host 1, data=1, fsdp=1, tensor=0) │ device 7 (host 1, data=1, fsdp=1, tensor=1) │
└─────────────────────────────────────────────┴─────────────────────────────────────────────┘
Devices listed under one range hold the same shard (replicas along fsdp).
)");
}

TEST(VisualizeTest, ThreeDimensionalTensorListsTheShardsOfTheLastDimension) {
  // Two slices over fsdp, tensor=2 inside a slice: [4, 6, 8] with rows over fsdp and depth over tensor.
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 1, 2, 1), testing::axis_sizes(1, 2, 1, 1), 2, 2);
  expect_picture(render_sharding(mesh, "x_BTD", c10::ScalarType::Float, {4, 6, 8},
                                 PartitionSpec::parse("fsdp, None, tensor")),
                 R"(x_BTD f32[4@fsdp, 6, 8@tensor] on mesh data=1 x fsdp=2 x tensor=2 x expert=1 x context=1 x pipeline=1 (2 hosts x 2 devices per host)
┌─────────────────────────────────────┐
│           [0:2, 0:6, 0:4]           │
│ device 0 (host 0, fsdp=0, tensor=0) │
│           [0:2, 0:6, 4:8]           │
│ device 1 (host 0, fsdp=0, tensor=1) │
├─────────────────────────────────────┤
│           [2:4, 0:6, 0:4]           │
│ device 2 (host 1, fsdp=1, tensor=0) │
│           [2:4, 0:6, 4:8]           │
│ device 3 (host 1, fsdp=1, tensor=1) │
└─────────────────────────────────────┘
)");
}

TEST(VisualizeTest, PartialScalarListsItsAddends) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 2);
  PartitionSpec loss = PartitionSpec::replicated(0);
  loss.partial = {Axis::fsdp};
  expect_picture(render_sharding(mesh, "loss", c10::ScalarType::Float, {}, loss), R"(loss f32[] partial over fsdp on mesh data=1 x fsdp=2 x tensor=1 x expert=1 x context=1 x pipeline=1 (1 host x 2 devices per host)
┌───────────────────────────┐
│            []             │
│ device 0 (host 0, fsdp=0) │
│ device 1 (host 0, fsdp=1) │
└───────────────────────────┘
Devices listed under one range hold addends of a pending sum over fsdp.
)");
}

TEST(VisualizeTest, ColourOnlyWhenAsked) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 2);
  const std::string plain = render_input_batch(mesh, 2, 4);
  const std::string coloured = render_input_batch(mesh, 2, 4, PictureOptions{true});
  EXPECT_EQ(plain.find('\x1b'), std::string::npos);
  EXPECT_NE(coloured.find("\x1b[48;2;31;119;180m"), std::string::npos);   // tile 0: tab20's first colour
  EXPECT_NE(coloured.find("\x1b[48;2;174;199;232m"), std::string::npos);  // tile 1: its second
}

}  // namespace
}  // namespace meshtrain::sharding
