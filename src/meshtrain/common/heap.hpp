// heap.hpp — handing freed heap memory back to the system.
//
// Tensors of 256 KiB and more live in the block cache (runtime/block_cache_allocator.hpp); smaller buffers come from
// glibc's heap, which main keeps in one arena without automatic trimming. glibc hands memory back to the system only
// from the top of the heap, so the small buffers a step frees in the middle stay resident until trimmed. The
// trainer calls this after each micro-batch's backward and each optimizer step, on one device thread per host (a
// trim covers the whole process).
#pragma once

namespace meshtrain {

// Returns the free pages of every malloc arena to the system (glibc malloc_trim); safe while other threads
// allocate. Costs about a millisecond per call; pages reused later fault in again.
void release_freed_heap_memory();

}  // namespace meshtrain
