// compute_threads.hpp — the thread counts of the compute pools a device thread calls into, set from
// runtime.threads_per_device so that the devices of one host process share its cores instead of fighting over them.
//
// Two pools matter on CPU: torch's intra-op pool (OpenMP; its size is per calling thread, so each device thread sets
// its own) and OpenBLAS's, which libtorch reaches for fp32 matmuls. OpenBLAS keeps one pool per process whatever
// thread calls it, sized to every core by default: with several device threads computing at once their matmuls
// queued for that one pool (1 host x 2 devices ran at the speed of 1 device; issue 15). Its size is set here to the
// threads of one device, so a device's matmul runs on its own threads (in the calling thread itself at 1).
// Found at run time (dlsym): a libblas.so.3 that is not OpenBLAS (Debian's alternatives) is left alone.
#pragma once

#include <string>

namespace meshtrain::runtime {

// Sets OpenBLAS's process-wide thread count (once per host process, before device threads start). Returns what
// the log should say: "OpenBLAS 0.3.21 (pthreads): 1 thread" or why nothing was set.
std::string set_blas_threads(int threads);

// Sets the calling thread's torch intra-op thread count (each device thread, before it computes).
void set_device_intra_op_threads(int threads);

}  // namespace meshtrain::runtime
