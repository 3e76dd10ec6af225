// compute_threads.cpp — OpenBLAS's pool size through dlsym, torch's intra-op threads (compute_threads.hpp says why).
#include "meshtrain/runtime/compute_threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>

namespace meshtrain::runtime {

std::string set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  using GetConfig = char* (*)();
  auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto config = reinterpret_cast<GetConfig>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (!set || !get) return "BLAS is not OpenBLAS: its threads are left as they are";
  set(threads);
  const int now = get();
  return fmt::format("{}: {} thread{}", config ? config() : "OpenBLAS", now, now == 1 ? "" : "s");
}

void set_device_intra_op_threads(int threads) { at::set_num_threads(threads); }

}  // namespace meshtrain::runtime
