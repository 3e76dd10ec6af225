// cpu_info_test.cpp — /proc/cpuinfo's first processor (model, flags, clock, SMT) and the theoretical peak from them.
#include "meshtrain/common/cpu_info.hpp"

#include <gtest/gtest.h>

namespace meshtrain {
namespace {

// Two processors of a KVM guest on AMD Zen 3 (no SMT), trimmed.
constexpr const char* kEpyc = R"(processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC
cpu MHz		: 2445.402
siblings	: 2
cpu cores	: 2
flags		: fpu sse sse2 ssse3 fma sse4_1 avx f16c avx2 bmi2

processor	: 1
model name	: AMD EPYC
cpu MHz		: 2999.000
flags		: fpu sse sse2 avx512f
)";

// An Intel server with SMT (2 threads per core) and AVX-512 bf16 dot products.
constexpr const char* kXeon = R"(processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
cpu MHz		: 2900.000
siblings	: 8
cpu cores	: 4
flags		: sse avx fma avx2 avx512f avx512_bf16

)";

TEST(CpuInfoTest, ReadsTheFirstProcessor) {
  const CpuInfo cpu = parse_cpu_info(kEpyc);
  EXPECT_EQ(cpu.model, "AMD EPYC");
  EXPECT_DOUBLE_EQ(cpu.mhz, 2445.402);
  EXPECT_EQ(cpu.threads_per_core, 1);
  EXPECT_TRUE(cpu.has("avx2"));
  EXPECT_FALSE(cpu.has("avx512f"));  // processor 1's line is not read
  EXPECT_EQ(cpu.matmul_flags(), "avx fma avx2");
  EXPECT_EQ(cpu.describe(), "AMD EPYC (avx fma avx2), 2445 MHz");
  EXPECT_EQ(parse_cpu_info(kXeon).threads_per_core, 2);
}

TEST(CpuInfoTest, TheoreticalPeakIsCoresTimesClockTimesFlopsPerCycle) {
  const TheoreticalPeak epyc = theoretical_peak(parse_cpu_info(kEpyc), 2, false);
  EXPECT_DOUBLE_EQ(epyc.flops, 2 * 2445.402e6 * 32);  // AVX2 + FMA: two 256-bit FMA units
  EXPECT_NE(epyc.how.find("2 cores x 2.45 GHz x 32 FLOP/cycle"), std::string::npos) << epyc.how;
  // SMT: 4 threads are 2 cores.
  const CpuInfo xeon = parse_cpu_info(kXeon);
  EXPECT_DOUBLE_EQ(theoretical_peak(xeon, 4, false).flops, 2 * 2900e6 * 64);
  EXPECT_DOUBLE_EQ(theoretical_peak(xeon, 3, false).flops, 2 * 2900e6 * 64);
  EXPECT_DOUBLE_EQ(theoretical_peak(xeon, 1, true).flops, 2900e6 * 128);
  // Unknown: native bf16 without avx512_bf16, or no clock.
  EXPECT_EQ(theoretical_peak(parse_cpu_info(kEpyc), 1, true).flops, 0);
  EXPECT_EQ(theoretical_peak(parse_cpu_info("flags : avx2 fma\n"), 1, false).flops, 0);
}

}  // namespace
}  // namespace meshtrain
