// host_memory_test.cpp — available_memory on made-up /proc and cgroup trees (v1 and v2, limits on the way up, page
// cache not counted as used), and the process's own peak resident memory from the real /proc.
#include "meshtrain/common/host_memory.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

namespace meshtrain::testing {
namespace {

void write(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

constexpr int64_t kGiB = int64_t{1} << 30;

// /proc with 20 GiB MemAvailable and the given /proc/self/cgroup lines.
std::filesystem::path fake_proc(const ScratchDir& dir, const std::string& cgroup_lines) {
  write(dir.path() / "proc/meminfo", "MemTotal:       25165824 kB\nMemAvailable:   20971520 kB\n");
  write(dir.path() / "proc/self/cgroup", cgroup_lines);
  return dir.path() / "proc";
}

TEST(HostMemoryTest, WithoutCgroupLimitsItIsMemAvailable) {
  ScratchDir dir("host_memory_none");
  const std::filesystem::path proc = fake_proc(dir, "0::/\n");
  write(dir.path() / "cg/memory.max", "max\n");
  write(dir.path() / "cg/memory.current", "1000\n");
  const MemoryAvailable available = available_memory(proc, dir.path() / "cg");
  EXPECT_EQ(available.bytes, 20 * kGiB);
  EXPECT_EQ(available.source, "MemAvailable");
}

TEST(HostMemoryTest, CgroupV2LimitAboveTheProcessCountsWithoutItsInactivePageCache) {
  ScratchDir dir("host_memory_v2");
  const std::filesystem::path proc = fake_proc(dir, "0::/job/host0\n");
  const std::filesystem::path cg = dir.path() / "cg";
  write(cg / "job/host0/memory.max", "max\n");
  write(cg / "job/host0/memory.current", std::to_string(kGiB) + "\n");
  write(cg / "job/memory.max", std::to_string(4 * kGiB) + "\n");
  write(cg / "job/memory.current", std::to_string(3 * kGiB) + "\n");
  write(cg / "job/memory.stat", "anon 1\ninactive_file " + std::to_string(kGiB) + "\nactive_file 5\n");
  const MemoryAvailable available = available_memory(proc, cg);
  EXPECT_EQ(available.bytes, 2 * kGiB);  // 4 GiB limit - (3 GiB used - 1 GiB droppable cache)
  EXPECT_EQ(available.source, "the limit of cgroup " + (cg / "job/memory.max").string());
}

TEST(HostMemoryTest, CgroupV1MemoryControllerLimitAndItsUnlimitedValue) {
  ScratchDir dir("host_memory_v1");
  const std::filesystem::path proc =
      fake_proc(dir, "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n");
  const std::filesystem::path cg = dir.path() / "cg";
  write(cg / "memory/process_api/abc/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  write(cg / "memory/process_api/abc/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  write(cg / "memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  write(cg / "memory/memory.usage_in_bytes", std::to_string(22 * kGiB) + "\n");
  const MemoryAvailable available = available_memory(proc, cg);
  EXPECT_EQ(available.bytes, 2 * kGiB);
  EXPECT_NE(available.source.find("memory.limit_in_bytes"), std::string::npos) << available.source;
}

TEST(HostMemoryTest, ThisProcessPeakCountsWhatItWrote) {
  std::vector<char> touched(64 << 20, 1);  // 64 MiB written: resident
  EXPECT_GT(peak_resident_bytes(), int64_t{64} << 20);
  EXPECT_EQ(touched[12345], 1);
  EXPECT_GT(available_memory().bytes, 0);
}

}  // namespace
}  // namespace meshtrain::testing
