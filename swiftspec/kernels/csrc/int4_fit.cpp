// The int4 weight quantizer's search for each group's scale and offset (quant.py quantize_int4;
// its torch twin is quant.int4_fit_ref).  Built for plain x86-64 (no target pragma: no FMA), with
// every sum in a fixed order, so the same weight gets the same (d, mn) on every CPU.
//
// Rule (llama.cpp's make_qkx2_quants for Q4_K, with a free offset): for 21 candidate grids
// q = clamp(round((x - lo) * (15 + c) / (hi - lo)), 0, 15), c = -1.0, -0.9, ..., 1.0, fit d and mn
// by weighted least squares (weights av + |x|, av = rms of the group, which favours the large
// weights) and keep the fit with the least weighted squared error; min-max rounding (c = 0, d =
// (hi - lo) / 15, mn = lo) is the starting point.  Perplexity against min-max rounding:
// docs/bench/perplexity/results.md.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kGrids = 21;  // candidate grids: 15 + c steps over the range, c = -1.0 .. 1.0

struct Sums {
  double w, wl, wll, wlx;
};

// Weighted sums of one candidate grid q = clamp(round((x - lo) * inv), 0, 15) over the group,
// in 8 lanes (lane j takes x[i + j]), added up in lane order at the end.  Two versions with the
// same operations per lane and so the same bits: two SSE2 vectors (the x86-64 baseline), or one
// AVX vector where the CPU has AVX2 (no FMA either way: a fused multiply-add would round once).
struct Lanes {
  alignas(32) float wl[8], wll[8], wlx[8];
  Sums sums() const {
    Sums s{0, 0, 0, 0};
    for (int j = 0; j < 8; ++j) {
      s.wl += wl[j];
      s.wll += wll[j];
      s.wlx += wlx[j];
    }
    return s;
  }
};

Sums grid_sums_sse2(const float* x, const float* w, int n, float lo, float inv) {
  const __m128 vlo = _mm_set1_ps(lo), vinv = _mm_set1_ps(inv), zero = _mm_setzero_ps();
  const __m128 top = _mm_set1_ps(15.f), magic = _mm_set1_ps(12582912.f);  // + 1.5 * 2^23: round half to even
  __m128 wl[2] = {zero, zero}, wll[2] = {zero, zero}, wlx[2] = {zero, zero};
  for (int i = 0; i < n; i += 8) {
    for (int h = 0; h < 2; ++h) {
      const __m128 xv = _mm_loadu_ps(x + i + 4 * h);
      const __m128 v = _mm_min_ps(_mm_max_ps(_mm_mul_ps(_mm_sub_ps(xv, vlo), vinv), zero), top);
      const __m128 l = _mm_sub_ps(_mm_add_ps(v, magic), magic);
      const __m128 a = _mm_mul_ps(_mm_loadu_ps(w + i + 4 * h), l);
      wl[h] = _mm_add_ps(wl[h], a);
      wll[h] = _mm_add_ps(wll[h], _mm_mul_ps(a, l));
      wlx[h] = _mm_add_ps(wlx[h], _mm_mul_ps(a, xv));
    }
  }
  Lanes out;
  for (int h = 0; h < 2; ++h) {
    _mm_store_ps(out.wl + 4 * h, wl[h]);
    _mm_store_ps(out.wll + 4 * h, wll[h]);
    _mm_store_ps(out.wlx + 4 * h, wlx[h]);
  }
  return out.sums();
}

__attribute__((target("avx2"))) Sums grid_sums_avx2(const float* x, const float* w, int n, float lo, float inv) {
  const __m256 vlo = _mm256_set1_ps(lo), vinv = _mm256_set1_ps(inv), zero = _mm256_setzero_ps();
  const __m256 top = _mm256_set1_ps(15.f), magic = _mm256_set1_ps(12582912.f);
  __m256 wl = zero, wll = zero, wlx = zero;
  for (int i = 0; i < n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(xv, vlo), vinv), zero), top);
    const __m256 l = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(w + i), l);
    wl = _mm256_add_ps(wl, a);
    wll = _mm256_add_ps(wll, _mm256_mul_ps(a, l));
    wlx = _mm256_add_ps(wlx, _mm256_mul_ps(a, xv));
  }
  Lanes out;
  _mm256_store_ps(out.wl, wl);
  _mm256_store_ps(out.wll, wll);
  _mm256_store_ps(out.wlx, wlx);
  return out.sums();
}

}  // namespace

void int4_fit_groups(const float* x, int64_t g0, int64_t g1, int n, float* dm) {
  const auto grid_sums = __builtin_cpu_supports("avx2") ? grid_sums_avx2 : grid_sums_sse2;
  float w[128];
  for (int64_t g = g0; g < g1; ++g) {
    const float* xg = x + g * n;
    float lo = xg[0], hi = xg[0];
    double sxx = 0;
    for (int i = 0; i < n; ++i) {
      lo = std::min(lo, xg[i]);
      hi = std::max(hi, xg[i]);
      sxx += (double)xg[i] * xg[i];
    }
    float best_d = (hi - lo) / 15.f, best_m = lo;
    if (!(hi > lo)) {
      dm[2 * g] = 0.f;
      dm[2 * g + 1] = lo;
      continue;
    }
    const float av = (float)std::sqrt(sxx / n);
    double sw = 0, swx = 0, swxx = 0;
    for (int i = 0; i < n; ++i) {
      w[i] = av + std::fabs(xg[i]);
      sw += w[i];
      swx += (double)w[i] * xg[i];
      swxx += (double)w[i] * xg[i] * xg[i];
    }
    // The weighted squared error of d * q + m against x, from the sums.
    auto error = [&](const Sums& s, double d, double m) {
      return swxx - 2 * d * s.wlx - 2 * m * swx + d * d * s.wll + 2 * d * m * s.wl + m * m * sw;
    };
    double best_e = error(grid_sums(xg, w, n, lo, 15.f / (hi - lo)), best_d, best_m);
    for (int c = 0; c < kGrids; ++c) {
      const float inv = (14.f + c / 10.f) / (hi - lo);
      const Sums s = grid_sums(xg, w, n, lo, inv);
      const double det = sw * s.wll - s.wl * s.wl;
      if (!(det > 0)) continue;
      const double d = (sw * s.wlx - s.wl * swx) / det, m = (s.wll * swx - s.wl * s.wlx) / det;
      const double e = error(s, d, m);
      if (d > 0 && e < best_e) {
        best_e = e;
        best_d = (float)d;
        best_m = (float)m;
      }
    }
    dm[2 * g] = best_d;
    dm[2 * g + 1] = best_m;
  }
}

}  // namespace swiftspec
