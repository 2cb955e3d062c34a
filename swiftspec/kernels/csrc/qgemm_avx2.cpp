// AVX2 kernels for weight-only int8/int4 linear layers at small M (same packed layout as AVX-512).
//
// AVX2 has no vpdpbusd; vpmaddubsw (u8 x s8 -> pairwise s16 sums) and vpmaddwd against ones
// (-> s32) do the same work in two steps.  vpmaddubsw saturates, so every operand pair is kept in
// range and the int32 sums stay exact:
// - int4: q (0..15) x xq (-127..127): a pair sums to at most 3,810, so a 16-bit lane takes the
//   low and high nibbles of four k-steps (8 pairs, <= 30,480) before one vpmaddwd widens it.
// - int8: the weight is stored as u8 = q + 128; flipping the top bit gives q as s8 (|q| <= 127),
//   and vpmaddubsw(|xq|, sign(q, xq)) sums pairs of at most 2 * 127 * 127 = 32,258.
// One 64-byte weight vector (16 channels x 4 bytes) is two ymm halves of 8 channels.  A pass
// unpacks each weight vector once and feeds it to every row of the pass; rows and halves are
// blocked so that accumulators, weights and broadcasts fit the 16 ymm registers.
//
// Per row, the sequence of integer sums, their flush points and the fp32 operations do not depend
// on M, the pass or the thread split: a row's result is the same in any batch.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "avx2_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kFlushSteps = 4;  // int4: k-steps (of 8 k) a 16-bit accumulator takes before widening
constexpr int H = 2;            // ymm halves of a 16-channel tile (8 channels each)

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

// Quantizes one full block of fp32/bf16 values (rounding rule in kernels.h) into q (int8) and
// qa (|q|, u8); returns the scale, *sum gets the sum of the int8 values.
float quantize_block(const void* x, bool bf16, int blk, int8_t* q, uint8_t* qa, int32_t* sum) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < blk; i += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(load8(x, bf16, i), absmask));
  const float a = hmax(amax);
  const __m256 vinv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  __m256i s = _mm256_setzero_si256();
  for (int i = 0; i < blk; i += 16) {
    __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i), vinv));  // round half to even
    __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i + 8), vinv));
    q0 = _mm256_max_epi32(_mm256_min_epi32(q0, lim), nlim);
    q1 = _mm256_max_epi32(_mm256_min_epi32(q1, lim), nlim);
    s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);  // 16 x s16 in order
    const __m128i b = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi16(w, w), 0x08));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qa + i), _mm_abs_epi8(b));
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

inline __m256i bcast4(const void* p) {  // the 4 bytes at p in every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Writes rows [r0, r0 + R) of tile t from acc (fp32 [R][H][8]) plus bias.
template <int R>
void store(const OutSpec& o, int64_t t, int64_t r0, const __m256 (&acc)[R][H]) {
  for (int hh = 0; hh < H; ++hh) {
    const int64_t n0 = t * kTileN + 8 * hh;
    const int64_t n = std::min<int64_t>(8, o.N - n0);
    if (n <= 0) return;
    const __m256 b = o.bias ? load8(o.bias, false, n0, n) : _mm256_setzero_ps();
    for (int r = 0; r < R; ++r) store8(o.out, o.bf16, (r0 + r) * o.ldo + n0, _mm256_add_ps(acc[r][hh], b), n);
  }
}

// A pass computes rows [r0, r0 + R) of tile t, both ymm halves at once (2R independent sums).

// int8: y[r, n] = scale[n] * sum_b xs[r, b] * sum_{k in b} q[n, k] * xq[r, k].
template <int R>
void pass_int8(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * kTileN;
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  __m256 acc[R][H];
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) acc[r][hh] = _mm256_setzero_ps();
  for (int b = 0; b < a.nb; ++b) {
    __m256i p[R][H];
    for (int r = 0; r < R; ++r)
      for (int hh = 0; hh < H; ++hh) p[r][hh] = _mm256_setzero_si256();
    const uint8_t* wb = wt + (int64_t)b * w.blk * kTileN;
    const int64_t k0 = (int64_t)b * w.blk;
    for (int k = 0; k < w.blk; k += 4) {
      __m256i q[H];
      for (int hh = 0; hh < H; ++hh) {
        q[hh] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(wb + k * kTileN + 32 * hh)), top);
      }
      for (int r = 0; r < R; ++r) {
        const int64_t x = (r0 + r) * a.Kp + k0 + k;
        const __m256i xv = bcast4(a.xq + x), xa = bcast4(a.xabs + x);
        for (int hh = 0; hh < H; ++hh) {
          const __m256i d = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(q[hh], xv));
          p[r][hh] = _mm256_add_epi32(p[r][hh], _mm256_madd_epi16(d, ones));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xs = _mm256_set1_ps(a.xs[(r0 + r) * a.nb + b]);
      for (int hh = 0; hh < H; ++hh) acc[r][hh] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[r][hh]), xs, acc[r][hh]);
    }
  }
  for (int hh = 0; hh < H; ++hh) {
    const __m256 sc = _mm256_loadu_ps(w.scale + t * kTileN + 8 * hh);
    for (int r = 0; r < R; ++r) acc[r][hh] = _mm256_mul_ps(acc[r][hh], sc);
  }
  store<R>(o, t, r0, acc);
}

// Adds xs * (d * P + mn * xsum) for group g of rows [r0, r0 + R) to acc.
template <int R>
inline void int4_group(const ActQ& a, const uint16_t* d, const uint16_t* mn, int64_t r0, int g,
                       const __m256i (&p)[R][H], __m256 (&acc)[R][H]) {
  for (int hh = 0; hh < H; ++hh) {
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + 8 * hh)));
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(mn + 8 * hh)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.nb + g;
      float xc;
      std::memcpy(&xc, &a.xc[i], 4);  // xs * sum(xq)
      const __m256 px = _mm256_mul_ps(_mm256_cvtepi32_ps(p[r][hh]), _mm256_set1_ps(a.xs[i]));
      acc[r][hh] = _mm256_fmadd_ps(px, dv, acc[r][hh]);
      acc[r][hh] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xc), acc[r][hh]);
    }
  }
}

// int4 (w = d * q + mn, q in 0..15): y[r, n] = sum_g xs[r, g] * (d * P + mn * xsum[r, g]),
// P = sum_k q * xq.  Per channel lane, a step's 4 bytes hold k..k+3 in the low and k+4..k+7 in
// the high nibbles.
template <int R>
void pass_int4(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * (kTileN / 2);
  const int64_t dt = t * a.nb * kTileN;
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const int steps = w.blk / 8;
  __m256 acc[R][H];
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) acc[r][hh] = _mm256_setzero_ps();
  for (int g = 0; g < a.nb; ++g) {
    __m256i p[R][H], p16[R][H];
    for (int r = 0; r < R; ++r)
      for (int hh = 0; hh < H; ++hh) p[r][hh] = p16[r][hh] = _mm256_setzero_si256();
    const uint8_t* wg = wt + (int64_t)g * steps * 64;
    const int64_t k0 = (int64_t)g * w.blk;
#pragma GCC unroll 2
    for (int s = 0; s < steps; ++s) {  // one k-step at a time: accumulators stay in registers
      __m256i lo[H], hi[H];
      for (int hh = 0; hh < H; ++hh) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(wg + s * 64 + 32 * hh));
        lo[hh] = _mm256_and_si256(v, low4);
        hi[hh] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.xq + (r0 + r) * a.Kp + k0 + 8 * s;
        const __m256i x0 = bcast4(x), x1 = bcast4(x + 4);
        for (int hh = 0; hh < H; ++hh) {
          p16[r][hh] = _mm256_add_epi16(p16[r][hh], _mm256_maddubs_epi16(lo[hh], x0));
          p16[r][hh] = _mm256_add_epi16(p16[r][hh], _mm256_maddubs_epi16(hi[hh], x1));
        }
      }
      if (s % kFlushSteps == kFlushSteps - 1) {
        for (int r = 0; r < R; ++r) {
          for (int hh = 0; hh < H; ++hh) {
            p[r][hh] = _mm256_add_epi32(p[r][hh], _mm256_madd_epi16(p16[r][hh], ones));
            p16[r][hh] = _mm256_setzero_si256();
          }
        }
      }
    }
    int4_group<R>(a, w.d + dt + g * kTileN, w.mn + dt + g * kTileN, r0, g, p, acc);
  }
  store<R>(o, t, r0, acc);
}

using PassFn = void (*)(const ActQ&, const PackedW&, const OutSpec&, int64_t, int64_t);
// Passes of 2 rows x 2 halves: 8 accumulators, 4 unpacked weight vectors and the broadcasts fit
// the 16 ymm registers (passes of 4 rows x 1 half measured slower: twice the broadcasts).
constexpr int kPassRowsAvx2 = 2;
constexpr PassFn kInt8[] = {pass_int8<1>, pass_int8<2>};
constexpr PassFn kInt4[] = {pass_int4<1>, pass_int4<2>};

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
      const float sc = quantize_block(src, bf16, blk, a.xq + o, a.xabs + o, &sum);
      a.xs[i] = sc;
      const float c = sc * (float)sum;
      if (in.int4) std::memcpy(&a.xc[i], &c, 4);
      else a.xc[i] = -128 * sum;
    }
  }
}

// Each tile runs its row passes over both halves; a tile (<= 16 x 9K bytes for the largest K)
// stays in L1/L2 between passes, so it is read from DRAM once.
void tiles_avx2(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  const PassFn* fns = w.int4 ? kInt4 : kInt8;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r0 = 0; r0 < o.M; r0 += kPassRowsAvx2) {
      const int64_t rows = std::min<int64_t>(kPassRowsAvx2, o.M - r0);
      fns[rows - 1](a, w, o, t, r0);
    }
  }
}

}  // namespace swiftspec
