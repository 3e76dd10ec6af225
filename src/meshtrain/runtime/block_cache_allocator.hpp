// block_cache_allocator.hpp — the CPU allocator a meshtrain host process installs for libtorch: large tensor
// buffers are mapped blocks kept for reuse, bounded by the process's peak of live bytes.
//
// Why (BENCHMARKS.md, "Memory per host"): libtorch on CPU takes every tensor from malloc. Kept in glibc's heap, the
// gigabytes a step frees (activations, gathered units, logits) stay resident and fragment between device threads
// (heaptrack: 3.7 GB live, 6.6 GB resident at fsdp=4); handed back to the kernel instead (glibc's mmap chunks),
// every step page-faults them in again (a third of a llama-10m step). This allocator keeps freed large blocks mapped
// in per-size classes, so the next step reuses them without faults, and caps what it keeps: when a request misses
// the cache and the mapped total would pass the peak of live bytes plus a slack (a fraction of the peak,
// memory.cache_slack: half by default), it resizes the cached block closest in size to the request (mremap: its
// resident pages serve again, only the growth faults) and unmaps the least recently freed blocks while still over.
// Resident memory then follows the live peak, not its fragmentation.
//
// Requests below kLargeBlockBytes go to libtorch's own allocator (malloc). Not installed under AddressSanitizer,
// which must see every buffer's free to find a use after it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain::runtime {

// Requests of at least this many bytes are mapped blocks. 256 KiB, not more: with activation checkpointing a layer's
// activations are mostly tensors of a few hundred KB (llama-100m, 256 tokens x 768 fp32: 768 KB), and in glibc's one
// arena the four device threads' frees of those left a 350 MB heap of which 44 MB were in use (BENCHMARKS.md,
// "Memory per host").
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

// The slack by default: half the live peak. Measured on llama-100m at fsdp=4 (1 host x 4 device threads, 4 steps,
// BENCHMARKS.md "Memory per host"): a half keeps malloc's step time; an eighth lowers the host's peak resident
// memory by 0.46-0.57 GB and costs 0-23% step time (blocks resized, unmapped and faulted again every step).
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
