// local_group_test.cpp — collectives between device threads of one process through memory (runtime/local_group.hpp):
// every kind gives what Gloo gives, collectives in flight may be waited for in any order and their inputs changed as
// soon as they return, and a member that never arrives fails the others with a CollectiveError naming it.
#include "meshtrain/runtime/local_group.hpp"

#include "../simulated_devices.hpp"

#include <gtest/gtest.h>

namespace meshtrain::runtime {
namespace {

using testing::axis_sizes;

TEST(LocalGroupTest, EveryCollectiveOverTheDevicesOfAHostMatchesGloo) {
  // 2 hosts x 3 devices: fsdp (3 devices of a host) moves through memory, data (one device per host) through Gloo.
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 3, 1, 1), axis_sizes(2, 1, 1, 1), 2, 3);
  testing::expect_no_failures(testing::run_on_all_devices(mesh, [](DeviceContext& ctx) {
    for (mesh::Axis axis : {mesh::Axis::fsdp, mesh::Axis::data}) {
      Comm& group = ctx.over(axis);
      const int n = group.size(), r = group.rank();
      const std::string where = fmt::format("{} rank {}", group.label(), r);
      const at::Tensor mine = at::arange(2 * n, at::kFloat) + 100 * r;  // [n * 2]: chunk j for rank j
      at::Tensor sum = mine.clone();
      group.allreduce_sum(sum);
      EXPECT_TRUE(at::equal(sum, n * at::arange(2 * n, at::kFloat) + 100 * (n * (n - 1) / 2))) << where;
      at::Tensor bf16 = at::full({3}, 1.5 + r, at::kBFloat16);
      group.allreduce_sum(bf16);
      EXPECT_TRUE(at::equal(bf16, at::full({3}, 1.5 * n + n * (n - 1) / 2, at::kBFloat16))) << where;
      std::vector<at::Tensor> expected_gather;
      for (int k = 0; k < n; ++k) expected_gather.push_back(at::full({2}, float(k)));
      EXPECT_TRUE(at::equal(group.allgather(at::full({2}, float(r))), at::cat(expected_gather))) << where;
      EXPECT_TRUE(at::equal(group.reduce_scatter_sum(mine),
                            n * at::arange(2 * r, 2 * r + 2, at::kFloat) + 100 * (n * (n - 1) / 2)))
          << where;
      std::vector<at::Tensor> expected_received;
      for (int k = 0; k < n; ++k) expected_received.push_back(at::arange(2 * r, 2 * r + 2, at::kFloat) + 100 * k);
      EXPECT_TRUE(at::equal(group.all_to_all(mine), at::cat(expected_received))) << where;
      at::Tensor broadcast = at::full({4}, float(r));
      group.broadcast(broadcast, n - 1);
      EXPECT_TRUE(at::equal(broadcast, at::full({4}, float(n - 1)))) << where;
      group.barrier();
    }
  }));
}

TEST(LocalGroupTest, CollectivesInFlightAreWaitedForInAnyOrderAndTheirInputsMayChangeOnReturn) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1), 1, 2);
  testing::expect_no_failures(testing::run_on_all_devices(mesh, [](DeviceContext& ctx) {
    Comm& fsdp = ctx.over(mesh::Axis::fsdp);
    const int r = fsdp.rank();
    for (int round = 0; round < 20; ++round) {
      at::Tensor shard = at::full({3}, float(10 * round + r));
      at::Tensor gradient = at::full({4}, float(round + r));
      PendingCollective gather = fsdp.allgather_async(shard);
      PendingCollective scatter = fsdp.reduce_scatter_sum_async(gradient);
      // One member waits in issue order, the other in reverse; each overwrites its inputs right after its waits.
      at::Tensor gathered, scattered;
      if (r == 0) {
        gathered = gather.wait();
        scattered = scatter.wait();
      } else {
        scattered = scatter.wait();
        gathered = gather.wait();
      }
      shard.fill_(-1);
      gradient.fill_(-1);
      EXPECT_TRUE(at::equal(gathered, at::cat({at::full({3}, 10.f * round), at::full({3}, 10.f * round + 1)})));
      EXPECT_TRUE(at::equal(scattered, at::full({2}, 2.f * round + 1)));
    }
  }));
}

TEST(LocalGroupTest, AMemberThatNeverArrivesFailsTheOthersNamingIt) {
  LocalGroup group("fsdp", 3, 0.2);
  group.post(1, 0, at::ones({1}));
  group.post(1, 2, at::ones({1}));
  try {
    group.read(1, 0);
    FAIL() << "a collective of 3 completed with 2 members";
  } catch (const CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("collective #1 over fsdp (devices of this host) timed out after 0.2 s on "
                                         "rank 0: rank(s) 1 never arrived"),
              std::string::npos)
        << e.what();
  }
  group.post(1, 1, at::ones({1}));  // late: every member can still read it
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(group.read(1, rank).size(), 3u);
}

}  // namespace
}  // namespace meshtrain::runtime
