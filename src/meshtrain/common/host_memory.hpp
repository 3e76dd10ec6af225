// host_memory.hpp — what this process holds and what the machine can still give it: its peak resident memory from
// /proc/self/status, and the memory available to the process: MemAvailable from /proc/meminfo,
// lowered by the memory limit of the process's cgroup or any cgroup above it (cgroup v2 memory.max, or v1
// memory.limit_in_bytes), less what the cgroup uses (its usage without the inactive page cache it can drop).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace meshtrain {

struct MemoryAvailable {
  int64_t bytes = 0;   // the smaller of the machine's MemAvailable and the cgroup's headroom
  std::string source;  // "MemAvailable" or "the limit of cgroup /sys/fs/cgroup/.../memory.max"
};

// The peak resident memory of this process so far (VmHWM), in bytes; 0 when /proc cannot say.
int64_t peak_resident_bytes();

// What the process can still allocate before the kernel or its cgroup refuses: MemAvailable, or, where lower,
// a cgroup's limit less its usage.
MemoryAvailable available_memory();
// The same, from `proc` (meminfo, self/cgroup) and `cgroup_root` (the cgroup mount: v2 files at its top, v1 under
// memory/): for tests.
MemoryAvailable available_memory(const std::filesystem::path& proc, const std::filesystem::path& cgroup_root);

// "3.71 GB" (decimal gigabytes, two decimals).
std::string gigabytes(int64_t bytes);

}  // namespace meshtrain
