// cpu_info.cpp — /proc/cpuinfo's first processor, and the theoretical peak from its flags and clock.
#include "meshtrain/common/cpu_info.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace meshtrain {
namespace {

// "key : value" -> value (trimmed) when the line's key is `key`.
bool field(const std::string& line, const std::string& key, std::string* value) {
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return false;
  std::string name = line.substr(0, colon);
  name.erase(name.find_last_not_of(" \t") + 1);
  if (name != key) return false;
  const size_t start = line.find_first_not_of(" \t", colon + 1);
  *value = start == std::string::npos ? "" : line.substr(start);
  return true;
}

}  // namespace

bool CpuInfo::has(const std::string& flag) const { return std::find(flags.begin(), flags.end(), flag) != flags.end(); }

std::string CpuInfo::matmul_flags() const {
  std::string out;
  for (const char* flag : {"avx", "fma", "avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    if (has(flag)) out += (out.empty() ? "" : " ") + std::string(flag);
  return out;
}

std::string CpuInfo::describe() const {
  return fmt::format("{} ({}), {:.0f} MHz", model.empty() ? "unknown CPU" : model,
                     matmul_flags().empty() ? "no AVX" : matmul_flags(), mhz);
}

CpuInfo parse_cpu_info(const std::string& text) {
  CpuInfo cpu;
  std::istringstream lines(text);
  std::string line, value;
  int siblings = 0, cores = 0;
  bool flags_seen = false;
  while (std::getline(lines, line)) {
    if (line.empty() && flags_seen) break;  // the first processor's block ends
    if (field(line, "model name", &value) && cpu.model.empty()) {
      cpu.model = value;
    } else if ((field(line, "flags", &value) || field(line, "Features", &value)) && !flags_seen) {
      std::istringstream words(value);
      for (std::string word; words >> word;) cpu.flags.push_back(word);
      flags_seen = true;
    } else if (field(line, "cpu MHz", &value) && cpu.mhz == 0) {
      cpu.mhz = std::atof(value.c_str());
    } else if (field(line, "siblings", &value)) {
      siblings = std::atoi(value.c_str());
    } else if (field(line, "cpu cores", &value)) {
      cores = std::atoi(value.c_str());
    }
  }
  if (siblings > 0 && cores > 0 && siblings >= cores) cpu.threads_per_core = siblings / cores;
  return cpu;
}

CpuInfo read_cpu_info() {
  std::ifstream file("/proc/cpuinfo");
  std::stringstream text;
  text << file.rdbuf();
  return parse_cpu_info(text.str());
}

TheoreticalPeak theoretical_peak(const CpuInfo& cpu, int threads, bool native_bf16) {
  if (cpu.mhz <= 0) return {0, "no clock listed in /proc/cpuinfo"};
  int flops_per_cycle = 0;
  std::string units;
  if (native_bf16) {
    if (!cpu.has("avx512_bf16")) return {0, "no theoretical figure for this CPU's native bf16 products"};
    flops_per_cycle = 128;
    units = "avx512_bf16: two 512-bit FMA units of bf16 pairs";
  } else if (cpu.has("avx512f")) {
    flops_per_cycle = 64;
    units = "AVX-512: two 512-bit FMA units";
  } else if (cpu.has("avx2") && cpu.has("fma")) {
    flops_per_cycle = 32;
    units = "AVX2 + FMA: two 256-bit FMA units";
  } else if (cpu.has("avx")) {
    flops_per_cycle = 16;
    units = "AVX: a 256-bit add and a multiply";
  } else {
    flops_per_cycle = 8;
    units = "SSE";
  }
  const int cores = (std::max(threads, 1) + cpu.threads_per_core - 1) / cpu.threads_per_core;
  const double flops = cores * cpu.mhz * 1e6 * flops_per_cycle;
  return {flops, fmt::format("{} core{} x {:.2f} GHz x {} FLOP/cycle ({})", cores, cores == 1 ? "" : "s",
                             cpu.mhz / 1e3, flops_per_cycle, units)};
}

}  // namespace meshtrain
