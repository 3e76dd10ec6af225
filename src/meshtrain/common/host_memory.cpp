// host_memory.cpp — resident and available memory from /proc and cgroup v2 files (host_memory.hpp).
#include "meshtrain/common/host_memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace meshtrain {
namespace {

// The value in kB of line `key:` of a /proc file, in bytes; -1 when absent.
int64_t proc_kilobytes(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kilobytes = -1;
    fields >> kilobytes;
    return kilobytes < 0 ? -1 : kilobytes * 1024;
  }
  return -1;
}

// A cgroup file holding one number; -1 for none or no limit ("max" in v2, a huge page-rounded number in v1).
int64_t cgroup_number(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    const long long value = std::stoll(text);
    return value >= (int64_t{1} << 62) ? -1 : value;
  } catch (const std::exception&) {
    return -1;
  }
}

// Usage the cgroup cannot give back by dropping clean page cache: `usage` less memory.stat's inactive file pages.
int64_t working_set(const std::filesystem::path& dir, int64_t usage, const char* inactive_file_key) {
  std::ifstream stat(dir / "memory.stat");
  std::string key;
  int64_t value = 0;
  while (stat >> key >> value)
    if (key == inactive_file_key) return std::max<int64_t>(0, usage - value);
  return usage;
}

// Lowers `available` to the headroom of `dir` and each cgroup above it, up to `root`.
void lower_to_cgroup_limits(MemoryAvailable& available, std::filesystem::path dir, const std::filesystem::path& root,
                            const char* limit_file, const char* usage_file, const char* inactive_file_key) {
  for (;; dir = dir.parent_path()) {
    const int64_t limit = cgroup_number(dir / limit_file), usage = cgroup_number(dir / usage_file);
    if (limit >= 0 && usage >= 0) {
      const int64_t headroom = std::max<int64_t>(0, limit - working_set(dir, usage, inactive_file_key));
      if (headroom < available.bytes) available = {headroom, "the limit of cgroup " + (dir / limit_file).string()};
    }
    if (dir == root || !dir.has_relative_path() || dir == dir.parent_path()) break;
  }
}

}  // namespace

int64_t peak_resident_bytes() { return std::max<int64_t>(0, proc_kilobytes("/proc/self/status", "VmHWM")); }

MemoryAvailable available_memory() { return available_memory("/proc", "/sys/fs/cgroup"); }

MemoryAvailable available_memory(const std::filesystem::path& proc, const std::filesystem::path& cgroup_root) {
  MemoryAvailable available{proc_kilobytes((proc / "meminfo").c_str(), "MemAvailable"), "MemAvailable"};
  if (available.bytes < 0) available.bytes = std::numeric_limits<int64_t>::max();
  // /proc/self/cgroup: "0::/path" (v2), "N:memory:/path" or "N:...,memory,...:/path" (v1).
  std::ifstream cgroups(proc / "self" / "cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);  // "/" or "/a/b"
    auto under = [&](const std::filesystem::path& root) { return path.size() > 1 ? root / path.substr(1) : root; };
    if (controllers == ",,")
      lower_to_cgroup_limits(available, under(cgroup_root), cgroup_root, "memory.max", "memory.current",
                             "inactive_file");
    else if (controllers.find(",memory,") != std::string::npos)
      lower_to_cgroup_limits(available, under(cgroup_root / "memory"), cgroup_root / "memory",
                             "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file");
  }
  return available;
}

std::string gigabytes(int64_t bytes) { return fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9); }

}  // namespace meshtrain
