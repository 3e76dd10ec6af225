// comm_test.cpp — Comm on one device (the solo path every single-device run takes), the collective counters, and
// how a group that cannot form fails. Multi-device results are checked across real host processes in
// multihost_test.cpp.
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/runtime/host_runtime.hpp"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace meshtrain::runtime {
namespace {

TEST(CommTest, SoloCollectivesAreTheIdentityAndAreCounted) {
  mesh::Mesh mesh = mesh::Mesh::create(mesh::AxisSizes{}, mesh::AxisSizes{}, 1, 1);
  DeviceContext ctx = make_single_device_context(mesh);
  Comm& fsdp = ctx.over(mesh::Axis::fsdp);
  EXPECT_EQ(fsdp.size(), 1);
  EXPECT_EQ(fsdp.rank(), 0);
  at::Tensor x = at::arange(6, at::kFloat);
  fsdp.allreduce_sum(x);
  EXPECT_TRUE(at::equal(x, at::arange(6, at::kFloat)));
  EXPECT_TRUE(at::equal(fsdp.allgather(x), x));
  EXPECT_TRUE(at::equal(fsdp.reduce_scatter_sum(x), x));
  EXPECT_TRUE(at::equal(ctx.world().all_to_all(x), x));
  ctx.world().barrier();
  EXPECT_EQ(ctx.counters().calls(Collective::allreduce), 1);
  EXPECT_EQ(ctx.counters().bytes(Collective::allreduce), 24);
  EXPECT_EQ(ctx.counters().total_calls(), 5);
  EXPECT_EQ(ctx.counters().summary(),
            "allreduce 1 call 24 B, allgather 1 call 24 B, reduce_scatter 1 call 24 B, all_to_all 1 call 24 B, "
            "barrier 1 call 0 B");
  EXPECT_EQ(&ctx.over(mesh::Axis::fsdp), &fsdp);  // groups are created once
  EXPECT_EQ(ctx.world().label(), "world");
}

TEST(CommTest, TheFlightRecorderKeepsTheLastCollectivesWithTheirGroupSequence) {
  mesh::Mesh mesh = mesh::Mesh::create(mesh::AxisSizes{}, mesh::AxisSizes{}, 1, 1);
  DeviceContext ctx = make_single_device_context(mesh);
  at::Tensor x = at::ones({4}, at::kFloat);
  for (int i = 0; i < 10; ++i) ctx.over(mesh::Axis::fsdp).allreduce_sum(x);
  ctx.world().barrier();
  const std::vector<CollectiveEntry> recent = ctx.counters().recent();
  ASSERT_EQ(recent.size(), CollectiveCounters::kRecentCollectives);
  EXPECT_EQ(recent.back().group, "world");
  EXPECT_EQ(recent.back().sequence, 1);  // the world group's first collective
  EXPECT_EQ(recent[recent.size() - 2].group, "fsdp");
  EXPECT_EQ(recent[recent.size() - 2].sequence, 10);
  EXPECT_EQ(recent[recent.size() - 2].bytes, 16);
  for (const CollectiveEntry& e : recent) EXPECT_TRUE(e.completed);
  EXPECT_EQ(ctx.counters().calls(Collective::allreduce), 10);
  const std::vector<std::string> lines = ctx.counters().recent_lines();
  EXPECT_EQ(lines.back().rfind("world #1 barrier 0 B: completed", 0), 0u) << lines.back();
}

TEST(CommTest, ACollectiveStillInFlightShowsAsNotCompleted) {
  CollectiveCounters counters;
  const int64_t done = counters.begin("fsdp", Collective::allgather, 41, 1024);
  counters.finish(done, Collective::allgather, 1024, 0.01);
  counters.begin("(data,fsdp)", Collective::allreduce, 7, 8);
  const std::vector<std::string> lines = counters.recent_lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("fsdp #41 allgather 1024 B: completed", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("(data,fsdp) #7 allreduce 8 B: NOT completed, waiting for", 0), 0u) << lines[1];
  EXPECT_EQ(counters.calls(Collective::allgather), 1);
  EXPECT_EQ(counters.calls(Collective::allreduce), 0);  // counted when it completes
}

TEST(DeviceProgressTest, ReportsTheStepAndWhenItWasReached) {
  DeviceProgress progress;
  progress.report(5);
  EXPECT_EQ(progress.step(), 5);
  EXPECT_LT(progress.seconds_since_progress(), 1.0);
}

// A peer (or the coordinator) that dies while a group forms must end the device like a failed collective
// (CollectiveError: the host runtime then waits for its watchdog to name the cause), not as a failure of its own.
TEST(CommTest, AGroupWhosePeerNeverComesFailsAsACollectiveNamingTheGroup) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::milliseconds(300));
  auto factory = gloo_group_factory(store, c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"),
                                    std::make_shared<CollectiveCounters>(), 0.3);
  try {
    factory("fsdp", "fsdp/0", {0, 1}, 0);  // rank 1 never joins
    FAIL() << "a group of 2 formed with 1 member";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("forming the group over fsdp (2 devices, rank 0) failed in the transport"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::runtime
