// The passes of the 256-bit K-quant linear (numerics and layouts in kquant.h; the same bits as
// AVX-512), shared by kquant_avx2.cpp (AVX2 + FMA + F16C) and kquant_avxvnni.cpp (+ AVX-VNNI).
// Include after the file's `#pragma GCC target(...)`; everything here has internal linkage.
//
// V = false: no vpdpbusd.  vpmaddubsw (u8 q x s8 xq -> pairwise s16 sums) then vpmaddwd.
// vpmaddubsw saturates, so the 16-bit lanes are widened before they can overflow:
// - 4-bit q (0..15): a pair sums to at most 2 * 15 * 127 = 3,810; a lane takes the 8 pairs of a
//   32-k sub-block (4 steps x 2 operands, <= 30,480), widened once per sub-block.
// - 5-bit q (0..31): a pair sums to at most 2 * 31 * 127 = 7,874; a lane takes two steps (4
//   operands, <= 31,496), widened twice per 32-k sub-block.
// - 6-bit q (0..63): a pair sums to at most 2 * 63 * 127 = 16,002; a lane takes one step's two
//   operands (<= 32,004), widened every step.
// The widening vpmaddwd multiplies by the sub-block scale (|sc| <= 128: |products| < 2^23).
// The 16-bit sums use the saturating add, which never saturates within these bounds and which the
// compiler may not reassociate (the plain add's sums were regrouped into a tree that spilled to
// the stack: ~1.4x the time at 8 rows).
// V = true: vpdpbusd sums a sub-block straight into int32 lanes (no saturation), and vpmulld
// applies its scale: the same exact integers.  5-bit weights run V = false at every level
// (kquant_linear.cpp): the V = true instance could not be run on the host they were written on.
// One 64-byte weight vector (16 channels x 4 bytes) is two ymm halves of 8 channels; a pass
// unpacks each vector once for all its rows.
#pragma once
#include <immintrin.h>

#include <algorithm>

#include "avx2_util.h"
#include "kquant.h"

namespace swiftspec {
namespace {

constexpr int H = 2;  // ymm halves of a tile

// 8-k steps per sub-block, and (V = false) steps a 16-bit lane takes before it is widened.
template <int Bits>
constexpr int kSubSteps = Bits == 6 ? 2 : 4;
template <int Bits>
constexpr int kWidenSteps = Bits == 4 ? 4 : Bits == 5 ? 2 : 1;

// Half hh of the two u8 operands of global step s (see kquant.h for qh).
template <int Bits>
inline void unpack(const uint8_t* q, const uint8_t* qh, int64_t s, int hh, __m256i& lo, __m256i& hi) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), b45 = _mm256_set1_epi8(0x30);
  const __m256i v = _mm256_loadu_si256((const __m256i*)(q + s * 64 + 32 * hh));
  lo = _mm256_and_si256(v, low4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  if constexpr (Bits == 5) {
    const __m256i h = _mm256_loadu_si256((const __m256i*)(qh + (s / 4) * 64 + 32 * hh));
    lo = _mm256_or_si256(lo, bit_to_4(h, 2 * (s % 4)));
    hi = _mm256_or_si256(hi, bit_to_4(h, 2 * (s % 4) + 1));
  }
  if constexpr (Bits == 6) {
    const __m256i h = _mm256_loadu_si256((const __m256i*)(qh + (s / 2) * 64 + 32 * hh));
    const __m256i hl = s % 2 ? h : _mm256_slli_epi16(h, 4);
    const __m256i hv = s % 2 ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 2);
    lo = _mm256_or_si256(lo, _mm256_and_si256(hl, b45));
    hi = _mm256_or_si256(hi, _mm256_and_si256(hv, b45));
  }
}

// isum[r] += sc * sum_{k in sub-block} q xq for rows [r0, r0 + R) (both halves).  V = false: the
// 16-bit sums are widened by vpmaddwd against (sc, sc) pairs, which applies the scale in the same
// step; V = true: vpdpbusd sums the sub-block in int32, then vpmulld applies sc.
template <bool V, int Bits, int R>
inline void sub_block(const KAct& a, const KTile<Bits>& k, int64_t sub, int64_t r0, __m256i (&isum)[R][H]) {
  constexpr int kSteps = kSubSteps<Bits>;
  __m256i sc16[H], p16[R][H];  // V: p16 holds int32 sums
  for (int hh = 0; hh < H; ++hh) {  // the pair (sub & ~1, sub | 1) -> this sub-block's sc, twice
    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(k.sc + (sub & ~1) * kTileN + 16 * hh)));
    sc16[hh] = sub % 2 ? _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xF5), 0xF5)
                       : _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xA0), 0xA0);
  }
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) p16[r][hh] = _mm256_setzero_si256();
  for (int s = 0; s < kSteps; ++s) {
    const int64_t gs = sub * kSteps + s;
    __m256i lo[H], hi[H];
    for (int hh = 0; hh < H; ++hh) unpack<Bits>(k.q, k.qh, gs, hh, lo[hh], hi[hh]);
    _mm_prefetch(reinterpret_cast<const char*>(k.q + gs * 64 + kPrefetchBytes), _MM_HINT_T0);  // as on AVX-512
    if (Bits == 6 && gs % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(k.qh + gs * 32 + kPrefetchBytes), _MM_HINT_T0);
    if (Bits == 5 && gs % 4 == 0) _mm_prefetch(reinterpret_cast<const char*>(k.qh + gs * 16 + kPrefetchBytes), _MM_HINT_T0);
    const int8_t* x = a.xq + r0 * a.K + gs * 8 * R;  // [k-group][R][4]
    for (int r = 0; r < R; ++r) {
      const __m256i x0 = bcast4(x + 4 * r), x1 = bcast4(x + 4 * (R + r));
      for (int hh = 0; hh < H; ++hh) {
        if constexpr (V) {
          p16[r][hh] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(p16[r][hh], lo[hh], x0), hi[hh], x1);
        } else {
          p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(lo[hh], x0));
          p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(hi[hh], x1));
        }
      }
    }
    if (V ? s == kSteps - 1 : (s + 1) % kWidenSteps<Bits> == 0) {
      for (int r = 0; r < R; ++r)
        for (int hh = 0; hh < H; ++hh) {
          const __m256i scaled = V ? _mm256_mullo_epi32(p16[r][hh], _mm256_srai_epi32(sc16[hh], 16))
                                   : _mm256_madd_epi16(p16[r][hh], sc16[hh]);
          isum[r][hh] = _mm256_add_epi32(isum[r][hh], scaled);
          p16[r][hh] = _mm256_setzero_si256();
        }
    }
  }
}

// Adds xs * fma(isum, d, msum * dm) of super-block b to acc (rows [r0, r0 + R), both halves).
template <int Bits, int R>
inline void finish_block(const KAct& a, const KTile<Bits>& k, int64_t b, int64_t r0, const __m256i (&isum)[R][H],
                         float (*acc)[kTileN]) {
  constexpr int Subs = KTile<Bits>::kSubs;
  for (int hh = 0; hh < H; ++hh) {
    const int64_t i = b * kTileN + 8 * hh;
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k.d + i)));
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(k.dm + i)));
    __m256i msum[R];
    for (int r = 0; r < R; ++r) msum[r] = _mm256_setzero_si256();
    for (int j = 0; j < Subs; j += 2) {  // each mm pair vector widened once for all rows
      const int8_t* m = k.mm + (b * Subs + j) * kTileN + 16 * hh;
      const __m256i mm = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)m));
      for (int r = 0; r < R; ++r) {
        const int16_t* xsum = a.xsum + (r0 + r) * k.nsub + b * Subs + j;
        msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(mm, bcast4(xsum)));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 mins = _mm256_mul_ps(_mm256_cvtepi32_ps(msum[r]), dm);
      const __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][hh]), d, mins);
      const __m256 xs = _mm256_set1_ps(a.xs[(r0 + r) * k.nsb + b]);
      _mm256_store_ps(acc[r] + 8 * hh, _mm256_fmadd_ps(y, xs, _mm256_load_ps(acc[r] + 8 * hh)));
    }
  }
}

// Rows [m0, m0 + rows) of tile t (rows <= kChunkRows, m0 a multiple of P), super-block by
// super-block: every row pass of P rows uses a super-block's weights from L1 before the next one
// is read, so the tile streams from DRAM at an even pace while the passes compute (tile by tile,
// pass after pass, the first pass waited on DRAM and the others left it idle).  The fp32
// accumulators live in memory (touched once per super-block).
template <bool V, int Bits, int P>
void ktile(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t, int64_t m0, int64_t rows) {
  const KTile<Bits> k(w, a.K, t);
  constexpr int kSubs = KTile<Bits>::kSubs;
  alignas(32) float acc[kChunkRows][kTileN];
  std::fill_n(acc[0], rows * kTileN, 0.f);  // only the chunk's rows
  for (int64_t b = 0; b < k.nsb; ++b) {
    auto pass = [&](auto rows_r, int64_t, int64_t r0) {
      constexpr int R = decltype(rows_r)::value;
      __m256i isum[R][H];
      for (int r = 0; r < R; ++r)
        for (int hh = 0; hh < H; ++hh) isum[r][hh] = _mm256_setzero_si256();
      for (int j = 0; j < kSubs; ++j) sub_block<V, Bits, R>(a, k, b * kSubs + j, r0, isum);
      finish_block<Bits, R>(a, k, b, r0, isum, acc + (r0 - m0));
    };
    passes_over<P>(m0, rows, t, pass);
  }
  store_chunk(o, t, m0, rows, acc);
}

// Tiles [t0, t1) for all rows, in chunks of kChunkRows rows (avx2_util.h for_row_chunks), each
// in passes of P rows (the activation layout's pass, kquant.h).
template <bool V, int P>
void run_ktiles(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1) {
  static_assert(kChunkRows % P == 0, "a chunk holds whole passes");
  for_row_chunks(o.M, t0, t1, [&](int64_t t, int64_t m0, int64_t rows) {
    if constexpr (!V) {  // 5-bit weights: V = false only (see the top)
      if (w.bits == 5) return ktile<V, 5, P>(a, w, o, t, m0, rows);
    }
    w.bits == 4 ? ktile<V, 4, P>(a, w, o, t, m0, rows) : ktile<V, 6, P>(a, w, o, t, m0, rows);
  });
}

}  // namespace
}  // namespace swiftspec
