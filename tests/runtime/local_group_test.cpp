// local_group_test.cpp — collectives between device threads of one process through memory (runtime/local_group.hpp),
// alone and as the on-host level of a group split across hosts (runtime/comm.hpp HostSplit): every kind gives what
// it must, collectives in flight may be waited for in any order and their inputs changed as soon as they return, and
// a member that never arrives fails the others with a CollectiveError naming it.
#include "meshtrain/runtime/local_group.hpp"

#include "../simulated_devices.hpp"

#include <gtest/gtest.h>

namespace meshtrain::runtime {
namespace {

using testing::axis_sizes;

// Every collective kind over `group`, checked against what it must give.
void expect_every_collective_correct(Comm& group) {
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
  for (int k = 0; k < n; ++k) expected_gather.push_back(at::full({2, 3}, float(k)));
  EXPECT_TRUE(at::equal(group.allgather(at::full({2, 3}, float(r))), at::cat(expected_gather))) << where;
  EXPECT_TRUE(at::equal(group.allgather(at::full({2, 3}, float(r), at::kBFloat16)),
                        at::cat(expected_gather).to(at::kBFloat16)))
      << where;
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

TEST(LocalGroupTest, EveryCollectiveOverTheDevicesOfAHostMatchesGloo) {
  // 2 hosts x 3 devices: fsdp (3 devices of a host) moves through memory, data (one device per host) through Gloo,
  // and the world (3 devices on each of 2 hosts) in two levels.
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 3, 1, 1), axis_sizes(2, 1, 1, 1), 2, 3);
  testing::expect_no_failures(testing::run_on_all_devices(mesh, [](DeviceContext& ctx) {
    for (mesh::Axis axis : {mesh::Axis::fsdp, mesh::Axis::data}) expect_every_collective_correct(ctx.over(axis));
    expect_every_collective_correct(ctx.world());
  }));
}

TEST(LocalGroupTest, AGroupSplitOverHostsWhoseRanksAlternateBetweenThemGivesEachRankItsOwnChunk) {
  // 2 hosts x 2 devices with the hosts along the inner tensor axis: the world's ranks alternate host 0, host 1, ...
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 2, 1), 2, 2);
  ASSERT_NE(mesh.device(mesh.group_of(0, {mesh::Axis::fsdp, mesh::Axis::tensor})[1]).host, 0);
  testing::expect_no_failures(testing::run_on_all_devices(mesh, [](DeviceContext& ctx) {
    expect_every_collective_correct(ctx.world());
    expect_every_collective_correct(ctx.over({mesh::Axis::fsdp, mesh::Axis::tensor}));
  }));
}

// Members wait for collectives in flight in different orders, and overwrite their inputs as soon as they return:
// over the devices of one host and over a group split across 2 hosts x 2 devices.
TEST(LocalGroupTest, CollectivesInFlightAreWaitedForInAnyOrderAndTheirInputsMayChangeOnReturn) {
  for (const mesh::Mesh& mesh : {mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1), 1, 2),
                                 mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 2, 1, 1), 2, 2)}) {
    testing::expect_no_failures(testing::run_on_all_devices(mesh, [](DeviceContext& ctx) {
      Comm& fsdp = ctx.over(mesh::Axis::fsdp);
      const int n = fsdp.size(), r = fsdp.rank();
      for (int round = 0; round < 20; ++round) {
        at::Tensor shard = at::full({3}, float(10 * round + r));
        at::Tensor next_shard = at::full({3}, float(-10 * round - r));
        at::Tensor gradient = at::full({2 * n}, float(round + r));
        PendingCollective gather = fsdp.allgather_async(shard);
        PendingCollective scatter = fsdp.reduce_scatter_sum_async(gradient);
        PendingCollective next_gather = fsdp.allgather_async(next_shard);
        // Even ranks wait in issue order, odd ones in reverse; each overwrites its inputs right after its waits.
        at::Tensor gathered, scattered, next_gathered;
        if (r % 2 == 0) {
          gathered = gather.wait();
          scattered = scatter.wait();
          next_gathered = next_gather.wait();
        } else {
          next_gathered = next_gather.wait();
          scattered = scatter.wait();
          gathered = gather.wait();
        }
        shard.fill_(-1);
        next_shard.fill_(-1);
        gradient.fill_(-1);
        std::vector<at::Tensor> expected_gather, expected_next_gather;
        for (int k = 0; k < n; ++k) {
          expected_gather.push_back(at::full({3}, 10.f * round + k));
          expected_next_gather.push_back(at::full({3}, -10.f * round - k));
        }
        EXPECT_TRUE(at::equal(gathered, at::cat(expected_gather)));
        EXPECT_TRUE(at::equal(next_gathered, at::cat(expected_next_gather)));
        EXPECT_TRUE(at::equal(scattered, at::full({2}, float(n * round + n * (n - 1) / 2))));
      }
    }));
  }
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
