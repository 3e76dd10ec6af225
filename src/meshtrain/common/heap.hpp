// heap.hpp — handing freed heap memory back to the system.
//
// libtorch on CPU allocates every tensor with malloc. glibc keeps what is freed inside its heap and reuses it, but
// hands memory back to the system only from the top of the heap: a training step frees gigabytes of activations
// and gathered parameters in an order that leaves them in the middle, so the process's resident memory stays at
// the largest it ever was plus fragmentation. Measured (1 host x 4 devices, llama-100m, fsdp=4, 4 x 128 tokens):
// 4.6 GB resident after a forward pass, 2.7 GB once trimmed; 3.7 GB after the optimizer step, 2.2 GB trimmed. The
// trainer calls this after each micro-batch's backward and each optimizer step; it does not lower the peak inside
// a step (BENCHMARKS.md, "Memory per host").
#pragma once

namespace meshtrain {

// Returns the free pages of every malloc arena to the system (glibc malloc_trim); safe while other threads
// allocate. Costs about a millisecond per call; pages reused later fault in again.
void release_freed_heap_memory();

}  // namespace meshtrain
