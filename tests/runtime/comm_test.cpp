// comm_test.cpp — Comm on one device (the solo path every single-device run takes) and the collective counters.
// Multi-device results are checked across real host processes in multihost_test.cpp.
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace meshtrain::runtime
