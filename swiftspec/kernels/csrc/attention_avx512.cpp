// AVX-512 masked attention for a few query rows (decode, tree verification, draft expansion).
//
// Layout-invariant numerics: a query row first lists the slots its mask lets it read, in slot
// order, and then runs every reduction over that compact list (scores, max, sum of exp, weighted
// sum of V) in a fixed order.  The result therefore depends only on the ordered set of attended
// keys, not on where they sit in the cache nor on masked slots between them: a tree node whose
// siblings are interleaved with its ancestors gets the same bits as the same token decoded alone
// after a contiguous prefix.  With the batch-invariant linears this makes greedy tree
// verification pick exactly the tokens autoregressive decoding picks.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "avx512_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int64_t kMaxHeads = 16;  // query heads per attend_group call

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

// s[h * n + j] = scale * (query h . K row of listed slot j) for the heads of KV head g: each K
// row is loaded and widened once for all of them; a score is one FMA chain over the CH chunks and
// a horizontal sum (sum16, over blocks of 16 listed slots).
template <int CH>
void key_scores(const AttnArgs& a, const float (*qf)[CH * 16], int64_t group, int64_t g, const int32_t* idx,
                int64_t n, float* s) {
  alignas(64) float part[kMaxHeads][16][16];  // per head, 16 slots' lane-wise partial scores
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t jn = n - j0 < 16 ? n - j0 : 16;
    for (int64_t jj = 0; jj < jn; ++jj) {
      const int64_t j = j0 + jj, off = slot_offset(a, idx, j, g);
      prefetch_slot_ahead(a.k, a, idx, n, j, g, 0, a.D);
      __m512 kv[CH];
#pragma GCC unroll 16
      for (int c = 0; c < CH; ++c) kv[c] = load16(a.k, a.bf16, off + c * 16);
      for (int64_t h = 0; h < group; ++h) {
        __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
        for (int c = 0; c < CH; ++c) acc = _mm512_fmadd_ps(_mm512_load_ps(qf[h] + c * 16), kv[c], acc);
        _mm512_store_ps(part[h][jj], acc);
      }
    }
    const __mmask16 m = tail16(jn);
    for (int64_t h = 0; h < group; ++h) _mm512_mask_storeu_ps(s + h * n + j0, m, _mm512_mul_ps(sum16(part[h]), scale));
  }
}

// out row h = inv[h] * sum over listed slots j, in list order, of p[h * n + j] * V row j.  Blocks of
// HB heads x CB chunks keep the HB x CB accumulators, HB probabilities and one V vector in the 32
// vector registers; a 6-head group at D 128 reads V once (two passes over half of each row).
// Lanes of heads past the group's end accumulate zeros and are never stored.  Each output element
// is the same FMA chain over the slots whatever the blocks.
template <int CH>
void weighted_v(const AttnArgs& a, int64_t group, int64_t g, const int32_t* idx, int64_t n, const float* p,
                const float* inv, char* out) {
  constexpr int CB = CH % 4 == 0 ? 4 : CH % 3 == 0 ? 3 : CH % 2 == 0 ? 2 : 1;  // chunks per pass
  constexpr int HB = 31 / (CB + 1) < kMaxHeads ? 31 / (CB + 1) : kMaxHeads;  // HB x (CB + 1) + 1 <= 32
  const int64_t esz = a.bf16 ? 2 : 4;
  for (int64_t h0 = 0; h0 < group; h0 += HB) {
    const int hb = static_cast<int>(group - h0 < HB ? group - h0 : HB);
    for (int c0 = 0; c0 < CH; c0 += CB) {
      __m512 acc[HB][CB];
#pragma GCC unroll 16
      for (int h = 0; h < HB; ++h)
#pragma GCC unroll 16
        for (int c = 0; c < CB; ++c) acc[h][c] = _mm512_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const int64_t off = slot_offset(a, idx, j, g) + c0 * 16;
        prefetch_slot_ahead(a.v, a, idx, n, j, g, c0 * 16, CB * 16);
        __m512 pj[HB];
#pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) pj[h] = _mm512_set1_ps(h < hb ? p[(h0 + h) * n + j] : 0.f);
#pragma GCC unroll 16
        for (int c = 0; c < CB; ++c) {
          const __m512 vv = load16(a.v, a.bf16, off + c * 16);
#pragma GCC unroll 16
          for (int h = 0; h < HB; ++h) acc[h][c] = _mm512_fmadd_ps(pj[h], vv, acc[h][c]);
        }
      }
      for (int h = 0; h < hb; ++h) {
        const __m512 vinv = _mm512_set1_ps(inv[h0 + h]);
        for (int c = 0; c < CB; ++c) {
          store16(out + (h0 + h) * a.D * esz, a.bf16, (c0 + c) * 16, _mm512_mul_ps(acc[h][c], vinv));
        }
      }
    }
  }
}

// Query heads of KV head g (qs: `group` <= kMaxHeads rows of q, row stride q_ld_h elements) over
// the compact slots idx[0, n), for a head dim of CH x 16.  Per head the order is fixed: the scores,
// then the softmax, then the V sum over slots in list order.  s: group * n floats of scratch.
template <int CH>
void attend_group(const AttnArgs& a, const char* qs, int64_t group, int64_t g, const int32_t* idx, int64_t n,
                  float* s, char* out) {
  const int64_t esz = a.bf16 ? 2 : 4;
  alignas(64) float qf[kMaxHeads][CH * 16];  // these heads' queries in fp32
  for (int64_t h = 0; h < group; ++h) {
    for (int c = 0; c < CH; ++c) _mm512_store_ps(qf[h] + c * 16, load16(qs + h * a.q_ld_h * esz, a.bf16, c * 16));
  }
  key_scores<CH>(a, qf, group, g, idx, n, s);
  float inv[kMaxHeads];
  for (int64_t h = 0; h < group; ++h) inv[h] = softmax_in_place(s + h * n, n);
  weighted_v<CH>(a, group, g, idx, n, s, inv, out);
}

using GroupFn = void (*)(const AttnArgs&, const char*, int64_t, int64_t, const int32_t*, int64_t, float*, char*);
static_assert(kMaxHeadDim == 256, "one attend_group per head dim 16, 32, ..., 256");
constexpr GroupFn kByChunks[] = {attend_group<1>,  attend_group<2>,  attend_group<3>,  attend_group<4>,
                                 attend_group<5>,  attend_group<6>,  attend_group<7>,  attend_group<8>,
                                 attend_group<9>,  attend_group<10>, attend_group<11>, attend_group<12>,
                                 attend_group<13>, attend_group<14>, attend_group<15>, attend_group<16>};

}  // namespace

void attention_items_avx512(const AttnArgs& a, int64_t w0, int64_t w1, int32_t* idx, float* scores) {
  const int64_t group = a.H / a.Hkv, esz = a.bf16 ? 2 : 4;
  const GroupFn attend = kByChunks[a.D / 16 - 1];
  for (int64_t w = w0; w < w1; ++w) {  // work item w = (row t, KV head g)
    const int64_t t = w / a.Hkv, g = w % a.Hkv;
    const bool* mrow = a.mask + t * a.mask_ld;
    int64_t n = 0;
    for (int64_t s = 0; s < a.S; ++s) {
      if (mrow[s]) idx[n++] = static_cast<int32_t>(s);
    }
    for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += kMaxHeads) {
      const int64_t heads = std::min(kMaxHeads, (g + 1) * group - h0);
      const char* qs = static_cast<const char*>(a.q) + (t * a.q_ld_t + h0 * a.q_ld_h) * esz;
      attend(a, qs, heads, g, idx, n, scores, static_cast<char*>(a.out) + (t * a.H + h0) * a.D * esz);
    }
  }
}

}  // namespace swiftspec
