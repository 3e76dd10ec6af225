// compute_threads.hpp — the thread counts of the compute pools a device thread calls into, set from
// runtime.threads_per_device so that the devices of one host process share its cores instead of fighting over them:
// torch's intra-op pool (sized per calling thread: each device thread sets its own), OpenBLAS's (one per process, set
// once before the device threads start; found at run time, a libblas.so.3 that is not OpenBLAS is left alone) and
// libgomp's wait policy (restart_with_passive_openmp_waits, before the process starts threads). Why:
// docs/runtime.md, "One process per host, one thread per device"; figures: BENCHMARKS.md, "Devices in one process".
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace meshtrain::runtime {

// Sets OpenBLAS's process-wide thread count (once per host process, before device threads start). Returns what
// the log should say: "OpenBLAS 0.3.21 (pthreads): 1 thread" or why nothing was set.
std::string set_blas_threads(int threads);

// Sets the calling thread's torch intra-op thread count (each device thread, before it computes).
void set_device_intra_op_threads(int threads);

// Sets the calling thread's torch intra-op threads for a scope (a measurement on another thread count).
class ThreadCountGuard {
 public:
  explicit ThreadCountGuard(int threads);
  ~ThreadCountGuard();
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int previous_;
};

// The torch threads of each device: `threads_per_device`, or with 0 the host's cores split evenly between its
// `devices_per_host` devices (at least 1).
int resolve_threads_per_device(int threads_per_device, int devices_per_host);

// For fp32 GEMMs (`gemm_dtype`: model::gemm_dtype of the compute dtype; they go to OpenBLAS while torch's pool runs
// the rest) with intra_op_threads >= 2 and neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT in the environment: sets
// OMP_WAIT_POLICY=PASSIVE and executes this process's executable again with the same arguments (same pid, open
// descriptors kept), so returns only when nothing was to be done (any other dtype, 1 thread, the user's own setting)
// or the exec failed (logged). Call it before the process starts threads or writes anything it would write again.
void restart_with_passive_openmp_waits(int intra_op_threads, c10::ScalarType gemm_dtype);

// What the log says about libgomp's idle threads: "OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=1000" or
// "idle threads spin (libgomp's default)".
std::string openmp_wait_setting();

}  // namespace meshtrain::runtime
