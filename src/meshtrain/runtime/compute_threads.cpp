// compute_threads.cpp — OpenBLAS's pool size through dlsym, torch's intra-op threads (compute_threads.hpp says why).
#include "meshtrain/runtime/compute_threads.hpp"

#include "meshtrain/common/log.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

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

ThreadCountGuard::ThreadCountGuard(int threads) : previous_(at::get_num_threads()) { at::set_num_threads(threads); }

ThreadCountGuard::~ThreadCountGuard() { at::set_num_threads(previous_); }

int resolve_threads_per_device(int threads_per_device, int devices_per_host) {
  if (threads_per_device > 0) return threads_per_device;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, devices_per_host));
}

void restart_with_passive_openmp_waits(int intra_op_threads, c10::ScalarType gemm_dtype) {
  if (gemm_dtype != c10::kFloat || intra_op_threads < 2 || std::getenv("OMP_WAIT_POLICY") ||
      std::getenv("GOMP_SPINCOUNT"))
    return;
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  const std::string joined{std::istreambuf_iterator<char>(cmdline), std::istreambuf_iterator<char>()};
  std::vector<std::string> args;  // NUL-terminated arguments
  for (size_t begin = 0; begin < joined.size();) {
    const size_t end = std::min(joined.find('\0', begin), joined.size());
    args.push_back(joined.substr(begin, end - begin));
    begin = end + 1;
  }
  if (args.empty()) {
    log::warning("could not read /proc/self/cmdline: torch's idle threads keep spinning (set OMP_WAIT_POLICY=PASSIVE "
                 "to stop them)");
    return;
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  std::fflush(nullptr);
  ::execv("/proc/self/exe", argv.data());
  const int error = errno;
  ::unsetenv("OMP_WAIT_POLICY");
  log::warning("could not restart with OMP_WAIT_POLICY=PASSIVE ({}): torch's idle threads keep spinning",
               std::strerror(error));
}

std::string openmp_wait_setting() {
  for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"})
    if (const char* value = std::getenv(name)) return fmt::format("{}={}", name, value);
  return "idle threads spin (libgomp's default)";
}

}  // namespace meshtrain::runtime
