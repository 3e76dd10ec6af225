// parameter_init.cpp — the counter-based initializer: the scalar generator (glibc's log and cos, whose bits every
// path gives), an AVX2+FMA generator for x86-64 CPUs that have them (chosen once at run time; the build itself targets
// baseline x86-64), and the slices split over the calling thread's torch threads by at::parallel_for, which this file
// is compiled with OpenMP for (CMakeLists.txt).
//
// The AVX2 generator computes 4 variates at once in double precision with its own log and cos (fdlibm's polynomials;
// within 1 unit in the last place of glibc's over 4 M tested values, glibc's within 1 of the exact ones) and keeps a
// lane's float only where every double within a relative 2^-36 of its product rounds to that same float and |cos| >=
// 2^-10 (so that a zero product has the same sign): glibc's product, within about 2^-50 of it, rounds to that float
// too. The other lanes (about 1 in 1000) are recomputed by the scalar generator.
#include "meshtrain/model/parameter_init.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/mix.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace meshtrain::model {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;  // the stream's step (SplitMix64's increment)

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// N(0, 1) at element `index` of the stream `key`.
float standard_normal(uint64_t key, int64_t index) {
  const uint64_t bits = splitmix64(key + static_cast<uint64_t>(index) * kGolden);
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;  // (0, 1]
  const double u2 = static_cast<double>(bits & 0xffffffffull) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

// out[i] = scale * standard_normal(key, first + i) for i in [0, count).
void scaled_normals_scalar(uint64_t key, int64_t first, int64_t count, float scale, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = scale * standard_normal(key, first + i);
}

#if defined(__x86_64__)
#define MT_AVX2 __attribute__((target("avx2,fma")))

// a * b mod 2^64 per lane (AVX2 multiplies 32-bit halves).
MT_AVX2 inline __m256i mul64(__m256i a, __m256i b) {
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                         _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

// SplitMix64's finalizer (mix.hpp) after its increment.
MT_AVX2 inline __m256i splitmix64_mix(__m256i z) {
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), _mm256_set1_epi64x(0xbf58476d1ce4e5b9ll));
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), _mm256_set1_epi64x(0x94d049bb133111ebll));
  return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

// The doubles of 32-bit unsigned integers held in 64-bit lanes (exact: 2^52 + x - 2^52).
MT_AVX2 inline __m256d u32_to_double(__m256i x) {
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(x, _mm256_castpd_si256(two52))), two52);
}

// Horner's rule: p x + next, then that x + the next coefficient, and so on.
MT_AVX2 inline __m256d horner(__m256d, __m256d p) { return p; }
template <typename... Lower>
MT_AVX2 inline __m256d horner(__m256d x, __m256d p, double next, Lower... lower) {
  return horner(x, _mm256_fmadd_pd(p, x, _mm256_set1_pd(next)), lower...);
}
// The polynomial of the coefficients `highest, lower...` (highest degree first) at x.
template <typename... Lower>
MT_AVX2 inline __m256d polynomial(__m256d x, double highest, Lower... lower) {
  return horner(x, _mm256_set1_pd(highest), lower...);
}

// log(x) for normal x > 0: fdlibm's e_log.c, x = 2^k (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)).
MT_AVX2 inline __m256d log_pd(__m256d x) {
  const __m256i mantissa_bits = _mm256_set1_epi64x(0x000fffffffffffffll), one_bits = _mm256_set1_epi64x(0x3ff0000000000000ll);
  const __m256i bits = _mm256_castpd_si256(x);
  __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mantissa_bits), one_bits));  // [1, 2)
  __m256i k = _mm256_sub_epi64(_mm256_srli_epi64(bits, 52), _mm256_set1_epi64x(1023));
  const __m256d above = _mm256_cmp_pd(m, _mm256_set1_pd(M_SQRT2), _CMP_GT_OQ);
  m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), above);
  k = _mm256_sub_epi64(k, _mm256_castpd_si256(above));  // the mask is -1 where m was halved
  const __m256d dk = u32_to_double(_mm256_add_epi64(k, _mm256_set1_epi64x(1ll << 31)));
  const __m256d k_d = _mm256_sub_pd(dk, _mm256_set1_pd(2147483648.0));
  const __m256d f = _mm256_sub_pd(m, _mm256_set1_pd(1.0));  // exact (Sterbenz)
  const __m256d s = _mm256_div_pd(f, _mm256_add_pd(_mm256_set1_pd(2.0), f));
  const __m256d z = _mm256_mul_pd(s, s), w = _mm256_mul_pd(z, z);
  const __m256d t1 = _mm256_mul_pd(w, polynomial(w, 1.531383769920937332e-01, 2.222219843214978396e-01,
                                                    3.999999999940941908e-01));
  const __m256d t2 = _mm256_mul_pd(z, polynomial(w, 1.479819860511658591e-01, 1.818357216161805012e-01,
                                                    2.857142874366239149e-01, 6.666666666666735130e-01));
  const __m256d r = _mm256_add_pd(t2, t1);
  const __m256d hfsq = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), f), f);
  const __m256d ln2_hi = _mm256_set1_pd(6.93147180369123816490e-01), ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
  // k ln2_hi - ((hfsq - (s (hfsq + R) + k ln2_lo)) - f)
  const __m256d inner = _mm256_fmadd_pd(s, _mm256_add_pd(hfsq, r), _mm256_mul_pd(k_d, ln2_lo));
  return _mm256_sub_pd(_mm256_mul_pd(k_d, ln2_hi), _mm256_sub_pd(_mm256_sub_pd(hfsq, inner), f));
}

// cos(x) for x in [0, 2 pi): x = n pi/2 + r, |r| <= pi/4 (fdlibm's two-part pi/2, its sin and cos kernels).
MT_AVX2 inline __m256d cos_pd(__m256d x) {
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(M_2_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(6.07710050650619224932e-11),
                                     _mm256_fnmadd_pd(n, _mm256_set1_pd(1.57079632673412561417e+00), x));
  const __m256d z = _mm256_mul_pd(r, r);
  const __m256d sin_r = _mm256_fmadd_pd(_mm256_mul_pd(z, r),
                                        polynomial(z, 1.58969099521155010221e-10, -2.50507602534068634195e-08,
                                                       2.75573137070700676789e-06, -1.98412698298579493134e-04,
                                                       8.33333333332248946124e-03, -1.66666666666666324348e-01),
                                        r);
  const __m256d hz = _mm256_mul_pd(_mm256_set1_pd(0.5), z), w = _mm256_sub_pd(_mm256_set1_pd(1.0), hz);
  const __m256d cos_tail = _mm256_mul_pd(_mm256_mul_pd(z, z),
                                         polynomial(z, -1.13596475577881948265e-11, 2.08757232129817482790e-09,
                                                        -2.75573143513906633035e-07, 2.48015872894767294178e-05,
                                                        -1.38888888888741095749e-03, 4.16666666666666019037e-02));
  const __m256d cos_r = _mm256_add_pd(w, _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(_mm256_set1_pd(1.0), w), hz), cos_tail));
  // Quadrant n mod 4: cos r, -sin r, -cos r, sin r.
  const __m256i q = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n));
  const __m256d odd = _mm256_castsi256_pd(_mm256_slli_epi64(q, 63));
  const __m256d negative = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(q, _mm256_set1_epi64x(1)), 62));
  return _mm256_xor_pd(_mm256_blendv_pd(cos_r, sin_r, odd),
                       _mm256_and_pd(negative, _mm256_set1_pd(-0.0)));
}

// In passes over blocks of kBlock elements, each a short loop of independent iterations (one long loop body would be
// one dependency chain too long for the out-of-order window): the uniforms, their log, the cosines, the products.
MT_AVX2 void scaled_normals_avx2(uint64_t key, int64_t first, int64_t count, float scale, float* out) {
  constexpr int64_t kBlock = 256;
  alignas(32) double radius_B[kBlock], cosine_B[kBlock];
  struct Uncertain {
    int64_t offset;  // of the vector in the block
    int lanes;       // a bit per lane that the scalar generator recomputes
  } uncertain[kBlock / 4];
  const __m256i lane_steps = _mm256_set_epi64x(3 * kGolden, 2 * kGolden, kGolden, 0);
  const __m256d two_to_minus_32 = _mm256_set1_pd(1.0 / 4294967296.0), tolerance = _mm256_set1_pd(0x1p-36);
  const __m128 scale_4 = _mm_set1_ps(scale);
  int64_t i = 0;
  while (i + 4 <= count) {
    const int64_t block = std::min(kBlock, (count - i) / 4 * 4);
    int64_t uncertain_count = 0;
    for (int64_t j = 0; j < block; j += 4) {  // u1 in (0, 1] into radius_B, 2 pi u2 into cosine_B
      const uint64_t z0 = key + static_cast<uint64_t>(first + i + j + 1) * kGolden;  // splitmix64's increment too
      const __m256i bits = splitmix64_mix(_mm256_add_epi64(_mm256_set1_epi64x(static_cast<int64_t>(z0)), lane_steps));
      _mm256_store_pd(radius_B + j, _mm256_mul_pd(_mm256_add_pd(u32_to_double(_mm256_srli_epi64(bits, 32)),
                                                                _mm256_set1_pd(1.0)),
                                                  two_to_minus_32));
      const __m256d u2 = _mm256_mul_pd(u32_to_double(_mm256_and_si256(bits, _mm256_set1_epi64x(0xffffffffll))),
                                       two_to_minus_32);
      _mm256_store_pd(cosine_B + j, _mm256_mul_pd(_mm256_set1_pd(2.0 * M_PI), u2));
    }
    for (int64_t j = 0; j < block; j += 4)
      _mm256_store_pd(radius_B + j,
                      _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_pd(_mm256_load_pd(radius_B + j)))));
    for (int64_t j = 0; j < block; j += 4) _mm256_store_pd(cosine_B + j, cos_pd(_mm256_load_pd(cosine_B + j)));
    for (int64_t j = 0; j < block; j += 4) {
      const __m256d cosine = _mm256_load_pd(cosine_B + j);
      const __m256d product = _mm256_mul_pd(_mm256_load_pd(radius_B + j), cosine);
      const __m128 normal = _mm256_cvtpd_ps(product);
      const __m128 low = _mm256_cvtpd_ps(_mm256_fnmadd_pd(product, tolerance, product));
      const __m128 high = _mm256_cvtpd_ps(_mm256_fmadd_pd(product, tolerance, product));
      const __m128 same = _mm_and_ps(_mm_cmpeq_ps(low, normal), _mm_cmpeq_ps(high, normal));
      const __m256d far_from_zero =
          _mm256_cmp_pd(_mm256_andnot_pd(_mm256_set1_pd(-0.0), cosine), _mm256_set1_pd(0x1p-10), _CMP_GE_OQ);
      _mm_storeu_ps(out + i + j, _mm_mul_ps(scale_4, normal));
      const int lanes = ~(_mm_movemask_ps(same) & _mm256_movemask_pd(far_from_zero)) & 0xf;
      uncertain[uncertain_count] = {j, lanes};  // kept only when some lane is uncertain (no branch)
      uncertain_count += lanes != 0;
    }
    // After the pass: a call in its loop would make it spill its constants.
    for (int64_t u = 0; u < uncertain_count; ++u)
      for (int64_t lane = 0; lane < 4; ++lane)
        if (uncertain[u].lanes & (1 << lane)) {
          const int64_t k = i + uncertain[u].offset + lane;
          out[k] = scale * standard_normal(key, first + k);
        }
    i += block;
  }
  scaled_normals_scalar(key, first + i, count - i, scale, out + i);
}
#undef MT_AVX2
#endif

using NormalsKernel = void (*)(uint64_t key, int64_t first, int64_t count, float scale, float* out);

// The generator built for the CPU.
NormalsKernel normals_kernel() {
#if defined(__x86_64__)
  static const NormalsKernel kernel =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? scaled_normals_avx2 : scaled_normals_scalar;
#else
  static const NormalsKernel kernel = scaled_normals_scalar;
#endif
  return kernel;
}

}  // namespace

void fill_initial_values(const config::LlamaConfig& config, uint64_t seed, const ParameterSlice& slice,
                         const at::Tensor& out) {
  MT_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == slice.numel(),
           "initial values of {} into a tensor of {} {} elements", slice.describe(), out.numel(),
           c10::toString(out.scalar_type()));
  if (slice.full_shape.size() <= 1) {  // RMSNorm weights
    out.fill_(1);
    return;
  }
  float* out_data = out.data_ptr<float>();
  const uint64_t key = splitmix64(seed ^ fnv1a(slice.name));
  const float std = static_cast<float>(config.initializer_range);
  const NormalsKernel kernel = normals_kernel();
  // Chunks of the slice (each one a slice itself, of one run or more) over the torch threads.
  at::parallel_for(0, slice.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    slice.range(slice.flat_begin + begin, slice.flat_begin + end)
        .for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
          kernel(key, whole_index, count, std, out_data + begin + offset);
        });
  });
}

at::Tensor initial_values(const config::LlamaConfig& config, uint64_t seed, const ParameterSlice& slice) {
  at::Tensor out = at::empty({slice.numel()}, at::kFloat);
  fill_initial_values(config, seed, slice, out);
  return out;
}

SliceSource initial_value_source(const config::LlamaConfig& config, uint64_t seed) {
  return [config, seed](const ParameterSlice& slice, const at::Tensor& out) {
    fill_initial_values(config, seed, slice, out);
  };
}

}  // namespace meshtrain::model
