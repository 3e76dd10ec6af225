// global_tensor_test.cpp — GlobalTensor on simulated devices in one process (one thread per device, Gloo groups
// over an in-memory store): build from host-local data with zero collectives, gather, redistribution, replica
// checks including a corrupted replica, and the check_global_tensors self-check that `commcheck` runs.
#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/host_runtime.hpp"
#include "meshtrain/sharding/global_tensor.hpp"

#include "simulated_devices.hpp"

#include <gtest/gtest.h>

#include <mutex>

namespace meshtrain::sharding {
namespace {

using mesh::Axis;

using testing::expect_no_failures;
using testing::run_on_all_devices;


// The global tensor [rows, cols, depth] holding 0, 1, 2, ...
at::Tensor counting(const Shape& shape) {
  int64_t numel = 1;
  for (int64_t size : shape) numel *= size;
  return at::arange(numel, at::kInt).reshape(shape);
}

// What `host` reads of `full` under `spec`: the blocks its devices need, packed.
at::Tensor host_local_part(const mesh::Mesh& mesh, const at::Tensor& full, const PartitionSpec& spec, int host) {
  const HostLocalLayout layout = host_local_layout(mesh, full.sizes().vec(), spec, host);
  at::Tensor part = full;
  for (int d = 0; d < full.dim(); ++d) part = part.index_select(d, at::tensor(layout.global_indices(d), at::kLong));
  return part;
}

TEST(GlobalTensorTest, FromHostLocalCutsEachDevicesShardOutOfItsHostsData) {
  // Multi-slice mesh, 3-D tensor, dimension 0 over (fsdp, data) and dimension 2 over tensor: no devices needed.
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 2, 1), testing::axis_sizes(2, 1, 1, 1), 4, 2);
  const at::Tensor full = counting({8, 3, 4});
  const PartitionSpec spec = PartitionSpec::parse("(fsdp,data), None, tensor");
  for (int host = 0; host < mesh.hosts(); ++host) {
    const at::Tensor host_local = host_local_part(mesh, full, spec, host);
    for (int device : mesh.devices_of_host(host)) {
      const GlobalTensor tensor = GlobalTensor::from_host_local(mesh, device, {8, 3, 4}, spec, host_local);
      EXPECT_TRUE(at::equal(tensor.local(), GlobalTensor::from_global(mesh, device, full, spec).local()))
          << tensor.placement_string();
    }
  }
}

TEST(GlobalTensorTest, FromHostLocalRejectsDataOfTheWrongShape) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  try {
    GlobalTensor::from_host_local(mesh, 5, {8, 16}, PartitionSpec::parse("fsdp, None"), at::zeros({8, 16}, at::kInt));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("host 1's local data for i32[8@fsdp, 16] has shape [8, 16], expected [4, 16]"),
              std::string::npos) << e.what();
  }
}

TEST(GlobalTensorTest, FromHostLocalBlockRefusesABlockThatIsNotTheDevicesOrDoesNotFit) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const PartitionSpec spec = PartitionSpec::parse("fsdp, None");
  const at::Tensor host_local = counting({4, 16});  // host 1's rows 4..7
  // Device 5 holds row 5, the second of its host's rows.
  const GlobalTensor ok = GlobalTensor::from_host_local_block(mesh, 5, {8, 16}, spec, host_local, {{5, 0}, {1, 16}},
                                                              {1, 0});
  EXPECT_TRUE(at::equal(ok.local(), host_local.narrow(0, 1, 1)));
  EXPECT_THROW(GlobalTensor::from_host_local_block(mesh, 5, {8, 16}, spec, host_local, {{4, 0}, {1, 16}}, {0, 0}),
               Error);  // device 4's block
  EXPECT_THROW(GlobalTensor::from_host_local_block(mesh, 5, {8, 16}, spec, host_local, {{5, 0}, {1, 16}}, {4, 0}),
               Error);  // past the host's rows
}

TEST(GlobalTensorTest, PlacementAndTypeStrings) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const GlobalTensor tensor =
      GlobalTensor::from_global(mesh, 3, counting({8, 4096}), PartitionSpec::sharded_rows(2, {Axis::data, Axis::fsdp}));
  EXPECT_EQ(tensor.type_string(), "i32[8@(data,fsdp), 4096]");
  EXPECT_EQ(tensor.placement_string(), "device 3 (host 0, fsdp=3) holds [3:4, 0:4096]");
}

TEST(GlobalTensorTest, ShardHashSeesValuesAndShape) {
  const at::Tensor a = counting({4, 6});
  at::Tensor b = a.clone();
  EXPECT_EQ(shard_hash(a), shard_hash(b));
  b.view(-1)[23] += 1;
  EXPECT_NE(shard_hash(a), shard_hash(b));
  EXPECT_NE(shard_hash(a), shard_hash(a.reshape({6, 4})));
  EXPECT_EQ(shard_hash(a.t()), shard_hash(a.t().contiguous()));
}

TEST(GlobalTensorTest, SingleDeviceGatherIsTheShardWithoutCommunication) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 1, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 1);
  runtime::DeviceContext ctx = runtime::make_single_device_context(mesh);
  const GlobalTensor tensor = GlobalTensor::from_global(mesh, 0, counting({4, 2}), PartitionSpec::parse("fsdp, None"));
  EXPECT_TRUE(at::equal(tensor.gather(ctx), counting({4, 2})));
  tensor.check_replicas(ctx);
  EXPECT_EQ(ctx.counters().total_calls(), 0);
}

TEST(GlobalTensorTest, CheckGlobalTensorsPassesOnOneDevice) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 1, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 1);
  runtime::DeviceContext ctx = runtime::make_single_device_context(mesh);
  check_global_tensors(ctx);
}

TEST(GlobalTensorTest, BuildIsFreeAndGatherRoundTripsOnEightDevices) {
  // The seed's scenario: 2 hosts x 4 devices, fsdp=8, batch [8, 6] over (data, fsdp).
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 8, 1, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const at::Tensor full = counting({8, 6});
  const PartitionSpec spec = PartitionSpec::sharded_rows(2, {Axis::data, Axis::fsdp});
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    const GlobalTensor batch = GlobalTensor::from_host_local(mesh, ctx.device(), {8, 6}, spec,
                                                             host_local_part(mesh, full, spec, ctx.host()));
    MT_CHECK(ctx.counters().total_calls() == 0, "the build communicated");
    MT_CHECK(at::equal(batch.local(), full.narrow(0, ctx.device(), 1)), "wrong shard");
    MT_CHECK(at::equal(batch.gather(ctx), full), "wrong gather");
    MT_CHECK(ctx.counters().calls(runtime::Collective::allgather) == 1, "the gather is one allgather, got {}",
             ctx.counters().summary());
  }));
}

TEST(GlobalTensorTest, RedistributesBetweenSpecsOnAMultiSliceMesh) {
  // 2 slices over data x (fsdp=2, tensor=2): every change of spec must give the shard from_global gives.
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 2, 1), testing::axis_sizes(2, 1, 1, 1), 2, 4);
  const at::Tensor full = counting({8, 4, 2});
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"(data,fsdp), None, None", "None, None, None"},   // shard -> replicate
      {"None, None, None", "(data,fsdp), tensor, None"},  // replicate -> shard
      {"data, tensor, None", "(data,fsdp), None, None"},  // the new shard inside the old one along dimension 0
      {"fsdp, data, tensor", "data, fsdp, None"},         // axes move between dimensions
      {"None, (fsdp,tensor), None", "None, (tensor,fsdp), None"},  // same axes, other order
  };
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    for (const auto& [from_text, to_text] : changes) {
      const PartitionSpec from = PartitionSpec::parse(from_text), to = PartitionSpec::parse(to_text);
      const GlobalTensor moved = GlobalTensor::from_global(mesh, ctx.device(), full, from).redistribute(ctx, to);
      MT_CHECK(moved.spec() == to, "spec not changed");
      MT_CHECK(at::equal(moved.local(), GlobalTensor::from_global(mesh, ctx.device(), full, to).local()),
               "{} -> {} gave a wrong shard on device {}", from_text, to_text, ctx.device());
    }
  }));
}

TEST(GlobalTensorTest, ReplicateToShardAndShardToFinerShardDoNotCommunicate) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(2, 2, 1, 1), testing::axis_sizes(1, 1, 1, 1), 1, 4);
  const at::Tensor full = counting({4, 4});
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    GlobalTensor::from_global(mesh, ctx.device(), full, PartitionSpec::parse("None, None"))
        .redistribute(ctx, PartitionSpec::parse("data, fsdp"))
        .redistribute(ctx, PartitionSpec::parse("data, (fsdp)"));
    GlobalTensor::from_global(mesh, ctx.device(), full, PartitionSpec::parse("data, None"))
        .redistribute(ctx, PartitionSpec::parse("(data,fsdp), None"));
    MT_CHECK(ctx.counters().total_calls() == 0, "communicated: {}", ctx.counters().summary());
  }));
}

TEST(GlobalTensorTest, PartialToReplicateSumsAndReplicateToPartialKeepsTheSum) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 2, 1), testing::axis_sizes(1, 1, 1, 1), 1, 4);
  const at::Tensor full = counting({4, 3});
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    // Rows over fsdp, a pending sum over tensor: the device at tensor=t holds (t + 1) x its rows.
    PartitionSpec pending = PartitionSpec::parse("fsdp, None");
    pending.partial = {Axis::tensor};
    const int64_t weight = mesh.index_along(ctx.device(), {Axis::tensor}) + 1;
    const GlobalTensor addends(mesh, ctx.device(), {4, 3}, pending,
                               GlobalTensor::from_global(mesh, ctx.device(), full, pending).local() * weight);
    MT_CHECK(at::equal(addends.gather(ctx), full * 3), "gather of a partial tensor must sum");
    const GlobalTensor summed = addends.redistribute(ctx, PartitionSpec::parse("None, None"));
    MT_CHECK(at::equal(summed.local(), full * 3), "partial -> replicate must sum");
    // replicate -> partial: the sum of the addends is the value again.
    const GlobalTensor split = summed.redistribute(ctx, pending);
    MT_CHECK(at::equal(split.gather(ctx), full * 3), "replicate -> partial must keep the sum");
  }));
}

TEST(GlobalTensorTest, ReplicaCheckNamesTheCorruptedDeviceOnEveryReplica) {
  // Rows over fsdp, replicas along tensor: devices 2k and 2k+1 must agree. Device 5 corrupts its copy.
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 4, 2, 1), testing::axis_sizes(1, 1, 1, 1), 2, 4);
  const at::Tensor full = counting({8, 4});
  const PartitionSpec spec = PartitionSpec::parse("fsdp, None");
  const std::vector<std::string> failures = run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    const GlobalTensor good = GlobalTensor::from_global(mesh, ctx.device(), full, spec);
    good.check_replicas(ctx);
    at::Tensor shard = good.local().clone();
    if (ctx.device() == 5) shard.view(-1)[0] = -1;
    GlobalTensor(mesh, ctx.device(), {8, 4}, spec, shard).check_replicas(ctx);
  });
  for (int device = 0; device < 8; ++device) {
    if (device == 4 || device == 5) {
      EXPECT_NE(failures[device].find("replica check failed for i32[8@fsdp, 4] shard [4:6, 0:4]"), std::string::npos)
          << failures[device];
      EXPECT_NE(failures[device].find("devices 5 (host 1)"), std::string::npos) << failures[device];
      EXPECT_NE(failures[device].find("devices 4 (host 1)"), std::string::npos) << failures[device];
    } else {
      EXPECT_EQ(failures[device], "") << "device " << device;
    }
  }
}

TEST(GlobalTensorTest, CheckGlobalTensorsPassesOnTwoSimulatedHostsOfFourDevices) {
  const mesh::Mesh mesh = mesh::Mesh::create(testing::axis_sizes(1, 2, 2, 1), testing::axis_sizes(1, 2, 1, 1), 2, 4);
  expect_no_failures(run_on_all_devices(mesh, [](runtime::DeviceContext& ctx) { check_global_tensors(ctx); }));
}

}  // namespace
}  // namespace meshtrain::sharding
