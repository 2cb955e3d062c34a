// Small AVX2 helpers shared by the AVX2 kernel files (the twin of avx512_util.h).  Include after
// the file's `#pragma GCC target("avx2,fma,f16c")`: the helpers have internal linkage, so every
// file compiles its own copy for its own target and none leaks into the generic glue.
//
// AVX2 has no mask registers: a partial vector of n < 8 lanes goes through vmaskmov for fp32
// and through a zero-padded 8-lane buffer for bf16 (no 16-bit masked moves below AVX-512).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"

namespace swiftspec {
namespace {

// The 4 bytes at p in every 32-bit lane (a broadcast of 4 activation bytes for vpmaddubsw/vpdpbusd).
inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Bit b of each byte of h moved to bit 4 (0x10), the other bits 0: the fifth bit of a 5-bit
// quant (GGUF Q5_K, Q5_0), stored as a bit plane.
inline __m256i bit_to_4(__m256i h, int b) {
  const __m256i v = b <= 4 ? _mm256_slli_epi16(h, 4 - b) : _mm256_srli_epi16(h, b - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Tiles [t0, t1), each in row passes of P rows over rows [0, M) (the last pass shorter):
// pass(rows, t, r0) with rows a std::integral_constant<int, R>, so each pass size is its own
// compile-time instance.  A tile stays in L1/L2 between its passes: it is read from DRAM once.
template <int R, class Pass>
inline void row_pass(int64_t rows, int64_t t, int64_t r0, Pass& pass) {
  if constexpr (R > 1) {
    if (rows < R) return row_pass<R - 1>(rows, t, r0, pass);
  }
  pass(std::integral_constant<int, R>{}, t, r0);
}

// Row passes of P rows over rows [m0, m0 + rows) of tile t, the last one shorter.
template <int P, class Pass>
inline void passes_over(int64_t m0, int64_t rows, int64_t t, Pass& pass) {
  for (int64_t r0 = m0; r0 < m0 + rows; r0 += P) row_pass<P>(std::min<int64_t>(P, m0 + rows - r0), t, r0, pass);
}

template <int P, class Pass>
inline void for_row_passes(int64_t M, int64_t t0, int64_t t1, Pass pass) {
  for (int64_t t = t0; t < t1; ++t) passes_over<P>(0, M, t, pass);
}

// The quantized linears' other order: tiles [t0, t1), each in chunks of up to kChunkRows rows,
// chunk(t, m0, rows); a chunk runs its row passes block by block of K (each block read from DRAM
// once and reused from L1 by every pass), its fp32 sums in memory (store_chunk writes them).
constexpr int kChunkRows = 16;

template <class Chunk>
inline void for_row_chunks(int64_t M, int64_t t0, int64_t t1, Chunk chunk) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m0 = 0; m0 < M; m0 += kChunkRows) chunk(t, m0, std::min<int64_t>(kChunkRows, M - m0));
  }
}

// Lanes [0, n) set (n clamped to [0, 8]), as vmaskmov takes them.
inline __m256i tail8(int64_t n) {
  const int32_t k = static_cast<int32_t>(n < 0 ? 0 : n > 8 ? 8 : n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 values at p[i, i + 8), bf16 or fp32, widened to fp32; with n < 8 only p[i, i + n) is read and
// the other lanes are 0.
inline __m256 load8(const void* p, bool bf16, int64_t i, int64_t n = 8) {
  if (bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(p) + i;
    __m128i h;
    if (n >= 8) {
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    } else {
      uint16_t buf[8] = {};
      std::memcpy(buf, src, (n > 0 ? n : 0) * sizeof(uint16_t));
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  const float* src = static_cast<const float*>(p) + i;
  return n >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, tail8(n));
}

// y rounded to bf16 (nearest even, as torch rounds finite values), kept as fp32.
inline __m256 round_bf16(__m256 y) {
  __m256i u = _mm256_castps_si256(y);
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                                           _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Stores lanes [0, n) of y at p[i, ...) as fp32, or rounded to bf16.
inline void store8(void* p, bool bf16, int64_t i, __m256 y, int64_t n = 8) {
  if (!bf16) {
    float* dst = static_cast<float*>(p) + i;
    if (n >= 8) {
      _mm256_storeu_ps(dst, y);
    } else {
      _mm256_maskstore_ps(dst, tail8(n), y);
    }
    return;
  }
  // The rounded values' high halves are in [0, 0xFFFF]: the unsigned saturating pack keeps them.
  const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(y)), 16);
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
  uint16_t* dst = static_cast<uint16_t*>(p) + i;
  if (n >= 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
  } else if (n > 0) {
    uint16_t buf[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buf), h);
    std::memcpy(dst, buf, n * sizeof(uint16_t));
  }
}

// Sum of the 8 lanes, always in this order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x): 2^n * P(r), x = n ln2 + r, |r| <= ln2 / 2, P of degree 6 (rel. error ~2e-7), as
// avx512_util.h's exp_ps.  Without vscalefps, 2^n is built in the exponent bits in two halves,
// 2^(n >> 1) * 2^(n - (n >> 1)), each a normal float for the clamped n in [-126, 145]: P * 2^(n >> 1)
// is exact and the second product rounds once, so the result is P * 2^n rounded once, as scalef
// gives it (subnormal results included).  Inputs below -87 give ~0 and above ~88.7 overflow to
// +inf, as expf does.  The empty asm makes the result a finished value: GCC would otherwise fuse
// the last product into an FMA with a later add (1 + exp(-x) of SiLU, a softmax's sum), which
// scalef's result on AVX-512 never is.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(100.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i lo = _mm256_srai_epi32(ni, 1), hi = _mm256_sub_epi32(ni, lo);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(lo, bias), 23));
  const __m256 s_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(hi, bias), 23));
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, s_lo), s_hi);
  __asm__("" : "+x"(e));
  return e;
}

// Rows [m0, m0 + rows) of tile t from their fp32 sums acc [rows][kTileN], plus the bias.
inline void store_chunk(const OutSpec& o, int64_t t, int64_t m0, int64_t rows, const float (*acc)[kTileN]) {
  for (int hh = 0; hh < 2; ++hh) {  // the tile's two ymm halves
    const int64_t n0 = t * kTileN + 8 * hh, n = std::min<int64_t>(8, o.N - n0);
    if (n <= 0) return;
    const __m256 b = o.bias ? load8(o.bias, false, n0, n) : _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; ++r)
      store8(o.out, o.bf16, (m0 + r) * o.ldo + n0, _mm256_add_ps(_mm256_load_ps(acc[r] + 8 * hh), b), n);
  }
}

}  // namespace
}  // namespace swiftspec
