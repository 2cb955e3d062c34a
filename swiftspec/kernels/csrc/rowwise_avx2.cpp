// AVX2 row-wise kernels of the decoder: the twins of rowwise_avx512.cpp (RMSNorm alone and after
// the residual add, the SwiGLU activation, RoPE with the KV-cache store), same contracts.
//
// Rounding follows the model's torch code step by step, as on AVX-512: RMSNorm normalizes in
// fp32, rounds to the model dtype, then multiplies by the weight and rounds; the activation
// rounds silu(gate), then the product; RoPE rounds each product and the sum.  Only the sum of
// squares of RMSNorm is a reduction, here over 8 lanes (AVX-512: 16), so the two levels may differ
// in its last bits; every row is still computed on its own in a fixed order, so a row's bits
// never depend on the other rows of the call.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "avx2_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

// The storage dtype's value of y: rounded to bf16 (and back), or y itself for fp32.  The empty asm
// makes y a finished value, so the compiler never fuses the product that made it into an FMA
// with a later add: torch rounds every op, fp32 included.
inline __m256 round_to(__m256 y, bool bf16) {
  if (bf16) return round_bf16(y);
  __asm__("" : "+x"(y));
  return y;
}

// fn(i, m) over [0, n) in chunks of m = 8 values, then one last partial chunk: inlined, the full
// chunks see the constant m = 8 and run without the tail's branches.
template <typename Fn>
inline void by8(int64_t n, const Fn& fn) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) fn(i, int64_t{8});
  if (i < n) fn(i, n - i);
}

// One row's second RMSNorm pass: out = round(round(x * inv) * weight), x already in the dtype.
void scale_row(const void* x, void* out, const void* weight, int64_t n, float inv, bool bf16) {
  const __m256 vinv = _mm256_set1_ps(inv);
  by8(n, [&](int64_t i, int64_t m) {
    const __m256 y = round_to(_mm256_mul_ps(load8(x, bf16, i, m), vinv), bf16);
    store8(out, bf16, i, round_to(_mm256_mul_ps(y, load8(weight, bf16, i, m)), bf16), m);
  });
}

inline float inv_rms(__m256 sum_sq, int64_t n, float eps) {
  return 1.f / std::sqrt(hsum8(sum_sq) / static_cast<float>(n) + eps);
}

// dst[0, D) = src * cos + rotate_half(src) * sin for one head (D % 16 == 0).
void rotate_head(const void* src, const void* cos, const void* sin, void* dst, int64_t D, bool bf16) {
  alignas(32) float x2[2 * kMaxHeadDim];  // the head twice: rotate_half reads x2[i + D / 2]
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 v = load8(src, bf16, i);
    _mm256_store_ps(x2 + i, v);
    _mm256_store_ps(x2 + D + i, v);
  }
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 a = round_to(_mm256_mul_ps(_mm256_load_ps(x2 + i), load8(cos, bf16, i)), bf16);
    const __m256 b = round_to(_mm256_mul_ps(_mm256_loadu_ps(x2 + i + D / 2), load8(sin, bf16, i)), bf16);
    store8(dst, bf16, i, _mm256_add_ps(a, b));
  }
}

}  // namespace

void rms_norm_rows_avx2(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  const bool bf16 = a.bf16;
  for (int64_t r = r0; r < r1; ++r) {
    const void* x = static_cast<const char*>(a.x) + r * a.ldx * a.esz;
    __m256 ss = _mm256_setzero_ps();
    by8(n, [&](int64_t i, int64_t m) {
      const __m256 v = load8(x, bf16, i, m);
      ss = _mm256_fmadd_ps(v, v, ss);
    });
    scale_row(x, static_cast<char*>(a.out) + r * a.ldo * a.esz, weight, n, inv_rms(ss, n, eps), bf16);
  }
}

void add_rms_norm_rows_avx2(const AddNormArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  const bool bf16 = a.bf16;
  for (int64_t r = r0; r < r1; ++r) {
    void* x = static_cast<char*>(a.x) + r * a.ldx * a.esz;
    const void* d = static_cast<const char*>(a.d) + r * a.ldd * a.esz;
    __m256 ss = _mm256_setzero_ps();
    by8(n, [&](int64_t i, int64_t m) {
      const __m256 v = round_to(_mm256_add_ps(load8(x, bf16, i, m), load8(d, bf16, i, m)), bf16);
      store8(x, bf16, i, v, m);
      ss = _mm256_fmadd_ps(v, v, ss);
    });
    scale_row(x, static_cast<char*>(a.out) + r * a.ldo * a.esz, a.weight, n, inv_rms(ss, n, a.eps), bf16);
  }
}

void rope_store_rows_avx2(const RopeArgs& a, int64_t t0, int64_t t1) {
  const int64_t D = a.D, row = a.Hkv * D * a.esz;
  for (int64_t t = t0; t < t1; ++t) {
    const char* src = static_cast<const char*>(a.qkv) + t * a.ld_qkv * a.esz;
    const void* cos = static_cast<const char*>(a.cos) + t * a.ld_cs * a.esz;
    const void* sin = static_cast<const char*>(a.sin) + t * a.ld_cs * a.esz;
    char* q = static_cast<char*>(a.q) + t * a.H * D * a.esz;
    char* k = static_cast<char*>(a.k_cache) + a.slots[t] * a.kv_ld_s * a.esz;
    for (int64_t h = 0; h < a.H; ++h) rotate_head(src + h * D * a.esz, cos, sin, q + h * D * a.esz, D, a.bf16);
    for (int64_t h = 0; h < a.Hkv; ++h) {
      rotate_head(src + (a.H + h) * D * a.esz, cos, sin, k + h * D * a.esz, D, a.bf16);
    }
    std::memcpy(static_cast<char*>(a.v_cache) + a.slots[t] * a.kv_ld_s * a.esz, src + (a.H + a.Hkv) * D * a.esz, row);
  }
}

void silu_mul_rows_avx2(const RowArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  const bool bf16 = a.bf16;
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t r = r0; r < r1; ++r) {
    const void* gate = static_cast<const char*>(a.x) + r * a.ldx * a.esz;
    const void* up = static_cast<const char*>(gate) + n * a.esz;
    void* out = static_cast<char*>(a.out) + r * a.ldo * a.esz;
    by8(n, [&](int64_t i, int64_t m) {
      const __m256 g = load8(gate, bf16, i, m);
      const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
      const __m256 s = round_to(_mm256_div_ps(g, _mm256_add_ps(one, e)), bf16);
      store8(out, bf16, i, round_to(_mm256_mul_ps(s, load8(up, bf16, i, m)), bf16), m);
    });
  }
}

}  // namespace swiftspec
