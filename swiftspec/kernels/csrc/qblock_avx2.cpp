// AVX2 (+ FMA, F16C) kernel of the GGUF block linear (numerics and layouts in qblock.h).  It runs
// at every ISA level (qblock_linear_path): AVX-VNNI and AVX-512 twins would give the same bits
// but could not be run on the AVX2-only host this was written on, so none is shipped untested.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>

#include "avx2_util.h"
#include "qblock.h"

namespace swiftspec {
namespace {

constexpr int H = 2;      // ymm halves of a 16-channel tile (8 channels each)
constexpr int kPass = 4;  // rows per pass: each weight vector is loaded (and |q| taken) once per 4 rows

// Q8_0: isum[r][hh] = sum over block b's 32 k of q xq, rows [r0, r0 + R).  vpmaddubsw takes |q|
// (u8, at most 128: q = -128 is exact too) and xq with q's sign (|xq| <= 127), so a pair sums to
// at most 2 * 128 * 127 < 2^15; vpmaddwd widens each step's pairs to int32.
template <int R>
inline void q8_sums(const ActQ& a, const uint8_t* wb, int64_t k0, int64_t r0, __m256i (&isum)[R][H]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) isum[r][hh] = _mm256_setzero_si256();
  for (int s = 0; s < kQBlock / 4; ++s) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetchBytes), _MM_HINT_T0);
    __m256i q[H], aq[H];
    for (int hh = 0; hh < H; ++hh) {
      q[hh] = _mm256_loadu_si256((const __m256i*)(wb + s * 64 + 32 * hh));
      aq[hh] = _mm256_abs_epi8(q[hh]);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i xv = bcast4(a.xq + (r0 + r) * a.Kp + k0 + 4 * s);
      for (int hh = 0; hh < H; ++hh) {
        const __m256i p = _mm256_maddubs_epi16(aq[hh], _mm256_sign_epi8(xv, q[hh]));
        isum[r][hh] = _mm256_add_epi32(isum[r][hh], _mm256_madd_epi16(p, ones));
      }
    }
  }
}

// Q5_0 / Q4_0: isum[r][hh] = sum over block b of q xq, rows [r0, r0 + R), from u = q + 16 / q + 8:
// vpmaddubsw sums u (u8, <= 31) x xq in 16-bit lanes (a pair <= 2 * 31 * 127 = 7,874), widened
// every 2 steps of 5-bit or 4 steps of 4-bit operands (<= 31,496 / 30,480), with the saturating
// add the compiler keeps in order (kquant_avx2_passes.h); then isum = sum u xq + xc / 8 (-16 sum xq)
// or xc / 16 (-8 sum xq), exact: xc = -128 sum xq.  wb: the block's nibbles, hb: its fifth bits.
template <int Bits, int R>
inline void q45_sums(const ActQ& a, const uint8_t* wb, const uint8_t* hb, int64_t b, int64_t r0,
                     __m256i (&isum)[R][H]) {
  constexpr int kWiden = Bits == 4 ? 4 : 2;
  const __m256i ones = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
  __m256i p16[R][H], h[H];
  for (int r = 0; r < R; ++r)
    for (int hh = 0; hh < H; ++hh) isum[r][hh] = p16[r][hh] = _mm256_setzero_si256();
  if constexpr (Bits == 5) {
    _mm_prefetch(reinterpret_cast<const char*>(hb + kPrefetchBytes / 4), _MM_HINT_T0);  // 1/4 of q's rate
    for (int hh = 0; hh < H; ++hh) h[hh] = _mm256_loadu_si256((const __m256i*)(hb + 32 * hh));
  }
  for (int s = 0; s < kQBlock / 8; ++s) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + s * 64 + kPrefetchBytes), _MM_HINT_T0);
    __m256i lo[H], hi[H];
    for (int hh = 0; hh < H; ++hh) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(wb + s * 64 + 32 * hh));
      lo[hh] = _mm256_and_si256(v, low4);
      hi[hh] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      if constexpr (Bits == 5) {
        lo[hh] = _mm256_or_si256(lo[hh], bit_to_4(h[hh], 2 * s));
        hi[hh] = _mm256_or_si256(hi[hh], bit_to_4(h[hh], 2 * s + 1));
      }
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* x = a.xq + (r0 + r) * a.Kp + b * kQBlock + 8 * s;
      const __m256i x0 = bcast4(x), x1 = bcast4(x + 4);
      for (int hh = 0; hh < H; ++hh) {
        p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(lo[hh], x0));
        p16[r][hh] = _mm256_adds_epi16(p16[r][hh], _mm256_maddubs_epi16(hi[hh], x1));
      }
    }
    if ((s + 1) % kWiden == 0) {
      for (int r = 0; r < R; ++r)
        for (int hh = 0; hh < H; ++hh) {
          isum[r][hh] = _mm256_add_epi32(isum[r][hh], _mm256_madd_epi16(p16[r][hh], ones));
          p16[r][hh] = _mm256_setzero_si256();
        }
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256i c = _mm256_set1_epi32(a.xc[(r0 + r) * a.nb + b] / (Bits == 5 ? 8 : 16));
    for (int hh = 0; hh < H; ++hh) isum[r][hh] = _mm256_add_epi32(isum[r][hh], c);
  }
}

// acc[r] = fma(float(isum) * xs, d, acc[r]) for block b of rows [r0, r0 + R); d: the block's 16 scales.
template <int R>
inline void finish_block(const ActQ& a, const uint16_t* d, int64_t r0, int64_t b, const __m256i (&isum)[R][H],
                         float (*acc)[kTileN]) {
  for (int hh = 0; hh < H; ++hh) {
    const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + 8 * hh)));
    for (int r = 0; r < R; ++r) {
      const __m256 px = _mm256_mul_ps(_mm256_cvtepi32_ps(isum[r][hh]), _mm256_set1_ps(a.xs[(r0 + r) * a.nb + b]));
      _mm256_store_ps(acc[r] + 8 * hh, _mm256_fmadd_ps(px, dv, _mm256_load_ps(acc[r] + 8 * hh)));
    }
  }
}

// Rows [m0, m0 + rows) of tile t (rows <= kChunkRows), block by block: every pass of kPass rows
// uses a block's weights from L1 before the next block is read (as the int4 and K-quant linears
// do); the fp32 sums live in memory.
template <int Bits>
void tile(const ActQ& a, const QBlockW& w, const OutSpec& o, int64_t t, int64_t m0, int64_t rows) {
  constexpr int64_t kBlockBytes = Bits == 8 ? kQBlock * kTileN : kQBlock * kTileN / 2;  // of q, per tile
  const int64_t nb = w.K / kQBlock;
  const uint8_t* wt = w.q + t * nb * kBlockBytes;
  const uint8_t* ht = Bits == 5 ? w.qh + t * nb * 64 : nullptr;
  alignas(32) float acc[kChunkRows][kTileN];
  std::fill_n(acc[0], rows * kTileN, 0.f);  // only the chunk's rows
  for (int64_t b = 0; b < nb; ++b) {
    auto pass = [&](auto rows_r, int64_t, int64_t r0) {
      constexpr int R = decltype(rows_r)::value;
      __m256i isum[R][H];
      if constexpr (Bits == 8) q8_sums<R>(a, wt + b * kBlockBytes, b * kQBlock, r0, isum);
      else q45_sums<Bits, R>(a, wt + b * kBlockBytes, Bits == 5 ? ht + b * 64 : nullptr, b, r0, isum);
      finish_block<R>(a, w.d + (t * nb + b) * kTileN, r0, b, isum, acc + (r0 - m0));
    };
    passes_over<kPass>(m0, rows, t, pass);
  }
  store_chunk(o, t, m0, rows, acc);
}

}  // namespace

void qblock_tiles_avx2(const ActQ& a, const QBlockW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  for_row_chunks(o.M, t0, t1, [&](int64_t t, int64_t m0, int64_t rows) {
    w.bits == 8 ? tile<8>(a, w, o, t, m0, rows) : w.bits == 5 ? tile<5>(a, w, o, t, m0, rows) : tile<4>(a, w, o, t, m0, rows);
  });
}

}  // namespace swiftspec
