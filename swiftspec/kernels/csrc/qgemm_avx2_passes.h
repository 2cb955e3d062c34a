// The row passes of the 256-bit int8/int4 linear, shared by two files that compile them for
// their own target: qgemm_avx2.cpp (AVX2 + FMA + F16C) and qgemm_avxvnni.cpp (+ AVX-VNNI, the
// VEX-encoded vpdpbusd of Intel's client cores since 12th gen and of AMD's since Zen 5).
// Include after the file's `#pragma GCC target(...)`; everything here has internal linkage.
//
// Dot products (same packed layout as AVX-512).  Every int32 sum is exact on both variants, so
// they give the same bits:
// - V = false: vpmaddubsw (u8 x s8 -> pairwise s16 sums), then vpmaddwd against ones (-> s32).
//   vpmaddubsw saturates, so every operand pair is kept in range:
//   - int4: q (0..15) x xq (-127..127): a pair sums to at most 3,810, so a 16-bit lane takes the
//     low and high nibbles of four k-steps (8 pairs, <= 30,480) before one vpmaddwd widens it.
//   - int8: the weight is stored as u8 = q + 128; flipping the top bit gives q as s8
//     (|q| <= 127), and vpmaddubsw(|xq|, sign(q, xq)) sums pairs of at most 2 * 127 * 127.
// - V = true: vpdpbusd adds the same u8 x s8 products straight into int32 lanes, one instruction
//   where V = false needs two or three.  int4 keeps the low and the high nibbles in separate
//   accumulators (twice the independent chains, which hides vpdpbusd's latency).
// One 64-byte weight vector (16 channels x 4 bytes) is two ymm halves of 8 channels.  A pass
// unpacks each weight vector once and feeds it to every row of the pass.
//
// Per row, the integer sums are exact and the fp32 operations and their order do not depend on
// M, the pass or the thread split: a row's result is the same in any batch.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "avx2_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kFlushSteps = 4;  // int4, V = false: k-steps (of 8 k) a 16-bit accumulator takes
constexpr int H = 2;            // ymm halves of a 16-channel tile (8 channels each)

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
template <bool V, int R>
void pass_int8(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t r0) {
  const uint8_t* wt = w.q + t * w.Kp * kTileN;
  const __m256i top = _mm256_set1_epi8(static_cast<char>(0x80));
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
      _mm_prefetch(reinterpret_cast<const char*>(wb + k * kTileN + kPrefetchBytes), _MM_HINT_T0);
      __m256i q[H];
      for (int hh = 0; hh < H; ++hh) {
        q[hh] = _mm256_loadu_si256((const __m256i*)(wb + k * kTileN + 32 * hh));
        if constexpr (!V) q[hh] = _mm256_xor_si256(q[hh], top);
      }
      for (int r = 0; r < R; ++r) {
        const int64_t x = (r0 + r) * a.Kp + k0 + k;
        const __m256i xv = bcast4(a.xq + x);
        for (int hh = 0; hh < H; ++hh) {
          if constexpr (V) {  // (q + 128) x xq; the block's -128 * sum(xq) is added below
            p[r][hh] = _mm256_dpbusd_avx_epi32(p[r][hh], q[hh], xv);
          } else {
            const __m256i d = _mm256_maddubs_epi16(bcast4(a.xabs + x), _mm256_sign_epi8(q[hh], xv));
            p[r][hh] = _mm256_add_epi32(p[r][hh], _mm256_madd_epi16(d, _mm256_set1_epi16(1)));
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (V) {
        const __m256i xc = _mm256_set1_epi32(a.xc[(r0 + r) * a.nb + b]);
        for (int hh = 0; hh < H; ++hh) p[r][hh] = _mm256_add_epi32(p[r][hh], xc);
      }
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

// Adds xs * (d * P + mn * xsum) for group g of rows [r0, r0 + R) to their fp32 accumulators
// acc[r][16] (in memory: touched once per group).
template <int R>
inline void int4_group(const ActQ& a, const uint16_t* d, const uint16_t* mn, int64_t r0, int g,
                       const __m256i (&p)[R][H], float (*acc)[kTileN]) {
  for (int hh = 0; hh < H; ++hh) {
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + 8 * hh)));
    const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(mn + 8 * hh)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * a.nb + g;
      float xc;
      std::memcpy(&xc, &a.xc[i], 4);  // xs * sum(xq)
      const __m256 px = _mm256_mul_ps(_mm256_cvtepi32_ps(p[r][hh]), _mm256_set1_ps(a.xs[i]));
      const __m256 y = _mm256_fmadd_ps(px, dv, _mm256_load_ps(acc[r] + 8 * hh));
      _mm256_store_ps(acc[r] + 8 * hh, _mm256_fmadd_ps(mv, _mm256_set1_ps(xc), y));
    }
  }
}

// P[r][hh] = sum over the group's k of q * xq (int32, exact), rows [r0, r0 + R), group g.
// Per channel lane, a step's 4 bytes hold k..k+3 in the low and k+4..k+7 in the high nibbles.
// lo, hi: one step's weight nibbles, unpacked (both ymm halves).
inline void int4_unpack(const uint8_t* ws, __m256i (&lo)[H], __m256i (&hi)[H]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  _mm_prefetch(reinterpret_cast<const char*>(ws + kPrefetchBytes), _MM_HINT_T0);
  for (int hh = 0; hh < H; ++hh) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(ws + 32 * hh));
    lo[hh] = _mm256_and_si256(v, low4);
    hi[hh] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  }
}

// V = true: vpdpbusd into int32 lanes, one k-step at a time.
template <int R>
inline void int4_sums_vnni(const ActQ& a, const uint8_t* wg, int steps, int64_t k0, int64_t r0,
                           __m256i (&p)[R][H]) {
  __m256i p2[R][H];  // the high nibbles' sums (R <= 2: twice the independent chains)
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) p[r][hh] = p2[r][hh] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int s = 0; s < steps; ++s) {
    __m256i lo[H], hi[H];
    int4_unpack(wg + s * 64, lo, hi);
    for (int r = 0; r < R; ++r) {
      const int8_t* x = a.xq + (r0 + r) * a.Kp + k0 + 8 * s;
      const __m256i x0 = bcast4(x), x1 = bcast4(x + 4);
      for (int hh = 0; hh < H; ++hh) {
        p[r][hh] = _mm256_dpbusd_avx_epi32(p[r][hh], lo[hh], x0);
        if constexpr (R <= 2) p2[r][hh] = _mm256_dpbusd_avx_epi32(p2[r][hh], hi[hh], x1);
        else p[r][hh] = _mm256_dpbusd_avx_epi32(p[r][hh], hi[hh], x1);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) p[r][hh] = _mm256_add_epi32(p[r][hh], p2[r][hh]);
}

// V = false: vpmaddubsw into 16-bit sums, widened by vpmaddwd every kFlushSteps steps.  The
// steps between two flushes are one fully unrolled block: a flush test inside the step loop made
// the compiler branch and shuffle registers every step (this runs ~1.6x faster at 2..16 rows).
// The 16-bit sums use the saturating add, which never saturates here (the bound above) and which
// the compiler may not reassociate: with the plain add it regrouped a block's sums into a tree
// whose partial sums spilled to the stack, and the pass ran ~20% slower.
template <int R>
inline void int4_sums_maddubs(const ActQ& a, const uint8_t* wg, int steps, int64_t k0, int64_t r0,
                              __m256i (&p)[R][H]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) p[r][hh] = _mm256_setzero_si256();
  for (int s0 = 0; s0 < steps; s0 += kFlushSteps) {  // steps = blk / 8: a multiple of kFlushSteps
    __m256i p16[R][H];
    for (int r = 0; r < R; ++r)
      for (int hh = 0; hh < H; ++hh) p16[r][hh] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int s = s0; s < s0 + kFlushSteps; ++s) {
      __m256i lo[H], hi[H];
      int4_unpack(wg + s * 64, lo, hi);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a.xq + (r0 + r) * a.Kp + k0 + 8 * s;
        const __m256i x0 = bcast4(x), x1 = bcast4(x + 4);
        for (int hh = 0; hh < H; ++hh) {
          p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(lo[hh], x0));
          p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(hi[hh], x1));
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int hh = 0; hh < H; ++hh) p[r][hh] = _mm256_add_epi32(p[r][hh], _mm256_madd_epi16(p16[r][hh], ones));
  }
}

// int4 (w = d * q + mn, q in 0..15): y[r, n] = sum_g xs[r, g] * (d * P + mn * xsum[r, g]).
// Rows [m0, m0 + rows) of tile t (rows <= kChunkRows), group by group: every row pass of P rows
// uses a group's weights (blk / 2 x 16 bytes) from L1 before the next group is read, so the tile
// streams from DRAM at an even pace while the passes compute.  (Tile by tile, pass after pass,
// the first pass of a tile waited on DRAM and the others left it idle: at 8 rows the weight
// stream ran at half the rate of one row's.)
template <bool V, int P>
void tile_int4(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t, int64_t m0, int64_t rows) {
  const uint8_t* wt = w.q + t * w.Kp * (kTileN / 2);
  const int64_t dt = t * a.nb * kTileN;
  const int steps = w.blk / 8;
  alignas(32) float acc[kChunkRows][kTileN];
  std::fill_n(acc[0], rows * kTileN, 0.f);  // only the chunk's rows
  for (int g = 0; g < a.nb; ++g) {
    const uint8_t* wg = wt + (int64_t)g * steps * 64;
    const int64_t k0 = (int64_t)g * w.blk;
    auto pass = [&](auto rows_r, int64_t, int64_t r0) {
      constexpr int R = decltype(rows_r)::value;
      __m256i p[R][H];
      if constexpr (V) int4_sums_vnni<R>(a, wg, steps, k0, r0, p);
      else int4_sums_maddubs<R>(a, wg, steps, k0, r0, p);
      int4_group<R>(a, w.d + dt + g * kTileN, w.mn + dt + g * kTileN, r0, g, p, acc + (r0 - m0));
    };
    passes_over<P>(m0, rows, t, pass);
  }
  store_chunk(o, t, m0, rows, acc);
}

// Tiles [t0, t1) for all M rows: int8 in row passes of up to P8 rows over both halves (a tile,
// <= 16 x 9K bytes for the largest K, is read from DRAM once: avx2_util.h for_row_passes); int4
// in chunks of kChunkRows rows (avx2_util.h for_row_chunks), each group by group in passes of up
// to P4 rows (tile_int4).
template <bool V, int P8, int P4>
void run_tiles(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  if (w.int4) {
    for_row_chunks(o.M, t0, t1, [&](int64_t t, int64_t m0, int64_t rows) { tile_int4<V, P4>(a, w, o, t, m0, rows); });
    return;
  }
  for_row_passes<P8>(o.M, t0, t1, [&](auto rows, int64_t t, int64_t r0) {
    constexpr int R = decltype(rows)::value;
    pass_int8<V, R>(a, w, o, t, r0);
  });
}

}  // namespace
}  // namespace swiftspec
