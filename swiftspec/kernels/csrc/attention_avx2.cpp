// AVX2 masked attention for a few query rows: the twin of attention_avx512.cpp, same contract.
//
// Layout-invariant numerics, as on AVX-512: a query row first lists the slots its mask lets it
// read, in slot order, and every reduction (scores, max, sum of exp, weighted sum of V) then runs
// over that compact list in a fixed order, so the result depends only on the ordered set of
// attended keys.  The reduction trees differ from the AVX-512 ones (8 lanes, not 16), so the two
// levels give different bits; each level is layout-invariant on its own.
//
// With 16 vector registers, a K or V row of up to 256 values no longer fits in registers next to
// the accumulators, so the loops are turned around: a score block keeps one accumulator per head
// (up to 8) and walks the K row in chunks of 8, each chunk loaded and widened once for all heads;
// the V sum walks the head dim in tiles of 16 with two accumulators per head (up to 6 heads: 12
// FMA chains in flight hide the FMA latency).  No blocking changes any value's arithmetic: each
// score is one FMA chain over the chunks in order and one fixed reduction tree, each output lane
// one FMA chain over the slots in list order.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "avx2_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int64_t kMaxHeads = 16;  // query heads per attend call
constexpr int kScoreHeads = 8;     // heads per score block: 8 accumulators and the K chunk
constexpr int kSumHeads = 6;       // heads per V block: 6 x 2 accumulators, 2 V vectors, 1 probability

// The 8 lane sums of v[0, 8), lane h = ((v_h0 + v_h1) + (v_h2 + v_h3)) + ((v_h4 + v_h5) + (v_h6 + v_h7)):
// the same tree for every h, so a head's score does not depend on its place in the block.
inline __m256 hsum8x8(const __m256 (&v)[8]) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// s[0, n) <- exp(s - max s) in place; returns 1 / sum of those (0 when n == 0).  The max is exact
// in any order; the sum runs over 8-lane partial sums (the tail's missing lanes add 0), then hsum8.
float softmax_in_place(float* s, int64_t n) {
  if (n == 0) return 0.f;
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 vsum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (j < n) {
    const __m256i m = tail8(n - j);
    const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), vmx)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(s + j, m, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  return 1.f / hsum8(vsum);
}

// s[h * n + j] = scale * q_h . K[idx[j]] for the HB heads of qf (fp32 rows of D) over slots
// idx[0, n) of KV head g.
template <int HB>
void score_block(const AttnArgs& a, const float* qf, int64_t g, const int32_t* idx, int64_t n, float* s) {
  const int64_t D = a.D;
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t off = slot_offset(a, idx, j, g);
    prefetch_slot_ahead(a.k, a, idx, n, j, g, 0, D);
    __m256 acc[kScoreHeads];
#pragma GCC unroll 8
    for (int h = 0; h < kScoreHeads; ++h) acc[h] = _mm256_setzero_ps();  // heads past HB sum to 0, unused
    for (int64_t c = 0; c < D; c += 8) {
      const __m256 kv = load8(a.k, a.bf16, off + c);
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) acc[h] = _mm256_fmadd_ps(_mm256_load_ps(qf + h * D + c), kv, acc[h]);
    }
    alignas(32) float sc[kScoreHeads];
    _mm256_store_ps(sc, _mm256_mul_ps(hsum8x8(acc), scale));
    for (int h = 0; h < HB; ++h) s[h * n + j] = sc[h];
  }
}

// out row h (at out + h * D elements) = inv[h] * sum_j s[h * n + j] V[idx[j]] for HB heads, over
// the head dim in tiles of 16 values.
template <int HB>
void sum_block(const AttnArgs& a, const float* s, int64_t n, const float* inv, int64_t g, const int32_t* idx,
               char* out) {
  const int64_t esz = a.bf16 ? 2 : 4;
  for (int64_t d = 0; d < a.D; d += 16) {
    __m256 lo[HB], hi[HB];
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) lo[h] = hi[h] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = slot_offset(a, idx, j, g) + d;
      prefetch_slot_ahead(a.v, a, idx, n, j, g, d, 16);
      const __m256 v0 = load8(a.v, a.bf16, off), v1 = load8(a.v, a.bf16, off + 8);
#pragma GCC unroll 8
      for (int h = 0; h < HB; ++h) {
        const __m256 p = _mm256_broadcast_ss(s + h * n + j);
        lo[h] = _mm256_fmadd_ps(p, v0, lo[h]);
        hi[h] = _mm256_fmadd_ps(p, v1, hi[h]);
      }
    }
    // Through a buffer: with the bf16 rounding next to the loop, GCC keeps the 12 accumulators in
    // registers but also stores them on every iteration (a third slower).
    alignas(32) float res[HB][16];
#pragma GCC unroll 8
    for (int h = 0; h < HB; ++h) {
      const __m256 vinv = _mm256_set1_ps(inv[h]);
      _mm256_store_ps(res[h], _mm256_mul_ps(lo[h], vinv));
      _mm256_store_ps(res[h] + 8, _mm256_mul_ps(hi[h], vinv));
    }
    for (int h = 0; h < HB; ++h) {
      store8(out + h * a.D * esz, a.bf16, d, _mm256_load_ps(res[h]));
      store8(out + h * a.D * esz, a.bf16, d + 8, _mm256_load_ps(res[h] + 8));
    }
  }
}

using ScoreFn = void (*)(const AttnArgs&, const float*, int64_t, const int32_t*, int64_t, float*);
using SumFn = void (*)(const AttnArgs&, const float*, int64_t, const float*, int64_t, const int32_t*, char*);
constexpr ScoreFn kScore[kScoreHeads] = {score_block<1>, score_block<2>, score_block<3>, score_block<4>,
                                         score_block<5>, score_block<6>, score_block<7>, score_block<8>};
constexpr SumFn kSum[kSumHeads] = {sum_block<1>, sum_block<2>, sum_block<3>,
                                   sum_block<4>, sum_block<5>, sum_block<6>};

// The size of the first blocks when `group` heads go in blocks of at most `most`, as even as
// possible (7 heads in blocks of 6: 4 + 3, so every V load feeds 3 or 4 heads, not 6 and then 1).
inline int64_t block_heads(int64_t group, int64_t most) {
  const int64_t blocks = (group + most - 1) / most;
  return (group + blocks - 1) / blocks;
}

// Query heads of KV head g (qs: `group` <= kMaxHeads rows of q, row stride q_ld_h elements) over
// the compact slots idx[0, n).  s: group * n floats of scratch.
void attend(const AttnArgs& a, const char* qs, int64_t group, int64_t g, const int32_t* idx, int64_t n, float* s,
            char* out) {
  const int64_t D = a.D, esz = a.bf16 ? 2 : 4;
  alignas(32) float qf[kMaxHeads * kMaxHeadDim];  // these heads' queries in fp32, rows of D
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t c = 0; c < D; c += 8) _mm256_store_ps(qf + h * D + c, load8(qs + h * a.q_ld_h * esz, a.bf16, c));
  }
  const int64_t hs = block_heads(group, kScoreHeads);
  for (int64_t h0 = 0; h0 < group; h0 += hs) {
    kScore[std::min(hs, group - h0) - 1](a, qf + h0 * D, g, idx, n, s + h0 * n);
  }
  float inv[kMaxHeads];
  for (int64_t h = 0; h < group; ++h) inv[h] = softmax_in_place(s + h * n, n);
  const int64_t hv = block_heads(group, kSumHeads);
  for (int64_t h0 = 0; h0 < group; h0 += hv) {
    kSum[std::min(hv, group - h0) - 1](a, s + h0 * n, n, inv + h0, g, idx, out + h0 * D * esz);
  }
}

}  // namespace

void attention_items_avx2(const AttnArgs& a, int64_t w0, int64_t w1, int32_t* idx, float* scores) {
  const int64_t group = a.H / a.Hkv, esz = a.bf16 ? 2 : 4;
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
