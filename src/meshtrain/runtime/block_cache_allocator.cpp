// block_cache_allocator.cpp — the block cache behind libtorch's CPU allocator (the header says why and how).
#include "meshtrain/runtime/block_cache_allocator.hpp"

#include "meshtrain/common/error.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace meshtrain::runtime {
namespace {

constexpr size_t kPageBytes = 4096;

// Beyond the peak of live bytes, the cache may keep this fraction of it mapped (at least 64 MiB):
// set_block_cache_slack(), the config's memory.cache_slack.
std::atomic<double> slack_fraction{kDefaultBlockCacheSlack};

size_t cache_slack(size_t peak_live_bytes) {
  return std::max(static_cast<size_t>(static_cast<double>(peak_live_bytes) * slack_fraction.load()),
                  size_t{64} << 20);
}

// A miss may take a cached block up to this factor larger than its class instead of mapping a new one.
constexpr size_t kLargerBlockFactor = 2;

class BlockCache {
 public:
  void* allocate(size_t bytes) {
    const size_t size = block_size_class(bytes);
    std::vector<Block> to_unmap;
    std::optional<Block> resizing;  // a cached block given this request's size
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requested_live_bytes_ += size;
      stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, requested_live_bytes_);
      const size_t cap = stats_.peak_live_bytes + cache_slack(stats_.peak_live_bytes);
      // The smallest cached block that fits serves if it is at most twice the size (the bytes it wastes are
      // resident already; unmapping and mapping would cost page faults).
      const auto cached = free_blocks_.lower_bound(size);
      if (cached != free_blocks_.end() && cached->first <= size * kLargerBlockFactor) {
        const Block block = take_newest(cached);
        live_blocks_.emplace(block.data, LiveBlock{block.size, size});
        stats_.live_bytes += block.size;
        ++stats_.reused;
        return block.data;
      }
      // Over the cap, the cached block closest in size is resized to this request rather than unmapped: its
      // resident pages serve again (mremap moves them, no copy, no fault), only the growth is faulted in.
      if (stats_.cached_bytes > 0 && stats_.live_bytes + stats_.cached_bytes + size > cap)
        resizing = take_closest_in_size(size);
      while (stats_.cached_bytes > 0 && stats_.live_bytes + stats_.cached_bytes + size > cap)
        to_unmap.push_back(take_least_recently_freed());
      ++(resizing ? stats_.resized : stats_.mapped);
      stats_.unmapped += to_unmap.size();
      // Counted as live before mapping, so that concurrent misses see each other under the cap.
      stats_.live_bytes += size;
      stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.live_bytes + stats_.cached_bytes);
    }
    for (const Block& block : to_unmap) ::munmap(block.data, block.size);
    void* data = MAP_FAILED;
    if (resizing) {
      data = ::mremap(resizing->data, resizing->size, size, MREMAP_MAYMOVE);
      if (data == MAP_FAILED) ::munmap(resizing->data, resizing->size);
    }
    if (data == MAP_FAILED) data = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::lock_guard<std::mutex> lock(mutex_);
    if (data == MAP_FAILED) {
      stats_.live_bytes -= size;
      requested_live_bytes_ -= size;
      throw Error(fmt::format("out of memory: could not map {} MB for a tensor ({} MB live in large tensors, {} MB "
                              "at the peak); the memory plan at start-up says what would make the job fit",
                              size >> 20, stats_.live_bytes >> 20, stats_.peak_live_bytes >> 20));
    }
    live_blocks_.emplace(data, LiveBlock{size, size});
    return data;
  }

  // Takes back a block this cache handed out; false when `data` is not one of them.
  bool release(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto live = live_blocks_.find(data);
    if (live == live_blocks_.end()) return false;
    const Block block{data, live->second.size, ++free_clock_};
    stats_.live_bytes -= block.size;
    requested_live_bytes_ -= live->second.requested;
    live_blocks_.erase(live);
    stats_.cached_bytes += block.size;
    free_blocks_[block.size].push_back(block);
    return true;
  }

  BlockCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  struct Block {
    void* data;
    size_t size;
    uint64_t freed_at;  // free_clock_ when it was freed
  };
  struct LiveBlock {
    size_t size;
    size_t requested;  // the size class asked for (a larger cached block may serve it)
  };

  // Removes the most recently freed block of a size (its pages are the likeliest to be in the CPU caches).
  Block take_newest(std::map<size_t, std::deque<Block>>::iterator size_list) {
    const Block block = size_list->second.back();
    size_list->second.pop_back();
    if (size_list->second.empty()) free_blocks_.erase(size_list);
    stats_.cached_bytes -= block.size;
    return block;
  }

  // Removes the cached block whose size is nearest `size` (the largest below it or the smallest above it).
  Block take_closest_in_size(size_t size) {
    auto closest = free_blocks_.lower_bound(size);
    if (closest == free_blocks_.end() ||
        (closest != free_blocks_.begin() && size - std::prev(closest)->first < closest->first - size))
      closest = std::prev(closest);
    return take_newest(closest);
  }

  // Removes the cached block freed longest ago (each size's list is in freeing order: its front is its oldest).
  Block take_least_recently_freed() {
    auto oldest = free_blocks_.begin();
    for (auto it = free_blocks_.begin(); it != free_blocks_.end(); ++it)
      if (it->second.front().freed_at < oldest->second.front().freed_at) oldest = it;
    const Block block = oldest->second.front();
    oldest->second.pop_front();
    if (oldest->second.empty()) free_blocks_.erase(oldest);
    stats_.cached_bytes -= block.size;
    return block;
  }

  std::mutex mutex_;
  std::map<size_t, std::deque<Block>> free_blocks_;  // by size: blocks kept mapped, oldest first
  std::unordered_map<void*, LiveBlock> live_blocks_;  // blocks handed out, by address
  size_t requested_live_bytes_ = 0;                   // the size classes asked for by the live blocks
  uint64_t free_clock_ = 0;
  BlockCacheStats stats_;
};

BlockCache& block_cache() {
  static BlockCache* cache = new BlockCache;  // never destroyed: tensors may be freed during static destruction
  return *cache;
}

std::atomic<bool> installed{false};

void release_buffer(void* data) {
  if (data == nullptr) return;
  // Mapped blocks are page-aligned; a malloc'd buffer can be too, by chance, and then misses the lookup.
  if (reinterpret_cast<uintptr_t>(data) % kPageBytes == 0 && block_cache().release(data)) return;
  c10::free_cpu(data);
}

struct BlockCacheAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) const override {
    void* data = bytes >= kLargeBlockBytes ? block_cache().allocate(bytes) : c10::alloc_cpu(bytes);
    return {data, data, &release_buffer, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_buffer; }
};

}  // namespace

size_t block_size_class(size_t bytes) {
  size_t power = kPageBytes;
  while (power * 2 <= bytes) power *= 2;
  const size_t step = std::max(power / 8, kPageBytes);
  return (bytes + step - 1) / step * step;
}

bool install_block_cache_allocator() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#else
  static BlockCacheAllocator allocator;
  if (!installed.exchange(true)) c10::SetCPUAllocator(&allocator, /*priority=*/1);
  return true;
#endif
}

bool set_up_process_memory() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
  const char* allocator = std::getenv("MESHTRAIN_CPU_ALLOCATOR");
  if (allocator != nullptr && !std::strcmp(allocator, "malloc")) return true;
  if (allocator != nullptr && std::strcmp(allocator, "block_cache") != 0) {
    std::fprintf(stderr,
                 "meshtrain: error: MESHTRAIN_CPU_ALLOCATOR='%s': expected block_cache (the default) or malloc\n",
                 allocator);
    return false;
  }
  install_block_cache_allocator();
  return true;
}

void set_block_cache_slack(double fraction_of_peak) {
  MT_CHECK(fraction_of_peak >= 0, "the block cache's slack is a fraction of the live peak, got {}", fraction_of_peak);
  slack_fraction = fraction_of_peak;
}

BlockCacheStats block_cache_stats() { return installed ? block_cache().stats() : BlockCacheStats{}; }

}  // namespace meshtrain::runtime
