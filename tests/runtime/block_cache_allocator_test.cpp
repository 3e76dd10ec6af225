// block_cache_allocator_test.cpp — the block cache as libtorch's CPU allocator: size classes, a freed block reused
// by the next tensor of its class, the mapped total capped near the peak of live bytes whatever the sizes, and
// device threads allocating at once never handed the same block. Each test runs in its own process (ctest), so the
// counters start at zero. Not installed under AddressSanitizer (the header says why): those tests skip there.
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
  // of them (930 MiB); with it, what stays mapped is the largest live tensor plus the slack (64 MiB here).
  for (int i = 1; i <= 30; ++i) {
    at::Tensor t = at::empty({static_cast<int64_t>(i) * 2 * static_cast<int64_t>(kMiB) / 4}, at::kFloat);
    t.fill_(1.0f);
  }
  const runtime::BlockCacheStats stats = block_cache_stats();
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_EQ(stats.peak_live_bytes, 60 * kMiB);
  EXPECT_LE(stats.peak_mapped_bytes, stats.peak_live_bytes + 64 * kMiB);
  EXPECT_GT(stats.unmapped, 0u);
  // A repeated pattern is then served from the cache.
  const uint64_t mapped_before = stats.mapped;
  for (int repeat = 0; repeat < 3; ++repeat) at::Tensor t = at::empty({15 * static_cast<int64_t>(kMiB)}, at::kFloat);
  EXPECT_LE(block_cache_stats().mapped, mapped_before + 1);
}

TEST(BlockCacheAllocatorTest, ThreadsAllocatingAtOnceNeverShareABlock) {
  SKIP_UNLESS_INSTALLED();
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id)
    threads.emplace_back([id, &failures] {
      for (int round = 0; round < kRounds; ++round) {
        // Sizes of 1-4 MiB in a few classes shared by all threads, so blocks move between them through the cache.
        const int64_t numel = static_cast<int64_t>(kLargeBlockBytes / 4) * (1 + (round + id) % 4);
        at::Tensor t = at::full({numel}, static_cast<float>(id * kRounds + round));
        std::this_thread::yield();
        if (t.min().item<float>() != t.max().item<float>() ||
            t[numel - 1].item<float>() != static_cast<float>(id * kRounds + round))
          ++failures[id];
      }
    });
  for (std::thread& t : threads) t.join();
  for (int id = 0; id < kThreads; ++id) EXPECT_EQ(failures[id], 0) << "thread " << id;
  const runtime::BlockCacheStats stats = block_cache_stats();
  EXPECT_EQ(stats.live_bytes, 0u);
  EXPECT_GT(stats.reused, 0u);
}

}  // namespace
}  // namespace meshtrain::testing
