// AVX2 fallback of the quantized linear kernels (same packed layout and numerics as AVX-512).
//
// Without VNNI the int8 dot products use vpmaddwd on int16-widened weights and activations; each
// 16-byte quarter of a 64-byte weight vector holds 4 channels x 4 K values, and pairs of partial
// sums are folded with hadd at the end of each K-block.  Rows go in passes of 2 (16 ymm regs).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kMaxRows = 2;

inline __m256 load8(const void* x, bool bf16, int64_t i) {
  if (bf16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(x) + i);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Quantizes one full block of fp32/bf16 values (rounding rule in qgemm.h); returns its scale.
float quantize_block(const void* x, bool bf16, int blk, int8_t* q, int16_t* q16, int32_t* sum) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < blk; i += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(load8(x, bf16, i), absmask));
  const float a = hmax(amax);
  const __m256 vinv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  __m256i s = _mm256_setzero_si256();
  for (int i = 0; i < blk; i += 16) {
    __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i), vinv));
    __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i + 8), vinv));
    q0 = _mm256_max_epi32(_mm256_min_epi32(q0, lim), nlim);
    q1 = _mm256_max_epi32(_mm256_min_epi32(q1, lim), nlim);
    s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + i), w);
    const __m256i b = _mm256_permute4x64_epi64(_mm256_packs_epi16(w, w), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm256_castsi256_si128(b));
  }
  *sum = hsum(s);
  return a / 127.f;
}

inline float load1(const char* x, bool bf16, int64_t i) {
  if (!bf16) return reinterpret_cast<const float*>(x)[i];
  const uint32_t u = (uint32_t)reinterpret_cast<const uint16_t*>(x)[i] << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

inline __m256i bcast8(const int16_t* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm256_set1_epi64x(v);
}

// Folds four pair-interleaved partial sums (4 channels each) into 2 x 8 channels in order.
inline void fold(const __m256i (&s)[4], __m256i& lo, __m256i& hi) {
  lo = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[0], s[1]), 0xD8);
  hi = _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[2], s[3]), 0xD8);
}

inline __m256i to_bf16(__m256 y) {
  __m256i u = _mm256_castps_si256(y);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_srli_epi32(u, 16);
}

template <int R>
void store_rows(const OutSpec& o, int64_t t, int64_t r0, __m256 (&acc)[R][2]) {
  const int64_t n0 = t * kTileN;
  const int64_t n = std::min<int64_t>(kTileN, o.N - n0);
  alignas(32) float b[kTileN] = {};
  if (o.bias) std::memcpy(b, o.bias + n0, n * sizeof(float));
  for (int r = 0; r < R; ++r) {
    const __m256 y0 = _mm256_add_ps(acc[r][0], _mm256_load_ps(b));
    const __m256 y1 = _mm256_add_ps(acc[r][1], _mm256_load_ps(b + 8));
    const int64_t off = (r0 + r) * o.ldo + n0;
    alignas(32) uint16_t h[kTileN];
    alignas(32) float f[kTileN];
    if (o.bf16) {
      const __m256i p = _mm256_packus_epi32(to_bf16(y0), to_bf16(y1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(h), _mm256_permute4x64_epi64(p, 0xD8));
      std::memcpy(static_cast<uint16_t*>(o.out) + off, h, n * 2);
    } else {
      _mm256_store_ps(f, y0);
      _mm256_store_ps(f + 8, y1);
      std::memcpy(static_cast<float*>(o.out) + off, f, n * 4);
    }
  }
}

// int8 (u8 = w + 128): see the AVX-512 kernel for the formula.
template <int R>
void tile_int8(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * kTileN;
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int b = 0; b < a.nb; ++b) {
    __m256i s[R][4];
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_si256();
    const uint8_t* wb = wt + (int64_t)b * w.blk * kTileN;
    const int16_t* xb = a.x16 + r0 * a.Kp + (int64_t)b * w.blk;
    for (int k = 0; k < w.blk; k += 4) {
      __m256i xv[R];
      for (int r = 0; r < R; ++r) xv[r] = bcast8(xb + r * a.Kp + k);
      for (int p = 0; p < 4; ++p) {
        const __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(wb + k * kTileN + 16 * p)));
        for (int r = 0; r < R; ++r) s[r][p] = _mm256_add_epi32(s[r][p], _mm256_madd_epi16(wv, xv[r]));
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.nb + b;
      const __m256i init = _mm256_set1_epi32(a.xc[i]);  // -128 * sum(xq)
      __m256i lo, hi;
      fold(s[r], lo, hi);
      const __m256 xs = _mm256_set1_ps(a.xs[i]);
      acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, init)), xs, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(hi, init)), xs, acc[r][1]);
    }
  }
  const __m256 sc0 = _mm256_loadu_ps(w.scale + t * kTileN), sc1 = _mm256_loadu_ps(w.scale + t * kTileN + 8);
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm256_mul_ps(acc[r][0], sc0);
    acc[r][1] = _mm256_mul_ps(acc[r][1], sc1);
  }
  store_rows<R>(o, t, r0, acc);
}

// Adds xs * (d * P + mn * xsum) for one group of one row (8 + 8 channels).
inline void int4_group(__m256 (&acc)[2], __m256i lo, __m256i hi, const uint16_t* d,
                       const uint16_t* mn, float xs, float xc) {
  const __m256 vx = _mm256_set1_ps(xs), vxs = _mm256_set1_ps(xc);
  const __m256i p[2] = {lo, hi};
  for (int h = 0; h < 2; ++h) {
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + 8 * h)));
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(mn + 8 * h)));
    acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(p[h]), vx), dv, acc[h]);
    acc[h] = _mm256_fmadd_ps(mv, vxs, acc[h]);
  }
}

template <int R>
void tile_int4(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * (kTileN / 2);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int g = 0; g < a.nb; ++g) {
    __m256i s[R][4];
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = _mm256_setzero_si256();
    const uint8_t* wg = wt + (int64_t)g * w.blk * (kTileN / 2);
    const int16_t* xg = a.x16 + r0 * a.Kp + (int64_t)g * w.blk;
    for (int k = 0; k < w.blk; k += 8) {
      __m256i xl[R], xh[R];
      for (int r = 0; r < R; ++r) {
        xl[r] = bcast8(xg + r * a.Kp + k);
        xh[r] = bcast8(xg + r * a.Kp + k + 4);
      }
      for (int p = 0; p < 4; ++p) {
        const __m128i v = _mm_loadu_si128((const __m128i*)(wg + k * (kTileN / 2) + 16 * p));
        const __m256i wl = _mm256_cvtepu8_epi16(_mm_and_si128(v, low4));
        const __m256i wh = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), low4));
        for (int r = 0; r < R; ++r) {
          const __m256i d = _mm256_add_epi32(_mm256_madd_epi16(wl, xl[r]), _mm256_madd_epi16(wh, xh[r]));
          s[r][p] = _mm256_add_epi32(s[r][p], d);
        }
      }
    }
    const int64_t gi = (t * a.nb + g) * kTileN;
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.nb + g;
      __m256i lo, hi;
      fold(s[r], lo, hi);
      float xc;
      std::memcpy(&xc, &a.xc[i], 4);  // xs * sum(xq)
      int4_group(acc[r], lo, hi, w.d + gi, w.mn + gi, a.xs[i], xc);
    }
  }
  store_rows<R>(o, t, r0, acc);
}

}  // namespace

void quantize_act_avx2(const ActIn& in, const ActQ& a, int64_t r0, int64_t r1) {
  const int64_t esz = in.bf16 ? 2 : 4;
  const int blk = in.blk;
  alignas(32) float tmp[128];
  for (int64_t r = r0; r < r1; ++r) {
    const char* xr = static_cast<const char*>(in.x) + r * in.ld * esz;
    for (int b = 0; b < a.nb; ++b) {
      const int64_t k0 = (int64_t)b * blk, o = r * a.Kp + k0, i = r * a.nb + b;
      const void* src = xr + k0 * esz;
      bool bf16 = in.bf16;
      if (k0 + blk > in.K) {  // the ragged last block goes through a zero-padded fp32 copy
        for (int j = 0; j < blk; ++j) tmp[j] = k0 + j < in.K ? load1(xr, bf16, k0 + j) : 0.f;
        src = tmp;
        bf16 = false;
      }
      int32_t sum;
      const float sc = quantize_block(src, bf16, blk, a.xq + o, a.x16 + o, &sum);
      a.xs[i] = sc;
      const float c = sc * (float)sum;
      if (in.int4) std::memcpy(&a.xc[i], &c, 4);
      else a.xc[i] = -128 * sum;
    }
  }
}

void tiles_avx2(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r0 = 0; r0 < o.M; r0 += kMaxRows) {
      const bool two = o.M - r0 >= 2;
      if (w.int4) {
        two ? tile_int4<2>(a, w, o, t, r0) : tile_int4<1>(a, w, o, t, r0);
      } else {
        two ? tile_int8<2>(a, w, o, t, r0) : tile_int8<1>(a, w, o, t, r0);
      }
    }
  }
}

}  // namespace swiftspec
