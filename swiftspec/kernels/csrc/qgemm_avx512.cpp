// AVX-512 VNNI kernels for weight-only int8/int4 linear layers at small M.
//
// One output tile = 16 channels.  For each K-block the 64-byte weight vectors are loaded (and,
// for int4, unpacked with shift+mask) once and fed to vpdpbusd against every row of the pass
// (up to 16 rows), so a weight tile costs one DRAM read however many rows there are.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "qgemm.h"

namespace swiftspec {
namespace {

constexpr int kMaxRows = 16;  // rows per pass: 16 int32 accumulators + weight registers

inline __m512 load_x16(const void* x, bool bf16, int64_t i, __mmask16 m) {
  if (bf16) {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + i);
}

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

// Quantize one K-block of one row: returns the block scale, writes int8 values and their sum.
void quantize_block(const void* x, bool bf16, int64_t k0, int64_t kend, int blk, int8_t* q,
                    float* scale, int32_t* sum) {
  __m512 amax = _mm512_setzero_ps();
  for (int i = 0; i < blk; i += 16) {
    __m512 v = load_x16(x, bf16, k0 + i, tail_mask(kend - k0 - i));
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  }
  const float a = _mm512_reduce_max_ps(amax);
  const float inv = a > 0.f ? 127.f / a : 0.f;
  const __m512 vinv = _mm512_set1_ps(inv);
  __m512i s = _mm512_setzero_si512();
  for (int i = 0; i < blk; i += 16) {
    __m512 v = load_x16(x, bf16, k0 + i, tail_mask(kend - k0 - i));
    __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(v, vinv));  // round half to even
    qi = _mm512_max_epi32(_mm512_min_epi32(qi, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    s = _mm512_add_epi32(s, qi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(qi));
  }
  *scale = a / 127.f;
  *sum = _mm512_reduce_add_epi32(s);
}

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
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
  const __mmask16 m = tail_mask(o.N - n0);
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

// int8: y[r, n] = scale[n] * sum_b xs[r, b] * sum_{k in b} w[n, k] * xq[r, k].
// Weights are stored as u8 = w + 128, so each block starts from -128 * sum_k xq[r, k].
template <int R>
void tile_int8(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * kTileN;
  const int8_t* x0 = a.xq + r0 * a.ldx;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < a.nb; ++b) {
    __m512i p[R];
    for (int r = 0; r < R; ++r) p[r] = _mm512_set1_epi32(-128 * a.xsum[(r0 + r) * a.nb + b]);
    const uint8_t* wb = wt + (int64_t)b * w.blk * kTileN;
    const int8_t* xb = x0 + (int64_t)b * w.blk;
#pragma GCC unroll 4
    for (int k = 0; k < w.blk; k += 4) {
      const __m512i wv = _mm512_loadu_si512(wb + k * kTileN);
      for (int r = 0; r < R; ++r) p[r] = _mm512_dpbusd_epi32(p[r], wv, bcast4(xb + r * a.ldx + k));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 s = _mm512_set1_ps(a.xs[(r0 + r) * a.nb + b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r]), s, acc[r]);
    }
  }
  const __m512 sc = _mm512_loadu_ps(w.scale + t * kTileN);
  for (int r = 0; r < R; ++r) acc[r] = _mm512_mul_ps(acc[r], sc);
  store_rows<R>(o, t, r0, acc);
}

// int4 (w = d * q + mn, q in 0..15): y[r, n] = sum_g xs[r, g] * (d * P + mn * xsum[r, g]).
// Each 64-byte vector holds, per channel lane, k..k+3 in the low and k+4..k+7 in the high nibbles.
template <int R>
void tile_int4(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * (kTileN / 2);
  const uint16_t* dt = w.d + t * a.nb * kTileN;
  const uint16_t* mt = w.mn + t * a.nb * kTileN;
  const int8_t* x0 = a.xq + r0 * a.ldx;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int g = 0; g < a.nb; ++g) {
    __m512i p[R];
    for (int r = 0; r < R; ++r) p[r] = _mm512_setzero_si512();
    const uint8_t* wg = wt + (int64_t)g * w.blk * (kTileN / 2);
    const int8_t* xg = x0 + (int64_t)g * w.blk;
#pragma GCC unroll 2
    for (int k = 0; k < w.blk; k += 8) {
      const __m512i v = _mm512_loadu_si512(wg + k * (kTileN / 2));
      const __m512i lo = _mm512_and_si512(v, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      for (int r = 0; r < R; ++r) {
        p[r] = _mm512_dpbusd_epi32(p[r], lo, bcast4(xg + r * a.ldx + k));
        p[r] = _mm512_dpbusd_epi32(p[r], hi, bcast4(xg + r * a.ldx + k + 4));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dt + g * kTileN)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(mt + g * kTileN)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.nb + g;
      const __m512 px = _mm512_mul_ps(_mm512_cvtepi32_ps(p[r]), _mm512_set1_ps(a.xs[i]));
      acc[r] = _mm512_fmadd_ps(px, d, acc[r]);
      acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a.xs[i] * (float)a.xsum[i]), acc[r]);
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

}  // namespace

void quantize_act_avx512(const void* x, bool x_bf16, int64_t M, int64_t K, int64_t ldx_in,
                         int blk, int64_t Kp, int8_t* xq, float* xs, int32_t* xsum) {
  const int64_t nb = Kp / blk;
  const int64_t esz = x_bf16 ? 2 : 4;
  for (int64_t r = 0; r < M; ++r) {
    const char* xr = static_cast<const char*>(x) + r * ldx_in * esz;
    for (int64_t b = 0; b < nb; ++b) {
      quantize_block(xr, x_bf16, b * blk, K, blk, xq + r * Kp + b * blk, xs + r * nb + b,
                     xsum + r * nb + b);
    }
  }
}

// Rows go in passes of up to 16 inside each tile, so the tile is read from DRAM once.
void tiles_avx512(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  const TileFn* fns = w.int4 ? Rows::i4 : Rows::i8;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r0 = 0; r0 < o.M; r0 += kMaxRows) {
      const int64_t rows = o.M - r0 < kMaxRows ? o.M - r0 : kMaxRows;
      fns[rows - 1](a, w, o, t, r0);
    }
  }
}

}  // namespace swiftspec
