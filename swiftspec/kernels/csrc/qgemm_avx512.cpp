// AVX-512 VNNI kernels for weight-only int8/int4 linear layers at small M.
//
// One output tile = 16 channels.  For each K-block the 64-byte weight vectors are loaded (and,
// for int4, unpacked with shift+mask) once and fed to vpdpbusd against every row of the pass
// (up to 16 rows), so a weight tile costs one DRAM read however many rows there are.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "avx512_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

// Quantizes x[k0, k0 + blk) of one row (zeros past kend); the 4-byte k-groups go to dst[g * step].
// Returns the scale; *sum gets the sum of the int8 values.
float quantize_block(const void* x, bool bf16, int64_t k0, int64_t kend, int blk, int32_t* dst,
                     int64_t step, int32_t* sum) {
  __m512 amax = _mm512_setzero_ps();
  for (int i = 0; i < blk; i += 16) {
    amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(x, bf16, k0 + i, tail16(kend - k0 - i))));
  }
  const float a = _mm512_reduce_max_ps(amax);
  const __m512 vinv = _mm512_set1_ps(a > 0.f ? 127.f / a : 0.f);
  __m512i s = _mm512_setzero_si512();
  alignas(16) int32_t g[4];
  for (int i = 0; i < blk; i += 16) {
    const __m512 v = load16(x, bf16, k0 + i, tail16(kend - k0 - i));
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // round half to even
    q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    s = _mm512_add_epi32(s, q);
    _mm_store_si128(reinterpret_cast<__m128i*>(g), _mm512_cvtepi32_epi8(q));
    for (int j = 0; j < 4; ++j) dst[(i / 4 + j) * step] = g[j];
  }
  *sum = _mm512_reduce_add_epi32(s);
  return a / 127.f;
}

// fp32 -> bf16 with round-to-nearest-even (matches torch for finite values).
inline __m256i to_bf16(__m512 y) {
  __m512i u = _mm512_castps_si512(y);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

// Adds bias to the fp32 tile and writes R rows of 16 channels (masked at the N tail).
template <int R>
void store_rows(const OutSpec& o, int64_t t, int64_t r0, __m512 (&acc)[R]) {
  const int64_t n0 = t * kTileN;
  const __mmask16 m = tail16(o.N - n0);
  const __m512 b = o.bias ? _mm512_maskz_loadu_ps(m, o.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    const __m512 y = _mm512_add_ps(acc[r], b);
    const int64_t off = (r0 + r) * o.ldo + n0;
    if (o.bf16) {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(o.out) + off, m, to_bf16(y));
    } else {
      _mm512_mask_storeu_ps(static_cast<float*>(o.out) + off, m, y);
    }
  }
}

// With few rows, one accumulator per row would chain every vpdpbusd on the previous one's
// latency; small passes use two chains per row (int32 sums are exact in any order).
template <int R>
constexpr bool kSplit = R <= 4;

// Software prefetch in the weight stream for passes of several rows: the loop is then busy
// computing and the hardware prefetcher alone leaves DRAM idle (one row is pure streaming).
// int8 prefetches into L2 8 KiB ahead, int4 into L1 2 KiB ahead: each the faster of the two for
// its format (docs/bench/kernels.md, "Tuning notes").
template <int R, bool Int4>
inline void prefetch(const uint8_t* p) {
  if constexpr (R > 1 && Int4) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
  if constexpr (R > 1 && !Int4) _mm_prefetch(reinterpret_cast<const char*>(p + 8192), _MM_HINT_T1);
}

// int8: y[r, n] = scale[n] * sum_b xs[r, b] * sum_{k in b} w[n, k] * xq[r, k].
// Weights are stored as u8 = w + 128, so each block starts from xc = -128 * sum_k xq[r, k].
template <int R>
void tile_int8(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * kTileN;
  const int32_t* xi = reinterpret_cast<const int32_t*>(a.xq + r0 * a.Kp);  // [Kp/4][R]
  const float* xs = a.xs + r0 * a.nb;                                      // [nb][R]
  const int32_t* xc = a.xc + r0 * a.nb;
  const int steps = w.blk / 4;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < a.nb; ++b) {
    __m512i p[R], p2[R];  // p2: second accumulator chain for odd steps when R is small
    for (int r = 0; r < R; ++r) p[r] = _mm512_set1_epi32(xc[b * R + r]), p2[r] = _mm512_setzero_si512();
    const uint8_t* wb = wt + (int64_t)b * steps * 64;
    const int32_t* xb = xi + (int64_t)b * steps * R;
#pragma GCC unroll 2
    for (int s = 0; s < steps; s += 2) {
      const __m512i w0 = _mm512_loadu_si512(wb + s * 64), w1 = _mm512_loadu_si512(wb + s * 64 + 64);
      prefetch<R, false>(wb + s * 64);
      prefetch<R, false>(wb + s * 64 + 64);
      for (int r = 0; r < R; ++r) p[r] = _mm512_dpbusd_epi32(p[r], w0, _mm512_set1_epi32(xb[s * R + r]));
      for (int r = 0; r < R; ++r) {
        __m512i& acc2 = kSplit<R> ? p2[r] : p[r];
        acc2 = _mm512_dpbusd_epi32(acc2, w1, _mm512_set1_epi32(xb[(s + 1) * R + r]));
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (kSplit<R>) p[r] = _mm512_add_epi32(p[r], p2[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r]), _mm512_set1_ps(xs[b * R + r]), acc[r]);
    }
  }
  const __m512 sc = _mm512_loadu_ps(w.scale + t * kTileN);
  for (int r = 0; r < R; ++r) acc[r] = _mm512_mul_ps(acc[r], sc);
  store_rows<R>(o, t, r0, acc);
}

// int4 (w = d * q + mn, q in 0..15): y[r, n] = sum_g xs[r, g] * (d * P + mn * xsum[r, g]),
// P = sum_k q * xq.  Per channel lane, a 64-byte vector holds k..k+3 in the low and k+4..k+7 in
// the high nibbles, i.e. the k-groups 2s and 2s + 1 of the activations.
template <int R>
void tile_int4(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * (kTileN / 2);
  const uint16_t* dt = w.d + t * a.nb * kTileN;
  const uint16_t* mt = w.mn + t * a.nb * kTileN;
  const int32_t* xi = reinterpret_cast<const int32_t*>(a.xq + r0 * a.Kp);  // [Kp/4][R]
  const float* xs = a.xs + r0 * a.nb;                                      // [nb][R]
  const float* xc = reinterpret_cast<const float*>(a.xc + r0 * a.nb);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int steps = w.blk / 8;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int g = 0; g < a.nb; ++g) {
    __m512i p[R], p2[R];  // p2: second accumulator chain for the high nibbles when R is small
    for (int r = 0; r < R; ++r) p[r] = p2[r] = _mm512_setzero_si512();
    const uint8_t* wg = wt + (int64_t)g * steps * 64;
    const int32_t* xg = xi + (int64_t)g * steps * 2 * R;
#pragma GCC unroll 2
    for (int s = 0; s < steps; ++s) {
      const __m512i v = _mm512_loadu_si512(wg + s * 64);
      prefetch<R, true>(wg + s * 64);
      const __m512i lo = _mm512_and_si512(v, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      for (int r = 0; r < R; ++r) {
        __m512i& acc2 = kSplit<R> ? p2[r] : p[r];
        p[r] = _mm512_dpbusd_epi32(p[r], lo, _mm512_set1_epi32(xg[(2 * s) * R + r]));
        acc2 = _mm512_dpbusd_epi32(acc2, hi, _mm512_set1_epi32(xg[(2 * s + 1) * R + r]));
      }
    }
    if constexpr (kSplit<R>) {
      for (int r = 0; r < R; ++r) p[r] = _mm512_add_epi32(p[r], p2[r]);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dt + g * kTileN)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mt + g * kTileN)));
    for (int r = 0; r < R; ++r) {
      const __m512 px = _mm512_mul_ps(_mm512_cvtepi32_ps(p[r]), _mm512_set1_ps(xs[g * R + r]));
      acc[r] = _mm512_fmadd_ps(px, d, acc[r]);
      acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xc[g * R + r]), acc[r]);
    }
  }
  store_rows<R>(o, t, r0, acc);
}

using TileFn = void (*)(const ActQ&, const PackedW&, const OutSpec&, int64_t, int64_t);

template <int... Rs>
struct Table {
  static constexpr TileFn i8[] = {tile_int8<Rs>...};
  static constexpr TileFn i4[] = {tile_int4<Rs>...};
};
using Rows = Table<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;
static_assert(kPassRows == 16, "one table entry per pass size");

}  // namespace

void quantize_act_avx512(const ActIn& in, const ActQ& a, int64_t r0, int64_t r1) {
  const int64_t esz = in.bf16 ? 2 : 4;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t p0 = r / kPassRows * kPassRows;  // first row of r's pass
    const int64_t R = in.M - p0 < kPassRows ? in.M - p0 : kPassRows, ri = r - p0;
    const char* xr = static_cast<const char*>(in.x) + r * in.ld * esz;
    int32_t* xi = reinterpret_cast<int32_t*>(a.xq + p0 * a.Kp);
    for (int b = 0; b < a.nb; ++b) {
      const int64_t k0 = (int64_t)b * in.blk, o = p0 * a.nb + b * R + ri;
      int32_t sum;
      const float sc = quantize_block(xr, in.bf16, k0, in.K, in.blk, xi + k0 / 4 * R + ri, R, &sum);
      a.xs[o] = sc;
      const float c = sc * (float)sum;
      if (in.int4) std::memcpy(&a.xc[o], &c, 4);
      else a.xc[o] = -128 * sum;
    }
  }
}

// Rows go in passes of up to 16 inside each tile, so the tile is read from DRAM once.
void tiles_avx512(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  const TileFn* fns = w.int4 ? Rows::i4 : Rows::i8;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r0 = 0; r0 < o.M; r0 += kPassRows) {
      const int64_t rows = o.M - r0 < kPassRows ? o.M - r0 : kPassRows;
      fns[rows - 1](a, w, o, t, r0);
    }
  }
}

}  // namespace swiftspec
