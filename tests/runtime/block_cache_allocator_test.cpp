// block_cache_allocator_test.cpp — the block cache as libtorch's CPU allocator: size classes, a freed block reused
// by the next tensor of its class, a cached block resized to a request over the cap, the mapped total capped near
// the peak of live bytes whatever the sizes, and device threads allocating or resizing at once never handed the same
// block. Each test runs in its own process (ctest, `make test-tsan` too), so the counters start at zero. Not installed under AddressSanitizer (the header says why): those tests skip there.
#include "meshtrain/runtime/block_cache_allocator.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <vector>

namespace meshtrain::testing {
namespace {

using runtime::block_cache_stats;
using runtime::block_size_class;
using runtime::kLargeBlockBytes;

constexpr size_t kMiB = size_t{1} << 20;

#define SKIP_UNLESS_INSTALLED() \
  if (!runtime::install_block_cache_allocator()) GTEST_SKIP() << "not installed under AddressSanitizer"

TEST(BlockCacheAllocatorTest, SizeClassesAreWholePagesAtMostAnEighthLarger) {
  EXPECT_EQ(block_size_class(kMiB), kMiB);
  EXPECT_EQ(block_size_class(kMiB + 1), kMiB + kMiB / 8);
  EXPECT_EQ(block_size_class(3 * kMiB), 3 * kMiB);
  size_t previous = 0;
  for (size_t bytes = kMiB; bytes < 600 * kMiB; bytes = bytes * 9 / 8 + 4093) {
    const size_t size = block_size_class(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_LE(size, bytes + bytes / 8 + 4096) << bytes;
    EXPECT_EQ(size % 4096, 0u) << bytes;
    EXPECT_GE(size, previous) << bytes;
    previous = size;
  }
}

TEST(BlockCacheAllocatorTest, AFreedBlockServesTheNextTensorOfItsClassWithItsValues) {
  SKIP_UNLESS_INSTALLED();
  void* first = nullptr;
  {
    at::Tensor a = at::full({1 << 20}, 3.0f);  // 4 MiB
    first = a.data_ptr();
    EXPECT_EQ(a.sum().item<float>(), 3.0f * (1 << 20));
  }
  const runtime::BlockCacheStats after_free = block_cache_stats();
  EXPECT_EQ(after_free.live_bytes, 0u);
  EXPECT_EQ(after_free.cached_bytes, 4 * kMiB);
  at::Tensor b = at::full({1 << 20}, 5.0f);
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(b.sum().item<float>(), 5.0f * (1 << 20));
  EXPECT_EQ(block_cache_stats().reused, after_free.reused + 1);
  at::Tensor small = at::ones({1000});  // below kLargeBlockBytes: malloc, not counted
  EXPECT_EQ(block_cache_stats().live_bytes, 4 * kMiB);
}

TEST(BlockCacheAllocatorTest, MappedBytesStayNearThePeakOfLiveBytesWhateverTheSizes) {
  SKIP_UNLESS_INSTALLED();
  // 30 tensors of distinct sizes (2-60 MiB), each freed before the next: without the cap the cache would keep all
  // of them (930 MiB); with it, what stays mapped is the largest live tensor plus the slack (64 MiB here): over the
  // cap, a cached block is resized to the request.
  for (int i = 1; i <= 30; ++i) {
    at::Tensor t = at::empty({static_cast<int64_t>(i) * 2 * static_cast<int64_t>(kMiB) / 4}, at::kFloat);
    t.fill_(1.0f);
  }
  const runtime::BlockCacheStats stats = block_cache_stats();
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_EQ(stats.peak_live_bytes, 60 * kMiB);
  EXPECT_LE(stats.peak_mapped_bytes, stats.peak_live_bytes + 64 * kMiB);
  EXPECT_GT(stats.resized, 0u);  // each larger tensor grows the block the last one freed
  // A repeated pattern is then served from the cache.
  const uint64_t mapped_before = stats.mapped;
  for (int repeat = 0; repeat < 3; ++repeat) at::Tensor t = at::empty({15 * static_cast<int64_t>(kMiB)}, at::kFloat);
  EXPECT_LE(block_cache_stats().mapped, mapped_before + 1);
}

TEST(BlockCacheAllocatorTest, OverTheCapACachedBlockIsResizedToTheRequestInsteadOfMappingAnother) {
  SKIP_UNLESS_INSTALLED();
  runtime::set_block_cache_slack(0);  // the cap: the live peak plus 64 MiB
  { at::Tensor t = at::full({static_cast<int64_t>(100 * kMiB / 4)}, 1.0f); }  // 100 MiB, then cached
  const runtime::BlockCacheStats before = block_cache_stats();
  // 0 live + 100 cached + 120 asked > 100 + 64: the cached block becomes the 120 MiB one.
  at::Tensor larger = at::full({static_cast<int64_t>(120 * kMiB / 4)}, 2.0f);
  const runtime::BlockCacheStats after = block_cache_stats();
  EXPECT_EQ(after.resized, before.resized + 1);
  EXPECT_EQ(after.mapped, before.mapped);
  EXPECT_EQ(after.unmapped, before.unmapped);
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.live_bytes, 120 * kMiB);
  EXPECT_LE(after.peak_mapped_bytes, after.peak_live_bytes + 64 * kMiB);
  EXPECT_EQ(larger.sum().item<double>(), 2.0 * (120 * kMiB / 4));
  runtime::set_block_cache_slack(runtime::kDefaultBlockCacheSlack);
}

// 4 threads allocate, fill and check tensors of `classes` sizes (multiples of `unit_bytes`) shared by all threads,
// so that blocks move between them through the cache; returns the failures per thread.
std::vector<int> fill_and_check_from_threads(size_t unit_bytes, int classes, int rounds) {
  constexpr int kThreads = 4;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id)
    threads.emplace_back([=, &failures] {
      for (int round = 0; round < rounds; ++round) {
        const int64_t numel = static_cast<int64_t>(unit_bytes / 4) * (1 + (round * 7 + id) % classes);
        const auto value = static_cast<float>(id * rounds + round);
        at::Tensor t = at::full({numel}, value);
        std::this_thread::yield();
        if (t.min().item<float>() != value || t.max().item<float>() != value || t[numel - 1].item<float>() != value)
          ++failures[id];
      }
    });
  for (std::thread& t : threads) t.join();
  return failures;
}

TEST(BlockCacheAllocatorTest, ThreadsAllocatingAtOnceNeverShareABlock) {
  SKIP_UNLESS_INSTALLED();
  const std::vector<int> failures = fill_and_check_from_threads(kLargeBlockBytes, 4, 200);  // 1-4 MiB
  for (size_t id = 0; id < failures.size(); ++id) EXPECT_EQ(failures[id], 0) << "thread " << id;
  const runtime::BlockCacheStats stats = block_cache_stats();
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_GT(stats.reused, 0u);
}

TEST(BlockCacheAllocatorTest, ThreadsResizingCachedBlocksAtOnceNeverShareOne) {
  SKIP_UNLESS_INSTALLED();
  runtime::set_block_cache_slack(0);
  // 8-96 MiB in 12 classes: 4 threads' freed blocks pass the cap (the live peak plus 64 MiB) and get resized.
  const std::vector<int> failures = fill_and_check_from_threads(8 * kMiB, 12, 60);
  for (size_t id = 0; id < failures.size(); ++id) EXPECT_EQ(failures[id], 0) << "thread " << id;
  const runtime::BlockCacheStats stats = block_cache_stats();
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_GT(stats.resized, 0u);
  EXPECT_LE(stats.peak_mapped_bytes, stats.peak_live_bytes + 64 * kMiB + 4 * 96 * kMiB);
  runtime::set_block_cache_slack(runtime::kDefaultBlockCacheSlack);
}

}  // namespace
}  // namespace meshtrain::testing
