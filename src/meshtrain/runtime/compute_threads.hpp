// compute_threads.hpp — the thread counts of the compute pools a device thread calls into, set from
// runtime.threads_per_device so that the devices of one host process share its cores instead of fighting over them.
//
// Two pools matter on CPU: torch's intra-op pool (OpenMP; its size is per calling thread, so each device thread sets
// its own) and OpenBLAS's, which libtorch reaches for fp32 matmuls. OpenBLAS keeps one pool per process whatever
// thread calls it, sized to every core by default: with several device threads computing at once their matmuls
// queued for that one pool (1 host x 2 devices ran at the speed of 1 device; issue 15). Its size is set here to the
// threads of one device, so a device's matmul runs on its own threads (in the calling thread itself at 1).
// Found at run time (dlsym): a libblas.so.3 that is not OpenBLAS (Debian's alternatives) is left alone.
//
// The two pools also fight within one device of several threads: libgomp (the OpenMP runtime behind torch's pool)
// keeps an idle worker spinning for a while after every parallel region, on a core OpenBLAS's workers want for the
// next matmul. llama-10m on 1 device of 2 threads ran at 1235-1468 tokens/s, with libgomp's workers sleeping when
// idle (OMP_WAIT_POLICY=PASSIVE) at 2335-2387, and on 1 thread at 2141-2199 (bench/model_step_bench, issue 15).
// libgomp reads the policy once, when it is loaded, so a process that will run several intra-op threads on fp32 sets
// it and restarts itself (restart_with_passive_openmp_waits). Native bf16 matmuls run in oneDNN on torch's own pool,
// where the spinning saves wake-ups: llama-100m bf16 on 2 threads ran at 618-668 tokens/s spinning, 535-611 passive;
// bf16 on the fp32_gemm path (model/compute_matmul.hpp) runs its GEMMs in OpenBLAS, as fp32 does.
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
