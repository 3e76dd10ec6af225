// block_cache_allocator.hpp — the CPU allocator a meshtrain host process installs for libtorch: tensor buffers of
// kLargeBlockBytes and more are mapped blocks kept per size class for reuse, what is kept capped at the process's
// peak of live bytes plus a slack (memory.cache_slack), so resident memory follows the live peak and not the heap's
// fragmentation; smaller requests go to malloc. set_up_process_memory installs it, before any thread starts; not
// under AddressSanitizer, which must see every free. Why, and how it evicts: docs/runtime.md ("Memory:").
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain::runtime {

// Requests of at least this many bytes are mapped blocks. 256 KiB, not more: with activation checkpointing a layer's
// activations are mostly tensors of a few hundred KB (llama-100m, 256 tokens x 768 fp32: 768 KB), which the device
// threads' frees would otherwise fragment in glibc's one arena (BENCHMARKS.md, "Memory per host").
inline constexpr size_t kLargeBlockBytes = size_t{1} << 18;

struct BlockCacheStats {
  size_t live_bytes = 0;         // bytes of the large blocks handed out and not yet freed
  size_t cached_bytes = 0;       // bytes of the large blocks freed and kept mapped for reuse
  size_t peak_live_bytes = 0;    // the most bytes (size classes) live tensors have asked for at once
  size_t peak_mapped_bytes = 0;  // the most live_bytes + cached_bytes has been
  uint64_t reused = 0;           // requests served from the cache
  uint64_t mapped = 0;           // requests that mapped a new block
  uint64_t resized = 0;          // requests served by resizing a cached block of another size (over the cap)
  uint64_t unmapped = 0;         // cached blocks given back to the kernel to stay under the cap
};

// The slack by default: half the live peak, which keeps malloc's step time; a smaller slack lowers the host's peak
// resident memory and costs step time (blocks resized, unmapped and faulted again every step; BENCHMARKS.md, "Memory
// per host").
inline constexpr double kDefaultBlockCacheSlack = 0.5;

// Sets the slack: what the cache may keep mapped beyond the peak of live bytes, as a fraction of that peak (at
// least 64 MiB). Any time; applies from the next request on.
void set_block_cache_slack(double fraction_of_peak);

// Makes the block cache libtorch's CPU allocator for the rest of the process (idempotent). Call before the device
// threads start. Returns false (and changes nothing) in an AddressSanitizer build.
bool install_block_cache_allocator();

// The process's memory set-up, as `meshtrain` (and the benchmarks that time its step) run: small allocations stay
// in glibc's heap, kept rather than handed back (one arena: per-thread arenas dropped and re-faulted whole 64 MB
// heaps; no mmap'd chunks; no trimming, the trainer trims at step boundaries, common/heap.hpp); tensors of 256 KiB and
// more go to the block cache, which keeps them mapped for the next step without letting them fragment the heap.
// MESHTRAIN_CPU_ALLOCATOR=malloc leaves every tensor to malloc (the comparison in BENCHMARKS.md, "Memory per host");
// block_cache (or unset) is the default; any other value is refused: returns false after printing why. Must run
// before any thread starts (M_ARENA_MAX applies to arenas created later).
bool set_up_process_memory();

// The cache's counters (all zero when not installed).
BlockCacheStats block_cache_stats();

// Size class of a large request: rounded up to an eighth of its power of two (at most 12.5% more), in whole pages.
size_t block_size_class(size_t bytes);

}  // namespace meshtrain::runtime
