// AVX-512 masked attention for a few query rows (decode, tree verification, draft expansion).
//
// Layout-invariant numerics: a query row first lists the slots its mask lets it read, in slot
// order, and then runs every reduction over that compact list (scores, max, sum of exp, weighted
// sum of V) in a fixed order.  The result therefore depends only on the ordered set of attended
// keys, not on where they sit in the cache nor on masked slots between them: a tree node whose
// siblings are interleaved with its ancestors gets the same bits as the same token decoded alone
// after a contiguous prefix.  With the batch-invariant linears this makes greedy tree
// verification pick exactly the tokens autoregressive decoding picks.
//
// A block of query rows (tree nodes, which share their prefix) runs together per KV head: the
// slots any of them attends form one union list, walked in blocks whose K or V rows are read from
// memory and widened to fp32 once for all the rows; each row then computes over the union slots it
// attends exactly what it computes alone (a score does not depend on its place in a block of 16,
// and a row's V sum skips the slots it does not attend), so the block changes no bit.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,bmi2,popcnt")
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "avx512_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {


// s[0, n) <- exp(s - max s) in place; returns 1 / sum of those (0 when n == 0).
float softmax_in_place(float* s, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail16(n - j);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, s + j));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = tail16(n - j);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx)));
    _mm512_mask_storeu_ps(s + j, m, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  const float sum = _mm512_reduce_add_ps(vsum);
  return n > 0 ? 1.f / sum : 0.f;
}

// r[i] = the sum of the 16 lanes of v[i], for 16 vectors at once (a transposing add tree: 45
// shuffles and adds where 16 horizontal sums take ~130).  Every r[i] is summed in the same order,
// whatever i: ((e0 + e2) + (e1 + e3)) within each 128-bit lane, then (L0 + L1) + (L2 + L3) over
// the lanes; lanes of v past the caller's count only reach lanes of r it does not store.
inline __m512 sum16(const float (&v)[16][16]) {
  __m512 u[8], w[4];
  for (int i = 0; i < 8; ++i) {
    const __m512 x = _mm512_load_ps(v[2 * i]), y = _mm512_load_ps(v[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(u[2 * i]), y = _mm512_castps_pd(u[2 * i + 1]);
    w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 y0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 y1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y0, y1, 0x88), _mm512_shuffle_f32x4(y0, y1, 0xDD));
}

// sc.kv [jn][D] <- the K or V rows (base) of union slots [j0, j0 + jn) of KV head g, widened to
// fp32; prefetches the rows kKvPrefetchSlots further on.
template <int CH, bool BF16>
void widen_rows(const AttnArgs& a, const void* base, int64_t g, const int32_t* u, int64_t nu, int64_t j0,
                int64_t jn, float* kv) {
  for (int64_t jj = 0; jj < jn; ++jj) {
    const int64_t off = slot_offset(a, u, j0 + jj, g);
    prefetch_slot_ahead(base, a, u, nu, j0 + jj, g, 0, a.D);
#pragma GCC unroll 16
    for (int c = 0; c < CH; ++c) _mm512_store_ps(kv + jj * CH * 16 + c * 16, load16(base, BF16, off + c * 16));
  }
}

// Heads interleaved per K row in the score loop: HB independent FMA chains in flight, where one
// head at a time left each chain waiting on the previous FMA's latency.
constexpr int64_t kDotHeads = 4;

// part[h][jj] <- the lane-wise products of query heads [0, HB) (q, rows of CH chunks) with K row
// jj (kv): each head is the same FMA chain over the chunks, in order, whichever heads run beside it.
template <int CH, int HB>
inline void head_dots(const float* q, const __m512 (&kv)[CH], float (*part)[16][16], int64_t jj) {
  __m512 acc[HB];
#pragma GCC unroll 16
  for (int h = 0; h < HB; ++h) acc[h] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int c = 0; c < CH; ++c)
#pragma GCC unroll 16
    for (int h = 0; h < HB; ++h) acc[h] = _mm512_fmadd_ps(_mm512_load_ps(q + h * CH * 16 + c * 16), kv[c], acc[h]);
#pragma GCC unroll 16
  for (int h = 0; h < HB; ++h) _mm512_store_ps(part[h][jj], acc[h]);
}

// Per row r of the block and head h: its scores, scale * (query . K row), over the union slots it
// attends, in order, at sc.scores [r][h][0, n[r]).  A score is one FMA chain over the CH chunks
// and a horizontal sum (sum16, over a block of 16 union slots), so it does not depend on the block.
// ONE (a block of one row): the K rows are read from the cache directly, not widened first.
template <int CH, bool BF16, bool ONE>
void key_scores(const AttnArgs& a, int64_t rows, int64_t heads, int64_t g, int64_t nu, const int64_t* n,
                const AttnScratch& sc) {
  alignas(64) float part[kAttnHeads][16][16];  // per head, 16 slots' lane-wise partial scores
  const __m512 scale = _mm512_set1_ps(a.scale);
  const int64_t words = attn_bit_words(a.S), sstride = heads * a.S;
  int64_t pos[kAttnRowBlock] = {};
  for (int64_t j0 = 0; j0 < nu; j0 += 16) {
    const int64_t jn = nu - j0 < 16 ? nu - j0 : 16;
    if (!ONE) widen_rows<CH, BF16>(a, a.k, g, sc.slots, nu, j0, jn, sc.kv);
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t att = static_cast<uint16_t>(sc.bits[r * words + j0 / 64] >> (j0 % 64));
      if (att == 0) continue;
      const float* qr = sc.q + r * heads * CH * 16;
      for (int64_t jj = 0; jj < jn; ++jj) {
        if (!(att >> jj & 1)) continue;
        __m512 kv[CH];
        const int64_t off = slot_offset(a, sc.slots, j0 + jj, g);
        if (ONE) prefetch_slot_ahead(a.k, a, sc.slots, nu, j0 + jj, g, 0, a.D);
#pragma GCC unroll 16
        for (int c = 0; c < CH; ++c) kv[c] = ONE ? load16(a.k, BF16, off + c * 16) : _mm512_load_ps(sc.kv + jj * CH * 16 + c * 16);
        for (int64_t h = 0; h < heads; h += kDotHeads) {
          switch (heads - h < kDotHeads ? heads - h : kDotHeads) {
            case 1: head_dots<CH, 1>(qr + h * CH * 16, kv, part + h, jj); break;
            case 2: head_dots<CH, 2>(qr + h * CH * 16, kv, part + h, jj); break;
            case 3: head_dots<CH, 3>(qr + h * CH * 16, kv, part + h, jj); break;
            default: head_dots<CH, kDotHeads>(qr + h * CH * 16, kv, part + h, jj);
          }
        }
      }
      float* sr = sc.scores + r * sstride;
      const __mmask16 kept = tail16(__builtin_popcount(att));  // compressed in a register: a compressing store is slow on Zen 4
      for (int64_t h = 0; h < heads; ++h) {
        _mm512_mask_storeu_ps(sr + h * n[r] + pos[r], kept,
                              _mm512_maskz_compress_ps(static_cast<__mmask16>(att), _mm512_mul_ps(sum16(part[h]), scale)));
      }
      pos[r] += __builtin_popcount(att);
    }
  }
}

// sc.acc [r][h] = the sum over the union slots row r attends, in order, of its weight (sc.scores
// [r][h][j]) times the V row.  Passes of HB heads x CB chunks keep their accumulators in registers
// over a block of widened V rows, the row's weights of the block laid out by slot (w); each
// accumulator is the same FMA chain over the row's slots in list order whatever the blocks.
// Lanes of heads past `heads` accumulate zeros, never stored.
// ONE: the V rows are read from the cache directly.
template <int CH, bool BF16, bool ONE>
void weighted_v(const AttnArgs& a, int64_t rows, int64_t heads, int64_t g, int64_t nu, const int64_t* n,
                const AttnScratch& sc) {
  constexpr int CB = CH % 2 == 0 ? 2 : 1;  // chunks per pass
  constexpr int HB = 6;                    // heads per pass: HB x (CB + 1) vector registers
  const int64_t words = attn_bit_words(a.S), sstride = heads * a.S, astride = heads * CH * 16;
  std::fill(sc.acc, sc.acc + rows * astride, 0.f);
  alignas(64) float w[kAttnSlotBlock][kAttnHeads + HB] = {};  // [slot][head] weights; 0 past `heads`
  int64_t pos[kAttnRowBlock] = {};
  for (int64_t j0 = 0; j0 < nu; j0 += kAttnSlotBlock) {
    const int64_t jn = nu - j0 < kAttnSlotBlock ? nu - j0 : kAttnSlotBlock;
    if (!ONE) widen_rows<CH, BF16>(a, a.v, g, sc.slots, nu, j0, jn, sc.kv);
    static_assert(kAttnSlotBlock == 32, "a block's bits: 32 of one word");
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t att = static_cast<uint32_t>(sc.bits[r * words + j0 / 64] >> (j0 % 64));
      if (att == 0) continue;
      const float* pr = sc.scores + r * sstride;
      for (int64_t jj = 0, j = pos[r]; jj < jn; ++jj) {  // the row's weights of the slots it attends, by slot
        if (att >> jj & 1) {
          for (int64_t h = 0; h < heads; ++h) w[jj][h] = pr[h * n[r] + j];
          ++j;
        }
      }
      for (int64_t h0 = 0; h0 < heads; h0 += HB) {
        const int hb = static_cast<int>(heads - h0 < HB ? heads - h0 : HB);
        for (int c0 = 0; c0 < CH; c0 += CB) {
          float* ar = sc.acc + r * astride + h0 * CH * 16 + c0 * 16;
          __m512 acc[HB][CB];
#pragma GCC unroll 16
          for (int h = 0; h < HB; ++h)
#pragma GCC unroll 16
            for (int c = 0; c < CB; ++c) acc[h][c] = h < hb ? _mm512_load_ps(ar + h * CH * 16 + c * 16) : _mm512_setzero_ps();
          for (int64_t jj = 0; jj < jn; ++jj) {
            if (!(att >> jj & 1)) continue;
            const int64_t off = slot_offset(a, sc.slots, j0 + jj, g) + c0 * 16;
            if (ONE && c0 == 0) prefetch_slot_ahead(a.v, a, sc.slots, nu, j0 + jj, g, 0, a.D);
            __m512 pj[HB];
#pragma GCC unroll 16
            for (int h = 0; h < HB; ++h) pj[h] = _mm512_set1_ps(w[jj][h0 + h]);
#pragma GCC unroll 16
            for (int c = 0; c < CB; ++c) {
              const __m512 vv = ONE ? load16(a.v, BF16, off + c * 16) : _mm512_load_ps(sc.kv + jj * CH * 16 + (c0 + c) * 16);
#pragma GCC unroll 16
              for (int h = 0; h < HB; ++h) acc[h][c] = _mm512_fmadd_ps(pj[h], vv, acc[h][c]);
            }
          }
#pragma GCC unroll 16
          for (int h = 0; h < HB; ++h)  // unrolled with the guard inside: acc stays in registers
#pragma GCC unroll 16
            for (int c = 0; c < CB; ++c)
              if (h < hb) _mm512_store_ps(ar + h * CH * 16 + c * 16, acc[h][c]);
        }
      }
      pos[r] += __builtin_popcount(att);
    }
  }
}

// Heads [h0, h0 + heads) of KV head g for the block's rows [t0, t0 + rows) over the union list
// (nu slots, n[r] of them attended by row r): the scores, each row's softmax, the V sums, out.
template <int CH, bool BF16, bool ONE>
void attend_heads(const AttnArgs& a, int64_t t0, int64_t rows, int64_t h0, int64_t heads, int64_t g, int64_t nu,
                  const int64_t* n, const AttnScratch& sc) {
  constexpr int64_t esz = BF16 ? 2 : 4, D = CH * 16;
  for (int64_t r = 0; r < rows; ++r) {
    const char* qs = static_cast<const char*>(a.q) + ((t0 + r) * a.q_ld_t + h0 * a.q_ld_h) * esz;
    for (int64_t h = 0; h < heads; ++h)
      for (int c = 0; c < CH; ++c)
        _mm512_store_ps(sc.q + (r * heads + h) * D + c * 16, load16(qs + h * a.q_ld_h * esz, BF16, c * 16));
  }
  key_scores<CH, BF16, ONE>(a, rows, heads, g, nu, n, sc);
  float inv[kAttnRowBlock][kAttnHeads];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) inv[r][h] = softmax_in_place(sc.scores + r * heads * a.S + h * n[r], n[r]);
  weighted_v<CH, BF16, ONE>(a, rows, heads, g, nu, n, sc);
  for (int64_t r = 0; r < rows; ++r) {
    char* out = static_cast<char*>(a.out) + ((t0 + r) * a.H + h0) * D * esz;
    for (int64_t h = 0; h < heads; ++h) {
      const __m512 vinv = _mm512_set1_ps(inv[r][h]);
      for (int c = 0; c < CH; ++c)
        store16(out + h * D * esz, BF16, c * 16, _mm512_mul_ps(_mm512_load_ps(sc.acc + (r * heads + h) * D + c * 16), vinv));
    }
  }
}

using HeadsFn = void (*)(const AttnArgs&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                         const AttnScratch&);
static_assert(kMaxHeadDim == 256, "one attend_heads per head dim 16, 32, ..., 256 and dtype");
template <bool BF16, bool ONE, int... I>
constexpr std::array<HeadsFn, sizeof...(I)> by_chunks(std::integer_sequence<int, I...>) {
  return {attend_heads<I + 1, BF16, ONE>...};
}
constexpr auto kChunks = std::make_integer_sequence<int, 16>();
constexpr std::array<HeadsFn, 16> kByChunks[2][2] = {{by_chunks<false, false>(kChunks), by_chunks<false, true>(kChunks)},
                                                      {by_chunks<true, false>(kChunks), by_chunks<true, true>(kChunks)}};  // [bf16][one row]

}  // namespace

void attention_block_avx512(const AttnArgs& a, int64_t g, int64_t t0, int64_t t1, const AttnScratch& sc) {
  const int64_t rows = t1 - t0, group = a.H / a.Hkv, words = attn_bit_words(a.S);
  std::fill(sc.bits, sc.bits + rows * words, uint64_t{0});
  int64_t n[kAttnRowBlock] = {}, nu = 0;
  for (int64_t s0 = 0; s0 < a.S; s0 += 64) {  // the union list, and which of its slots each row attends
    const __mmask64 tail = a.S - s0 >= 64 ? ~__mmask64{0} : (__mmask64{1} << (a.S - s0)) - 1;
    uint64_t m[kAttnRowBlock], any = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const __m512i b = _mm512_maskz_loadu_epi8(tail, a.mask + (t0 + r) * a.mask_ld + s0);
      any |= m[r] = _mm512_test_epi8_mask(b, b);
    }
    if (any == 0) continue;
    const int64_t k = __builtin_popcountll(any), w = nu / 64, off = nu % 64;
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t x = _pext_u64(m[r], any);
      sc.bits[r * words + w] |= x << off;
      if (off != 0 && off + k > 64) sc.bits[r * words + w + 1] |= x >> (64 - off);
      n[r] += __builtin_popcountll(m[r]);
    }
    for (uint64_t left = any; left != 0; left &= left - 1) sc.slots[nu++] = static_cast<int32_t>(s0 + __builtin_ctzll(left));
  }
  const HeadsFn attend = kByChunks[a.bf16][rows == 1][a.D / 16 - 1];
  for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += kAttnHeads) {
    attend(a, t0, rows, h0, std::min(kAttnHeads, (g + 1) * group - h0), g, nu, n, sc);
  }
}

}  // namespace swiftspec
