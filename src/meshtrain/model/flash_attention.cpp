// flash_attention.cpp — the tiled attention kernel of flash_attention.hpp: fp32 working copies of the inputs laid out
// for the tile products, a forward task per (row, query head, query tile), a backward task per (row, key/value head,
// range of key tiles), each task's tiles multiplied by a register-blocked kernel compiled for AVX2+FMA when the CPU
// has them (chosen once at run time; the build itself targets baseline x86-64) and for the baseline otherwise. Tasks
// go to the torch threads by at::parallel_for, which this file is compiled with OpenMP for (CMakeLists.txt).
//
// Legend as in flash_attention.hpp, and: P the head dimension padded to a multiple of kColumnStep (zeros), N the keys
// of one tile (kFlashKeyTile), C key tiles, R rows of one query tile, W the columns (keys) of a tile that are computed
// (kColumnStep-aligned).
#include "meshtrain/model/flash_attention.hpp"

#include "meshtrain/common/error.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

namespace meshtrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kColumnStep = 16;  // tiles are computed in columns of 16 (two vectors of 8, or four of 4)
constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();
constexpr int64_t kPaddedKeyPosition = std::numeric_limits<int64_t>::max();  // never seen

// ---- The tile kernels (always inlined into each target's task functions). ----

// Vectors of `Lanes` floats: 8 (AVX2) or 4 (baseline SSE2). No function takes or returns a vector by value: in
// functions built for baseline x86-64, GCC warns that 32-byte vectors change the ABI. Loads and stores are macros
// (of the Unaligned type the caller names); the rest take references.
#define MT_FLASH_INLINE inline __attribute__((always_inline))
template <int Lanes>
struct Simd {
  typedef float Vec __attribute__((vector_size(4 * Lanes)));
  typedef float Unaligned __attribute__((vector_size(4 * Lanes), aligned(4)));
  typedef int32_t Int __attribute__((vector_size(4 * Lanes)));
};
#define MT_FLASH_LOAD(p) (*reinterpret_cast<const Unaligned*>(p))
#define MT_FLASH_STORE(p, v) (*reinterpret_cast<Unaligned*>(p) = (v))

template <int Lanes>
MT_FLASH_INLINE float vec_max(const typename Simd<Lanes>::Vec& v) {
  float m = v[0];
  for (int i = 1; i < Lanes; ++i) m = std::max(m, v[i]);
  return m;
}
template <int Lanes>
MT_FLASH_INLINE float vec_sum(const typename Simd<Lanes>::Vec& v) {
  float sum = 0;
  for (int i = 0; i < Lanes; ++i) sum += v[i];
  return sum;
}

// y[0:Lanes) = exp(x[0:Lanes) - shift), added to *sum when given: Cephes' expf polynomial (within 2 ulp), exactly 0
// where x - shift < -87 (-inf included); x - shift <= 88 assumed.
template <int Lanes>
MT_FLASH_INLINE void exp_shifted(const float* x, float shift, float* y, typename Simd<Lanes>::Vec* sum) {
  using Vec = typename Simd<Lanes>::Vec;
  using Unaligned = typename Simd<Lanes>::Unaligned;
  const Vec z = MT_FLASH_LOAD(x) - shift;
  const Vec clamped = z < -87.0f ? -87.0f : z;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const Vec n = (clamped * 1.44269504088896341f + shifter) - shifter;
  const Vec r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;
  Vec p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const typename Simd<Lanes>::Int exponent = (__builtin_convertvector(n, typename Simd<Lanes>::Int) + 127) << 23;
  Vec two_to_n;
  std::memcpy(&two_to_n, &exponent, sizeof two_to_n);
  const Vec result = z < -87.0f ? 0.0f : p * two_to_n;
  MT_FLASH_STORE(y, result);
  if (sum) *sum += result;
}

// c[r, 0:2 Lanes) (+)= sum_d A(r, d) b[d, 0:2 Lanes) for r < Rows, where A(r, d) = a[r * a_row + d * a_depth] (so A
// may be a transposed tile) and b, c are row-major with strides ldb, ldc.
template <int Lanes, int Rows>
MT_FLASH_INLINE void micro_product(int64_t depth, const float* a, int64_t a_row, int64_t a_depth, const float* b,
                                   int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  using Vec = typename Simd<Lanes>::Vec;
  using Unaligned = typename Simd<Lanes>::Unaligned;
  Vec low[Rows], high[Rows];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    low[r] = accumulate ? MT_FLASH_LOAD(c + r * ldc) : Vec{};
    high[r] = accumulate ? MT_FLASH_LOAD(c + r * ldc + Lanes) : Vec{};
  }
  for (int64_t d = 0; d < depth; ++d) {
    const Vec b_low = MT_FLASH_LOAD(b + d * ldb), b_high = MT_FLASH_LOAD(b + d * ldb + Lanes);
    const float* a_d = a + d * a_depth;
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const float a_rd = a_d[r * a_row];  // a vector-scalar product broadcasts the scalar
      low[r] += b_low * a_rd;
      high[r] += b_high * a_rd;
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
    MT_FLASH_STORE(c + r * ldc, low[r]);
    MT_FLASH_STORE(c + r * ldc + Lanes, high[r]);
  }
}

// c[rows, cols] (+)= A[rows, depth] b[depth, cols] with A as in micro_product; cols a multiple of kColumnStep.
template <int Lanes>
MT_FLASH_INLINE void tile_product(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t a_row,
                                  int64_t a_depth, const float* b, int64_t ldb, float* c, int64_t ldc,
                                  bool accumulate) {
  for (int64_t j = 0; j < cols; j += 2 * Lanes) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      micro_product<Lanes, 6>(depth, a + r * a_row, a_row, a_depth, b + j, ldb, c + r * ldc + j, ldc, accumulate);
    const float* a_r = a + r * a_row;
    float* c_r = c + r * ldc + j;
    switch (rows - r) {
      case 5: micro_product<Lanes, 5>(depth, a_r, a_row, a_depth, b + j, ldb, c_r, ldc, accumulate); break;
      case 4: micro_product<Lanes, 4>(depth, a_r, a_row, a_depth, b + j, ldb, c_r, ldc, accumulate); break;
      case 3: micro_product<Lanes, 3>(depth, a_r, a_row, a_depth, b + j, ldb, c_r, ldc, accumulate); break;
      case 2: micro_product<Lanes, 2>(depth, a_r, a_row, a_depth, b + j, ldb, c_r, ldc, accumulate); break;
      case 1: micro_product<Lanes, 1>(depth, a_r, a_row, a_depth, b + j, ldb, c_r, ldc, accumulate); break;
      default: break;
    }
  }
}

// ---- The inputs as the tasks read them. ----

// The positions and document ids of a tile (documents: those of its real keys only).
struct TileRange {
  int64_t min_position, max_position, min_document, max_document;
};

enum class TileSight { none, some, all };

struct Layout {
  int64_t B, H, K, G, T, S, E, P, C;  // C key tiles of kFlashKeyTile (the last one padded)
  int64_t query_tiles;
  bool documents;
  torch::Tensor query_positions_BT, key_positions_BN, query_documents_BT, key_documents_BN;  // int64; N = C * tile
  std::vector<TileRange> query_tiles_BR, key_tiles_BC;  // [b * tiles + tile]

  int64_t query_rows(int64_t tile) const { return std::min(kFlashQueryTile, T - tile * kFlashQueryTile); }
  // The computed columns of key tile `tile`: its real keys rounded up to kColumnStep (the rest are masked padding).
  int64_t key_columns(int64_t tile) const {
    const int64_t real = std::min(kFlashKeyTile, S - tile * kFlashKeyTile);
    return (real + kColumnStep - 1) / kColumnStep * kColumnStep;
  }
  TileSight sight(int64_t b, int64_t query_tile, int64_t key_tile) const {
    const TileRange& q = query_tiles_BR[b * query_tiles + query_tile];
    const TileRange& k = key_tiles_BC[b * C + key_tile];
    if (k.min_position > q.max_position) return TileSight::none;
    if (documents && (k.max_document < q.min_document || k.min_document > q.max_document)) return TileSight::none;
    const bool one_document =
        !documents || (q.min_document == q.max_document && k.min_document == k.max_document &&
                       q.min_document == k.min_document);
    return k.max_position <= q.min_position && one_document ? TileSight::all : TileSight::some;
  }
};

// [n] or [B, n] integers as int64 [B, n] (contiguous), padded with `pad` to `padded` columns.
torch::Tensor per_row(const torch::Tensor& t, int64_t B, int64_t n, int64_t padded, int64_t pad, const char* what) {
  MT_CHECK((t.dim() == 1 && t.size(0) == n) || (t.dim() == 2 && t.size(0) == B && t.size(1) == n),
           "flash_attention: {} must be [{}] or [{}, {}], got {}", what, n, B, n, c10::str(t.sizes()));
  MT_CHECK(t.scalar_type() == torch::kLong || t.scalar_type() == torch::kInt, "flash_attention: {} must be int32 or "
           "int64, got {}", what, c10::toString(t.scalar_type()));
  torch::Tensor rows = t.to(torch::kLong).expand({B, n});
  if (padded > n) rows = torch::constant_pad_nd(rows, {0, padded - n}, pad);
  return rows.contiguous();
}

std::vector<TileRange> tile_ranges(const torch::Tensor& positions_BN, const torch::Tensor& documents_BN,
                                   int64_t real, int64_t tile, int64_t tiles, int64_t B,
                                   const std::function<int64_t(int64_t)>& width) {
  std::vector<TileRange> ranges(B * tiles);
  const int64_t n = positions_BN.size(1);
  const int64_t* positions = positions_BN.data_ptr<int64_t>();
  const int64_t* documents = documents_BN.defined() ? documents_BN.data_ptr<int64_t>() : nullptr;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < tiles; ++t) {
      TileRange& range = ranges[b * tiles + t];
      range = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
               std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
      for (int64_t i = t * tile; i < t * tile + width(t); ++i) {
        range.min_position = std::min(range.min_position, positions[b * n + i]);
        range.max_position = std::max(range.max_position, positions[b * n + i]);
        if (documents && i < real) {
          range.min_document = std::min(range.min_document, documents[b * n + i]);
          range.max_document = std::max(range.max_document, documents[b * n + i]);
        }
      }
    }
  return ranges;
}

Layout make_layout(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE,
                   const AttentionMask& mask) {
  MT_CHECK(q_BHTE.dim() == 4 && k_BKSE.dim() == 4 && k_BKSE.sizes() == v_BKSE.sizes() &&
               q_BHTE.size(0) == k_BKSE.size(0) && q_BHTE.size(3) == k_BKSE.size(3) && k_BKSE.size(1) >= 1 &&
               q_BHTE.size(1) % k_BKSE.size(1) == 0 && q_BHTE.size(2) >= 1 && k_BKSE.size(2) >= 1,
           "flash_attention: expected q [B, H, T, E], k and v [B, K, S, E] with H a multiple of K, got {}, {}, {}",
           c10::str(q_BHTE.sizes()), c10::str(k_BKSE.sizes()), c10::str(v_BKSE.sizes()));
  const at::ScalarType dtype = q_BHTE.scalar_type();
  MT_CHECK((dtype == torch::kFloat32 || dtype == torch::kBFloat16) && k_BKSE.scalar_type() == dtype &&
               v_BKSE.scalar_type() == dtype,
           "flash_attention: q, k, v must all be float32 or all bfloat16, got {}, {}, {}", c10::toString(dtype),
           c10::toString(k_BKSE.scalar_type()), c10::toString(v_BKSE.scalar_type()));
  MT_CHECK(mask.query_documents.defined() == mask.key_documents.defined(),
           "flash_attention: document ids must be given for both queries and keys or for neither");
  Layout l;
  l.B = q_BHTE.size(0), l.H = q_BHTE.size(1), l.K = k_BKSE.size(1), l.G = l.H / l.K;
  l.T = q_BHTE.size(2), l.S = k_BKSE.size(2), l.E = q_BHTE.size(3);
  l.P = (l.E + kColumnStep - 1) / kColumnStep * kColumnStep;
  l.C = (l.S + kFlashKeyTile - 1) / kFlashKeyTile;
  l.query_tiles = (l.T + kFlashQueryTile - 1) / kFlashQueryTile;
  l.documents = mask.query_documents.defined();
  const int64_t N = l.C * kFlashKeyTile;
  l.query_positions_BT = per_row(mask.query_positions, l.B, l.T, l.T, 0, "query positions");
  l.key_positions_BN = per_row(mask.key_positions, l.B, l.S, N, kPaddedKeyPosition, "key positions");
  if (l.documents) {
    l.query_documents_BT = per_row(mask.query_documents, l.B, l.T, l.T, 0, "query documents");
    l.key_documents_BN = per_row(mask.key_documents, l.B, l.S, N, 0, "key documents");
  }
  l.query_tiles_BR = tile_ranges(l.query_positions_BT, l.query_documents_BT, l.T, kFlashQueryTile, l.query_tiles, l.B,
                                 [&](int64_t t) { return l.query_rows(t); });
  l.key_tiles_BC = tile_ranges(l.key_positions_BN, l.key_documents_BN, l.S, kFlashKeyTile, l.C, l.B,
                               [&](int64_t t) { return l.key_columns(t); });
  return l;
}

// x [B, heads, n, E] as contiguous fp32 [B, heads, padded_n, P] (zeros in the padding), times `scale`.
torch::Tensor padded_fp32(const torch::Tensor& x, int64_t padded_n, int64_t P, double scale = 1.0) {
  torch::Tensor x32 = x.to(torch::kFloat32);
  if (scale != 1.0) x32 = x32 * scale;
  if (padded_n > x.size(2) || P > x.size(3))
    x32 = torch::constant_pad_nd(x32, {0, P - x.size(3), 0, padded_n - x.size(2)});
  return x32.contiguous();
}

// k or v padded [B, K, C * N, P] as [B, K, C, P, N]: each key tile transposed and contiguous, so that a product with
// it reads rows of N keys.
torch::Tensor tiles_transposed(const torch::Tensor& x_BKNP, const Layout& l) {
  return x_BKNP.view({l.B, l.K, l.C, kFlashKeyTile, l.P}).transpose(-1, -2).contiguous();
}

// Masks the unseen scores of a tile whose keys a query sees only in part: s[r, c] = -inf.
MT_FLASH_INLINE void mask_tile(const Layout& l, int64_t b, int64_t query_tile, int64_t key_tile, int64_t rows,
                               int64_t columns, float* s, int64_t lds) {
  const int64_t i0 = query_tile * kFlashQueryTile, j0 = key_tile * kFlashKeyTile, N = l.C * kFlashKeyTile;
  const int64_t* query_positions = l.query_positions_BT.data_ptr<int64_t>() + b * l.T + i0;
  const int64_t* key_positions = l.key_positions_BN.data_ptr<int64_t>() + b * N + j0;
  const int64_t* query_documents = l.documents ? l.query_documents_BT.data_ptr<int64_t>() + b * l.T + i0 : nullptr;
  const int64_t* key_documents = l.documents ? l.key_documents_BN.data_ptr<int64_t>() + b * N + j0 : nullptr;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < columns; ++c)
      if (key_positions[c] > query_positions[r] || (query_documents && key_documents[c] != query_documents[r]))
        s[r * lds + c] = kMinusInfinity;
}

// A parallel loop over tasks 0 .. n-1 taken in that order by whichever thread is free (put the longest first).
void run_tasks(int64_t n, const std::function<void(int64_t task, std::vector<float>& scratch)>& task) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t t = next++; t < n; t = next++) task(t, scratch);
  });
}

// ---- Forward. ----

struct ForwardBuffers {
  const float* q_BHTP;   // scaled by 1 / sqrt(E)
  const float* kt_BKCPN;
  const float* v_BKNP;
  float* out_BTHP;  // [B, T, H, P]: the model reads it as [B, T, H * E] without a copy
  float* lse_BHT;
};

// One (b, h, query tile): online softmax over the key tiles it sees.
template <int Lanes>
MT_FLASH_INLINE void forward_task(const Layout& l, const ForwardBuffers& x, int64_t b, int64_t h, int64_t query_tile,
                                  std::vector<float>& scratch) {
  using Vec = typename Simd<Lanes>::Vec;
  using Unaligned = typename Simd<Lanes>::Unaligned;
  const int64_t P = l.P, N = kFlashKeyTile, kv = b * l.K + h / l.G;
  const int64_t rows = l.query_rows(query_tile), bht0 = (b * l.H + h) * l.T + query_tile * kFlashQueryTile;
  scratch.resize(kFlashQueryTile * N + 2 * kFlashQueryTile);
  float* s_RN = scratch.data();
  float* max_R = s_RN + kFlashQueryTile * N;
  float* sum_R = max_R + kFlashQueryTile;
  const float* q_RP = x.q_BHTP + bht0 * P;
  const int64_t ldo = l.H * P;
  float* out_RP = x.out_BTHP + ((b * l.T + query_tile * kFlashQueryTile) * l.H + h) * P;
  for (int64_t r = 0; r < rows; ++r) std::fill(out_RP + r * ldo, out_RP + r * ldo + P, 0.0f);
  std::fill(max_R, max_R + rows, kMinusInfinity);
  std::fill(sum_R, sum_R + rows, 0.0f);
  for (int64_t key_tile = 0; key_tile < l.C; ++key_tile) {
    const TileSight sight = l.sight(b, query_tile, key_tile);
    if (sight == TileSight::none) continue;
    const int64_t W = l.key_columns(key_tile);
    tile_product<Lanes>(rows, W, P, q_RP, P, 1, x.kt_BKCPN + (kv * l.C + key_tile) * P * N, N, s_RN, N, false);
    if (sight == TileSight::some) mask_tile(l, b, query_tile, key_tile, rows, W, s_RN, N);
    for (int64_t r = 0; r < rows; ++r) {
      float* s_N = s_RN + r * N;
      Vec top = MT_FLASH_LOAD(s_N);
      for (int64_t c = Lanes; c < W; c += Lanes) {
        const Vec s = MT_FLASH_LOAD(s_N + c);
        top = s > top ? s : top;
      }
      const float new_max = std::max(max_R[r], vec_max<Lanes>(top));
      if (new_max == kMinusInfinity) {  // nothing seen yet: the row's probabilities are 0
        std::fill(s_N, s_N + W, 0.0f);
        continue;
      }
      Vec sum = {};
      for (int64_t c = 0; c < W; c += Lanes) exp_shifted<Lanes>(s_N + c, new_max, s_N + c, &sum);
      const float rescale = max_R[r] == kMinusInfinity ? 0.0f : std::exp(max_R[r] - new_max);
      sum_R[r] = sum_R[r] * rescale + vec_sum<Lanes>(sum);
      max_R[r] = new_max;
      if (rescale != 1.0f)
        for (float* o = out_RP + r * ldo; o < out_RP + r * ldo + P; o += Lanes)
          MT_FLASH_STORE(o, MT_FLASH_LOAD(o) * rescale);
    }
    tile_product<Lanes>(rows, P, W, s_RN, N, 1, x.v_BKNP + (kv * l.C * N + key_tile * N) * P, P, out_RP, ldo, true);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool seen = sum_R[r] > 0;
    const float by = seen ? 1.0f / sum_R[r] : 0.0f;
    for (float* o = out_RP + r * ldo; o < out_RP + r * ldo + P; o += Lanes) MT_FLASH_STORE(o, MT_FLASH_LOAD(o) * by);
    x.lse_BHT[bht0 + r] = seen ? max_R[r] + std::log(sum_R[r]) : kMinusInfinity;
  }
}


// ---- Backward. ----

struct BackwardBuffers {
  const float* q_BHTP;  // scaled by 1 / sqrt(E)
  const float* kt_BKCPN;
  const float* k_BKNP;
  const float* vt_BKCPN;
  const float* grad_out_BHTP;
  const float* lse_BHT;
  const float* delta_BHT;            // rowsum(grad_out * out) - grad_lse
  std::vector<float*> grad_q_BHTP;   // one partial sum per key range (each filled by the tasks of that range)
  float* grad_k_BKNP;
  float* grad_v_BKNP;
};

// One (b, key/value head, key tiles [first, end)): the tiles' dK and dV over the G query heads of the group and every
// query tile that sees them, and their contributions to dQ (into partial sum `part`).
template <int Lanes>
MT_FLASH_INLINE void backward_task(const Layout& l, const BackwardBuffers& x, int64_t b, int64_t kv_head, int64_t first,
                                   int64_t end, int64_t part, std::vector<float>& scratch) {
  using Unaligned = typename Simd<Lanes>::Unaligned;
  const int64_t P = l.P, N = kFlashKeyTile, kv = b * l.K + kv_head, R = kFlashQueryTile;
  scratch.resize(2 * R * N);
  float* p_RN = scratch.data();
  float* ds_RN = p_RN + R * N;
  for (int64_t key_tile = first; key_tile < end; ++key_tile) {
    const int64_t W = l.key_columns(key_tile), key0 = kv * l.C * N + key_tile * N;
    const float* kt_PN = x.kt_BKCPN + (kv * l.C + key_tile) * P * N;
    const float* vt_PN = x.vt_BKCPN + (kv * l.C + key_tile) * P * N;
    float* grad_k_WP = x.grad_k_BKNP + key0 * P;
    float* grad_v_WP = x.grad_v_BKNP + key0 * P;
    for (int64_t h = kv_head * l.G; h < (kv_head + 1) * l.G; ++h)
      for (int64_t query_tile = 0; query_tile < l.query_tiles; ++query_tile) {
        const TileSight sight = l.sight(b, query_tile, key_tile);
        if (sight == TileSight::none) continue;
        const int64_t rows = l.query_rows(query_tile), bht0 = (b * l.H + h) * l.T + query_tile * R;
        const float* q_RP = x.q_BHTP + bht0 * P;
        const float* grad_out_RP = x.grad_out_BHTP + bht0 * P;
        // The probabilities again, from the scores and the saved log-sum-exp.
        tile_product<Lanes>(rows, W, P, q_RP, P, 1, kt_PN, N, p_RN, N, false);
        if (sight == TileSight::some) mask_tile(l, b, query_tile, key_tile, rows, W, p_RN, N);
        for (int64_t r = 0; r < rows; ++r) {
          float* p_N = p_RN + r * N;
          const float lse = x.lse_BHT[bht0 + r];
          if (lse == kMinusInfinity) {
            std::fill(p_N, p_N + W, 0.0f);
            continue;
          }
          for (int64_t c = 0; c < W; c += Lanes) exp_shifted<Lanes>(p_N + c, lse, p_N + c, nullptr);
        }
        tile_product<Lanes>(W, P, rows, p_RN, 1, N, grad_out_RP, P, grad_v_WP, P, true);  // dV += P^T dO
        tile_product<Lanes>(rows, W, P, grad_out_RP, P, 1, vt_PN, N, ds_RN, N, false);     // dP = dO V^T
        for (int64_t r = 0; r < rows; ++r) {  // dS = P (dP - delta)
          const float delta = x.delta_BHT[bht0 + r];
          for (int64_t c = r * N; c < r * N + W; c += Lanes)
            MT_FLASH_STORE(ds_RN + c, MT_FLASH_LOAD(p_RN + c) * (MT_FLASH_LOAD(ds_RN + c) - delta));
        }
        tile_product<Lanes>(W, P, rows, ds_RN, 1, N, q_RP, P, grad_k_WP, P, true);  // dK += dS^T (q / sqrt(E))
        tile_product<Lanes>(rows, P, W, ds_RN, N, 1, x.k_BKNP + key0 * P, P, x.grad_q_BHTP[part] + bht0 * P, P,
                     true);  // dQ += dS K (times 1 / sqrt(E) at the end)
      }
  }
}

// The tasks built for the CPU: AVX2 and FMA when it has them (x86-64), the build's baseline vectors otherwise.
struct TaskKernels {
  void (*forward)(const Layout&, const ForwardBuffers&, int64_t, int64_t, int64_t, std::vector<float>&);
  void (*backward)(const Layout&, const BackwardBuffers&, int64_t, int64_t, int64_t, int64_t, int64_t,
                   std::vector<float>&);
};

void forward_baseline(const Layout& l, const ForwardBuffers& x, int64_t b, int64_t h, int64_t query_tile,
                      std::vector<float>& scratch) {
  forward_task<4>(l, x, b, h, query_tile, scratch);
}
void backward_baseline(const Layout& l, const BackwardBuffers& x, int64_t b, int64_t kv_head, int64_t first,
                       int64_t end, int64_t part, std::vector<float>& scratch) {
  backward_task<4>(l, x, b, kv_head, first, end, part, scratch);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void forward_avx2(const Layout& l, const ForwardBuffers& x, int64_t b, int64_t h,
                                                        int64_t query_tile, std::vector<float>& scratch) {
  forward_task<8>(l, x, b, h, query_tile, scratch);
}
__attribute__((target("avx2,fma"))) void backward_avx2(const Layout& l, const BackwardBuffers& x, int64_t b,
                                                         int64_t kv_head, int64_t first, int64_t end, int64_t part,
                                                         std::vector<float>& scratch) {
  backward_task<8>(l, x, b, kv_head, first, end, part, scratch);
}
#endif

const TaskKernels& task_kernels() {
#if defined(__x86_64__)
  static const TaskKernels kernels = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                         ? TaskKernels{forward_avx2, backward_avx2}
                                         : TaskKernels{forward_baseline, backward_baseline};
#else
  static const TaskKernels kernels{forward_baseline, backward_baseline};
#endif
  return kernels;
}

// ---- The passes. ----

AttentionResult attention_forward(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE,
                                  const torch::Tensor& v_BKSE, const Layout& l) {
  torch::NoGradGuard no_grad;
  const int64_t N = l.C * kFlashKeyTile;
  const torch::Tensor q_BHTP = padded_fp32(q_BHTE, l.T, l.P, 1.0 / std::sqrt(static_cast<double>(l.E)));
  const torch::Tensor v_BKNP = padded_fp32(v_BKSE, N, l.P);
  const torch::Tensor kt_BKCPN = tiles_transposed(padded_fp32(k_BKSE, N, l.P), l);
  torch::Tensor out_BTHP = torch::empty({l.B, l.T, l.H, l.P}, torch::kFloat32);
  torch::Tensor lse_BHT = torch::empty({l.B, l.H, l.T}, torch::kFloat32);
  const ForwardBuffers x{q_BHTP.data_ptr<float>(), kt_BKCPN.data_ptr<float>(), v_BKNP.data_ptr<float>(),
                         out_BTHP.data_ptr<float>(), lse_BHT.data_ptr<float>()};
  // Tasks (b, h, query tile), those with the most key tiles to see first.
  struct Task {
    int64_t b, h, query_tile, tiles;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < l.B; ++b)
    for (int64_t query_tile = 0; query_tile < l.query_tiles; ++query_tile) {
      int64_t tiles = 0;
      for (int64_t key_tile = 0; key_tile < l.C; ++key_tile)
        tiles += l.sight(b, query_tile, key_tile) != TileSight::none;
      for (int64_t h = 0; h < l.H; ++h) tasks.push_back({b, h, query_tile, tiles});
    }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.tiles > b.tiles; });
  const auto task_fn = task_kernels().forward;
  run_tasks(static_cast<int64_t>(tasks.size()), [&](int64_t t, std::vector<float>& scratch) {
    task_fn(l, x, tasks[t].b, tasks[t].h, tasks[t].query_tile, scratch);
  });
  const torch::Tensor out_BHTE = (l.P == l.E ? out_BTHP : out_BTHP.narrow(-1, 0, l.E)).transpose(1, 2);
  return {out_BHTE.to(q_BHTE.scalar_type()), lse_BHT};  // to() keeps the strides
}

struct Gradients {
  torch::Tensor q_BHTE, k_BKSE, v_BKSE;
};

Gradients attention_backward(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE,
                             const torch::Tensor& out_BHTE, const torch::Tensor& lse_BHT,
                             const torch::Tensor& grad_out_BHTE, const torch::Tensor& grad_lse_BHT, const Layout& l) {
  torch::NoGradGuard no_grad;
  const int64_t N = l.C * kFlashKeyTile;
  const double scale = 1.0 / std::sqrt(static_cast<double>(l.E));
  const torch::Tensor q_BHTP = padded_fp32(q_BHTE, l.T, l.P, scale);
  const torch::Tensor k_BKNP = padded_fp32(k_BKSE, N, l.P);
  const torch::Tensor kt_BKCPN = tiles_transposed(k_BKNP, l);
  const torch::Tensor vt_BKCPN = tiles_transposed(padded_fp32(v_BKSE, N, l.P), l);
  const torch::Tensor grad_out32_BHTE =
      grad_out_BHTE.defined() ? grad_out_BHTE.to(torch::kFloat32) : torch::zeros_like(lse_BHT).unsqueeze(-1);
  const torch::Tensor grad_out_BHTP =
      grad_out_BHTE.defined() ? padded_fp32(grad_out_BHTE, l.T, l.P) : torch::zeros({l.B, l.H, l.T, l.P});
  torch::Tensor delta_BHT = (grad_out32_BHTE * out_BHTE.to(torch::kFloat32)).sum(-1);
  if (grad_lse_BHT.defined()) delta_BHT = delta_BHT - grad_lse_BHT.to(torch::kFloat32);
  delta_BHT = delta_BHT.contiguous();

  // Tasks (b, key/value head, range of key tiles). A task owns its keys' dK and dV; the G query heads' dQ of a range
  // goes to that range's partial sum, so that no two threads write one element. With several threads and fewer
  // (b, head) pairs than twice their number, each pair's key tiles are split into ranges of about equal work (up to 4).
  const int64_t threads = at::get_num_threads(), pairs = l.B * l.K;
  const int64_t wanted = threads > 1 ? (2 * threads + pairs - 1) / pairs : 1;
  const int64_t ranges = std::clamp<int64_t>(wanted, 1, std::min<int64_t>(4, l.C));
  struct Task {
    int64_t b, kv_head, first, end, part, tiles;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < l.B; ++b) {
    std::vector<int64_t> work_C(l.C, 0);  // query tiles that see each key tile
    for (int64_t key_tile = 0; key_tile < l.C; ++key_tile)
      for (int64_t query_tile = 0; query_tile < l.query_tiles; ++query_tile)
        work_C[key_tile] += l.sight(b, query_tile, key_tile) != TileSight::none;
    const int64_t total = std::accumulate(work_C.begin(), work_C.end(), int64_t{0});
    int64_t first = 0, done = 0;
    for (int64_t part = 0; part < ranges; ++part) {
      int64_t end = first, tiles = 0;
      // Up to this range's share of the work (the last range takes the rest).
      while (end < l.C && (part == ranges - 1 || done + tiles < total * (part + 1) / ranges)) tiles += work_C[end++];
      done += tiles;
      for (int64_t kv_head = 0; kv_head < l.K; ++kv_head)
        if (end > first) tasks.push_back({b, kv_head, first, end, part, tiles});
      first = end;
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.tiles > b.tiles; });

  std::vector<torch::Tensor> grad_q_parts_BHTP;
  for (int64_t part = 0; part < ranges; ++part) grad_q_parts_BHTP.push_back(torch::zeros({l.B, l.H, l.T, l.P}));
  torch::Tensor grad_k_BKNP = torch::zeros({l.B, l.K, N, l.P}), grad_v_BKNP = torch::zeros({l.B, l.K, N, l.P});
  BackwardBuffers x{q_BHTP.data_ptr<float>(), kt_BKCPN.data_ptr<float>(), k_BKNP.data_ptr<float>(),
                    vt_BKCPN.data_ptr<float>(), grad_out_BHTP.data_ptr<float>(), lse_BHT.data_ptr<float>(),
                    delta_BHT.data_ptr<float>(), {}, grad_k_BKNP.data_ptr<float>(), grad_v_BKNP.data_ptr<float>()};
  for (torch::Tensor& part : grad_q_parts_BHTP) x.grad_q_BHTP.push_back(part.data_ptr<float>());
  const auto task_fn = task_kernels().backward;
  run_tasks(static_cast<int64_t>(tasks.size()), [&](int64_t t, std::vector<float>& scratch) {
    const Task& task = tasks[t];
    task_fn(l, x, task.b, task.kv_head, task.first, task.end, task.part, scratch);
  });

  torch::Tensor grad_q_BHTP = grad_q_parts_BHTP[0];
  for (size_t part = 1; part < grad_q_parts_BHTP.size(); ++part) grad_q_BHTP.add_(grad_q_parts_BHTP[part]);
  grad_q_BHTP.mul_(scale);
  auto unpad = [&](const torch::Tensor& x_BXNP, int64_t n, at::ScalarType dtype) {
    return x_BXNP.narrow(2, 0, n).narrow(3, 0, l.E).to(dtype);
  };
  return {unpad(grad_q_BHTP, l.T, q_BHTE.scalar_type()), unpad(grad_k_BKNP, l.S, k_BKSE.scalar_type()),
          unpad(grad_v_BKNP, l.S, v_BKSE.scalar_type())};
}

struct FlashAttentionFunction : torch::autograd::Function<FlashAttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE,
                               const torch::Tensor& v_BKSE, const AttentionMask& mask) {
    const Layout l = make_layout(q_BHTE, k_BKSE, v_BKSE, mask);
    AttentionResult result = attention_forward(q_BHTE, k_BKSE, v_BKSE, l);
    ctx->save_for_backward({q_BHTE, k_BKSE, v_BKSE, result.out_BHTE, result.lse_BHT});
    ctx->saved_data["query_positions"] = mask.query_positions;
    ctx->saved_data["key_positions"] = mask.key_positions;
    ctx->saved_data["query_documents"] = mask.query_documents;
    ctx->saved_data["key_documents"] = mask.key_documents;
    return {result.out_BHTE, result.lse_BHT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    auto tensor = [&](const char* name) {
      const c10::IValue& value = ctx->saved_data[name];
      return value.isTensor() ? value.toTensor() : torch::Tensor();
    };
    const AttentionMask mask{tensor("query_positions"), tensor("key_positions"), tensor("query_documents"),
                             tensor("key_documents")};
    const Layout l = make_layout(saved[0], saved[1], saved[2], mask);
    Gradients grads =
        attention_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grad_outputs[0], grad_outputs[1], l);
    return {grads.q_BHTE, grads.k_BKSE, grads.v_BKSE, torch::Tensor()};
  }
};

}  // namespace

AttentionMask AttentionMask::causal(int64_t first_query_position, int64_t queries, int64_t keys) {
  return {torch::arange(first_query_position, first_query_position + queries, torch::kLong),
          torch::arange(keys, torch::kLong), torch::Tensor(), torch::Tensor()};
}

AttentionResult flash_attention(const torch::Tensor& q_BHTE, const torch::Tensor& k_BKSE, const torch::Tensor& v_BKSE,
                                const AttentionMask& mask) {
  const bool differentiable = torch::GradMode::is_enabled() &&
                              (q_BHTE.requires_grad() || k_BKSE.requires_grad() || v_BKSE.requires_grad());
  if (!differentiable) return attention_forward(q_BHTE, k_BKSE, v_BKSE, make_layout(q_BHTE, k_BKSE, v_BKSE, mask));
  variable_list outputs = FlashAttentionFunction::apply(q_BHTE, k_BKSE, v_BKSE, mask);
  return {outputs[0], outputs[1]};
}

int64_t flash_attention_backward_bytes_per_position(int64_t H, int64_t K, int64_t head_dim) {
  const int64_t P = (head_dim + kColumnStep - 1) / kColumnStep * kColumnStep;
  return 4 * P * (H * (2 + 4) + K * (4 + 2));
}

}  // namespace meshtrain::model
