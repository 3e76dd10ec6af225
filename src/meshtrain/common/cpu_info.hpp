// cpu_info.hpp — what /proc/cpuinfo says of the CPU (model, the flags that decide matmul speed, clock, threads per
// core), and the theoretical matmul peak that follows from it: cores x clock x floating-point operations per cycle.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

struct CpuInfo {
  std::string model;               // "AMD EPYC", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"; "" if not listed
  std::vector<std::string> flags;  // of the first processor ("flags" on x86, "Features" on Arm)
  double mhz = 0;                  // "cpu MHz" of the first processor (0 if not listed)
  int threads_per_core = 1;        // "siblings" / "cpu cores" (SMT)

  bool has(const std::string& flag) const;
  // The flags among avx, fma, avx2, avx512f, avx512_bf16, amx_bf16 this CPU has, space-separated.
  std::string matmul_flags() const;
  // "AMD EPYC (avx fma avx2), 2445 MHz".
  std::string describe() const;
};

// Parses a /proc/cpuinfo text (missing fields keep their defaults).
CpuInfo parse_cpu_info(const std::string& text);
// This machine's (empty fields where /proc/cpuinfo cannot be read).
CpuInfo read_cpu_info();

struct TheoreticalPeak {
  double flops = 0;  // per second; 0: not known for this CPU
  std::string how;   // "2 cores x 2.45 GHz x 32 FLOP/cycle (fp32 ...)", or why it is not known
};

// The peak of `threads` threads multiplying fp32 values (or bf16 ones with the CPU's own bf16 dot products when
// `native_bf16`): ceil(threads / threads_per_core) cores x the listed clock x the FLOPs of the FMA units per cycle,
// which the flags imply under the assumption of two FMA units per core (AVX-512: 2 x 16 lanes x 2 = 64 fp32 FLOP per
// cycle; AVX2 + FMA: 32; AVX: 16; else SSE: 8; avx512_bf16 doubles AVX-512's). The listed clock is what the kernel
// reports (under a hypervisor often the nominal one, below the boost), so a measured rate can exceed this figure.
TheoreticalPeak theoretical_peak(const CpuInfo& cpu, int threads, bool native_bf16);

}  // namespace meshtrain
