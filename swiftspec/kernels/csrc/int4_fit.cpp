// The int4 weight quantizer's search for each group's scale and offset (quant.py quantize_int4;
// its torch twin is quant.int4_fit_ref).  Plain x86-64 code, or AVX2 where the CPU has it, with
// the same operations per lane, no FMA (it would round once where the other rounds twice) and
// every sum in a fixed order: the same weight gets the same (d, mn) on every CPU.
//
// Rule (llama.cpp's make_qkx2_quants for Q4_K, with a free offset): for 21 candidate grids
// q = clamp(round((x - lo) * (15 + c) / (hi - lo)), 0, 15), c = -1.0, -0.9, ..., 1.0, fit d and mn
// by weighted least squares (weights av + |x|, av = rms of the group, which favours the large
// weights) and keep the fit with the least weighted squared error; min-max rounding (c = 0, d =
// (hi - lo) / 15, mn = lo) is the starting point.  Perplexity against min-max rounding:
// docs/bench/perplexity.md.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace swiftspec {
namespace {

// The grids: 15 + c steps over the range, c = -1.0 .. 1.0 (kernels.h kInt4FitGrids).
constexpr int kMinMax = 10;  // c = 0: the grid of min-max rounding, where the search starts
constexpr int kPair = 3;     // grids summed in one sweep of the group (independent chains)
static_assert(kInt4FitGrids % kPair == 0, "the sweeps take the grids kPair at a time");

// Weighted sums of a grid q over the group: w q, w q^2, w q x.
struct Sums {
  double wl, wll, wlx;
};

// Sums of 8 lanes (lane j takes x[i + j]) in lane order.
struct Lanes {
  alignas(32) float wl[8], wll[8], wlx[8];
  Sums sums() const {
    Sums s{0, 0, 0};
    for (int j = 0; j < 8; ++j) {
      s.wl += wl[j];
      s.wll += wll[j];
      s.wlx += wlx[j];
    }
    return s;
  }
};

// The sums of kPair grids q = clamp(round((x - lo) * inv[p]), 0, 15) in one sweep.  Two versions
// with the same operations per lane: two SSE2 vectors (the x86-64 baseline) or one AVX vector.
inline void grid_sums_sse2(const float* x, const float* w, int n, float lo, const float* inv, Sums* out) {
  const __m128 vlo = _mm_set1_ps(lo), zero = _mm_setzero_ps();
  const __m128 top = _mm_set1_ps(15.f), magic = _mm_set1_ps(12582912.f);  // + 1.5 * 2^23: round half to even
  __m128 wl[kPair][2], wll[kPair][2], wlx[kPair][2];
  for (int p = 0; p < kPair; ++p)
    for (int h = 0; h < 2; ++h) wl[p][h] = wll[p][h] = wlx[p][h] = zero;
  for (int i = 0; i < n; i += 8) {
    for (int h = 0; h < 2; ++h) {
      const __m128 xv = _mm_loadu_ps(x + i + 4 * h), wv = _mm_loadu_ps(w + i + 4 * h), dx = _mm_sub_ps(xv, vlo);
      for (int p = 0; p < kPair; ++p) {
        const __m128 v = _mm_min_ps(_mm_max_ps(_mm_mul_ps(dx, _mm_set1_ps(inv[p])), zero), top);
        const __m128 l = _mm_sub_ps(_mm_add_ps(v, magic), magic);
        const __m128 a = _mm_mul_ps(wv, l);
        wl[p][h] = _mm_add_ps(wl[p][h], a);
        wll[p][h] = _mm_add_ps(wll[p][h], _mm_mul_ps(a, l));
        wlx[p][h] = _mm_add_ps(wlx[p][h], _mm_mul_ps(a, xv));
      }
    }
  }
  for (int p = 0; p < kPair; ++p) {
    Lanes lanes;
    for (int h = 0; h < 2; ++h) {
      _mm_store_ps(lanes.wl + 4 * h, wl[p][h]);
      _mm_store_ps(lanes.wll + 4 * h, wll[p][h]);
      _mm_store_ps(lanes.wlx + 4 * h, wlx[p][h]);
    }
    out[p] = lanes.sums();
  }
}

__attribute__((target("avx2"))) inline void grid_sums_avx2(const float* x, const float* w, int n, float lo,
                                                           const float* inv, Sums* out) {
  const __m256 vlo = _mm256_set1_ps(lo), zero = _mm256_setzero_ps();
  const __m256 top = _mm256_set1_ps(15.f), magic = _mm256_set1_ps(12582912.f);
  __m256 wl[kPair], wll[kPair], wlx[kPair];
  for (int p = 0; p < kPair; ++p) wl[p] = wll[p] = wlx[p] = zero;
  for (int i = 0; i < n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i), wv = _mm256_loadu_ps(w + i), dx = _mm256_sub_ps(xv, vlo);
    for (int p = 0; p < kPair; ++p) {
      const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(dx, _mm256_set1_ps(inv[p])), zero), top);
      const __m256 l = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
      const __m256 a = _mm256_mul_ps(wv, l);
      wl[p] = _mm256_add_ps(wl[p], a);
      wll[p] = _mm256_add_ps(wll[p], _mm256_mul_ps(a, l));
      wlx[p] = _mm256_add_ps(wlx[p], _mm256_mul_ps(a, xv));
    }
  }
  for (int p = 0; p < kPair; ++p) {
    Lanes lanes;
    _mm256_store_ps(lanes.wl, wl[p]);
    _mm256_store_ps(lanes.wll, wll[p]);
    _mm256_store_ps(lanes.wlx, wlx[p]);
    out[p] = lanes.sums();
  }
}

// The fit of one group of n values (n <= 128, a multiple of 8) into dm[0] = d, dm[1] = mn.
template <void (*GridSums)(const float*, const float*, int, float, const float*, Sums*)>
inline void fit_group(const float* x, int n, float* dm) {
  float lo = x[0], hi = x[0];
  double sxx = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sxx += (double)x[i] * x[i];
  }
  if (!(hi > lo)) {
    dm[0] = 0.f;
    dm[1] = lo;
    return;
  }
  const float av = (float)std::sqrt(sxx / n);
  float w[128];
  double sw = 0, swx = 0, swxx = 0;
  for (int i = 0; i < n; ++i) {
    w[i] = av + std::fabs(x[i]);
    sw += w[i];
    swx += (double)w[i] * x[i];
    swxx += (double)w[i] * x[i] * x[i];
  }
  float inv[kInt4FitGrids];
  for (int c = 0; c < kInt4FitGrids; ++c) inv[c] = (14.f + c / 10.f) / (hi - lo);
  Sums s[kInt4FitGrids];
  for (int c = 0; c < kInt4FitGrids; c += kPair) GridSums(x, w, n, lo, inv + c, s + c);
  // The weighted squared error of d * q + m against x, from the sums.
  auto error = [&](const Sums& g, double d, double m) {
    return swxx - 2 * d * g.wlx - 2 * m * swx + d * d * g.wll + 2 * d * m * g.wl + m * m * sw;
  };
  float best_d = (hi - lo) / 15.f, best_m = lo;
  double best_e = error(s[kMinMax], best_d, best_m);
  for (int c = 0; c < kInt4FitGrids; ++c) {
    const double det = sw * s[c].wll - s[c].wl * s[c].wl;
    if (!(det > 0)) continue;
    const double d = (sw * s[c].wlx - s[c].wl * swx) / det, m = (s[c].wll * swx - s[c].wl * s[c].wlx) / det;
    const double e = error(s[c], d, m);
    if (d > 0 && e < best_e) {
      best_e = e;
      best_d = (float)d;
      best_m = (float)m;
    }
  }
  dm[0] = best_d;
  dm[1] = best_m;
}

void fit_groups_sse2(const float* x, int64_t g0, int64_t g1, int n, float* dm) {
  for (int64_t g = g0; g < g1; ++g) fit_group<grid_sums_sse2>(x + g * n, n, dm + 2 * g);
}

__attribute__((target("avx2"))) void fit_groups_avx2(const float* x, int64_t g0, int64_t g1, int n, float* dm) {
  for (int64_t g = g0; g < g1; ++g) fit_group<grid_sums_avx2>(x + g * n, n, dm + 2 * g);
}

}  // namespace

void int4_fit_groups(const float* x, int64_t g0, int64_t g1, int n, float* dm) {
  (__builtin_cpu_supports("avx2") ? fit_groups_avx2 : fit_groups_sse2)(x, g0, g1, n, dm);
}

}  // namespace swiftspec
