// AVX-512 VNNI kernel of the K-quant linear (numerics and layouts in kquant.h).
//
// Per tile (16 channels) and super-block, each 64-byte nibble vector (plus, for 6-bit weights,
// its 2 high bits from qh) is unpacked once into two u8 operands and fed to vpdpbusd for every row
// of the pass.  A sub-block's int32 dot products are scaled by its integer scale (vpmulld); the
// mins term uses vpdpwssd on (mm pair, xsum pair).  All integer sums are exact.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "avx512_util.h"
#include "kquant.h"

namespace swiftspec {
namespace {

constexpr int kPass = kPassAvx512;  // the int32 sums of 8 rows and the weights fit 32 zmm

inline __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The two u8 operands (k = 8s + i and k = 8s + 4 + i) of global step s.
template <int Bits>
inline void unpack(const uint8_t* q, const uint8_t* qh, int64_t s, __m512i& lo, __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30);
  const __m512i v = _mm512_loadu_si512(q + s * 64);
  lo = _mm512_and_si512(v, low4);
  hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  if constexpr (Bits == 6) {
    const __m512i h = _mm512_loadu_si512(qh + (s / 2) * 64);
    const __m512i hl = s % 2 ? h : _mm512_slli_epi16(h, 4);
    const __m512i hh = s % 2 ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
    lo = _mm512_or_si512(lo, _mm512_and_si512(hl, b45));
    hi = _mm512_or_si512(hi, _mm512_and_si512(hh, b45));
  }
}

// The weight stream is prefetched into L1, 2 KiB ahead: passes of several rows are busy computing
// (the hardware prefetcher alone then leaves DRAM idle), and a one-row pass measured faster with
// it too (the quants are one of five streams per tile, beside sc, mm, d and dm).
template <int Bits>
inline void prefetch(const uint8_t* q, const uint8_t* qh, int64_t s) {
  _mm_prefetch(reinterpret_cast<const char*>(q + s * 64 + kPrefetchBytes), _MM_HINT_T0);
  if (Bits == 6 && s % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(qh + s * 32 + kPrefetchBytes), _MM_HINT_T0);
}

// With few rows, one accumulator per row would chain every vpdpbusd on the previous one's
// latency: small passes give the high-nibble operands a second chain (int32 sums: any order).
template <int R>
constexpr bool kSplit = R <= 4;

// isum[r] += sc * sum_{k in sub-block} q xq for rows [r0, r0 + R).
template <int Bits, int R>
inline void sub_block(const KAct& a, const KTile<Bits>& k, int64_t sub, int64_t r0, __m512i (&isum)[R]) {
  constexpr int kSubSteps = Bits == 4 ? 4 : 2;  // 8-k steps per sub-block
  __m512i p[R], p2[R];
  for (int r = 0; r < R; ++r) p[r] = p2[r] = _mm512_setzero_si512();
  for (int s = 0; s < kSubSteps; ++s) {
    const int64_t gs = sub * kSubSteps + s;
    __m512i lo, hi;
    unpack<Bits>(k.q, k.qh, gs, lo, hi);
    prefetch<Bits>(k.q, k.qh, gs);
    const int8_t* x = a.xq + r0 * a.K + gs * 8 * R;  // [k-group][R][4]
    for (int r = 0; r < R; ++r) {
      __m512i& acc2 = kSplit<R> ? p2[r] : p[r];
      p[r] = _mm512_dpbusd_epi32(p[r], lo, bcast4(x + 4 * r));
      acc2 = _mm512_dpbusd_epi32(acc2, hi, bcast4(x + 4 * (R + r)));
    }
  }
  // The pair (sub & ~1, sub | 1) as int16 lanes; this sub-block's scale sign-extended to int32.
  const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(k.sc + (sub & ~1) * kTileN)));
  const __m512i sc = sub % 2 ? _mm512_srai_epi32(pair, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16);
  for (int r = 0; r < R; ++r) {
    if constexpr (kSplit<R>) p[r] = _mm512_add_epi32(p[r], p2[r]);
    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(p[r], sc));
  }
}

// Rows [r0, r0 + R) of tile t.  The fp32 accumulators live in memory (touched once per
// super-block), leaving the registers to the integer sums.
template <int Bits, int R>
void ktile(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t, int64_t r0) {
  const KTile<Bits> k(w, a.K, t);
  constexpr int kSubs = KTile<Bits>::kSubs;
  alignas(64) float acc[R][kTileN] = {};
  for (int64_t b = 0; b < k.nsb; ++b) {
    __m512i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    for (int j = 0; j < kSubs; ++j) sub_block<Bits, R>(a, k, b * kSubs + j, r0, isum);
    __m512i mm[kSubs / 2];
    for (int j = 0; j < kSubs / 2; ++j) {
      mm[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(k.mm + (b * kSubs + 2 * j) * kTileN)));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k.d + b * kTileN)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(k.dm + b * kTileN)));
    for (int r = 0; r < R; ++r) {
      const int16_t* xsum = a.xsum + (r0 + r) * k.nsub + b * kSubs;
      __m512i msum = _mm512_setzero_si512();
      for (int j = 0; j < kSubs / 2; ++j) msum = _mm512_dpwssd_epi32(msum, mm[j], bcast4(xsum + 2 * j));
      const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), d, _mm512_mul_ps(_mm512_cvtepi32_ps(msum), dm));
      const __m512 xs = _mm512_set1_ps(a.xs[(r0 + r) * k.nsb + b]);
      _mm512_store_ps(acc[r], _mm512_fmadd_ps(y, xs, _mm512_load_ps(acc[r])));
    }
  }
  const int64_t n0 = t * kTileN;
  const __mmask16 m = tail16(o.N - n0);
  const __m512 bias = o.bias ? _mm512_maskz_loadu_ps(m, o.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    store16(o.out, o.bf16, (r0 + r) * o.ldo + n0, _mm512_add_ps(_mm512_load_ps(acc[r]), bias), m);
  }
}

using TileFn = void (*)(const KAct&, const KWeight&, const OutSpec&, int64_t, int64_t);

template <int Bits, int... Rs>
struct Table {
  static constexpr TileFn fns[] = {ktile<Bits, Rs>...};
};
using Q4 = Table<4, 1, 2, 3, 4, 5, 6, 7, 8>;
using Q6 = Table<6, 1, 2, 3, 4, 5, 6, 7, 8>;

}  // namespace

void kquantize_row_avx512(const KRowIn& in, int8_t* dst, int64_t R, float* xs, int16_t* xsum) {
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  for (int64_t k0 = 0; k0 < in.K; k0 += kSuperK) {
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < kSuperK; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load16(in.x, in.bf16, k0 + i)));
    const float a = _mm512_reduce_max_ps(amax);
    const __m512 inv = _mm512_set1_ps(a > 0.f ? 127.f / a : 0.f);
    int32_t s = 0;
    for (int i = 0; i < kSuperK; i += 16) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(load16(in.x, in.bf16, k0 + i), inv));  // half to even
      q = _mm512_max_epi32(_mm512_min_epi32(q, lim), nlim);
      alignas(16) int32_t g[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(g), _mm512_cvtepi32_epi8(q));
      for (int j = 0; j < 4; ++j) std::memcpy(dst + ((k0 + i) / 4 + j) * R * 4, &g[j], 4);
      s += _mm512_reduce_add_epi32(q);
      if ((i + 16) % in.sub == 0) xsum[(k0 + i) / in.sub] = static_cast<int16_t>(s), s = 0;
    }
    xs[k0 / kSuperK] = a / 127.f;
  }
}

// Rows go in passes of up to 8 inside each tile: the tile stays in L1/L2 between passes.
void ktiles_avx512(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1) {
  const TileFn* fns = w.bits == 4 ? Q4::fns : Q6::fns;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t r0 = 0; r0 < o.M; r0 += kPass) {
      const int64_t rows = o.M - r0 < kPass ? o.M - r0 : kPass;
      fns[rows - 1](a, w, o, t, r0);
    }
  }
}

}  // namespace swiftspec
