// AVX-512 row-wise kernels of the decoder: RMSNorm (alone and after the residual add), the SwiGLU
// activation (silu(gate) * up), and RoPE with the KV-cache store.
//
// At the few rows of decoding, verification and draft expansion, ATen runs these as 3-6 ops
// each (casts, pow, mean, rsqrt, silu, mul), a tenth of a forward (docs/bench/kernels.md, "Tuning
// notes").  Here each is one pass per row.  Rounding follows the model's torch code, step by
// step: RMSNorm normalizes in fp32, rounds to the model dtype, then multiplies by the weight and
// rounds; the activation rounds silu(gate), then the product.  Every row is computed on its own
// in a fixed order, so a row's bits never depend on the other rows of the call.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "avx512_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

// The storage dtype's value of y: rounded to bf16 (and back), or y itself for fp32.  The empty asm
// makes y a finished value, so the compiler never fuses the product that made it into an FMA
// with a later add: torch rounds every op, fp32 included.
inline __m512 round_to(__m512 y, bool bf16) {
  if (bf16) return round_bf16(y);
  __asm__("" : "+v"(y));
  return y;
}

// One row's second RMSNorm pass: out = round(round(x * inv) * weight), x already in the dtype.
void scale_row(const void* x, void* out, const void* weight, int64_t n, float inv, bool bf16) {
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail16(n - i);
    const __m512 y = round_to(_mm512_mul_ps(load16(x, bf16, i, m), vinv), bf16);
    store16(out, bf16, i, round_to(_mm512_mul_ps(y, load16(weight, bf16, i, m)), bf16), m);
  }
}

inline float inv_rms(__m512 sum_sq, int64_t n, float eps) {
  return 1.f / std::sqrt(_mm512_reduce_add_ps(sum_sq) / static_cast<float>(n) + eps);
}

// dst[0, D) = src * cos + rotate_half(src) * sin for one head (D % 16 == 0).
void rotate_head(const void* src, const void* cos, const void* sin, void* dst, int64_t D, bool bf16) {
  alignas(64) float x2[2 * kMaxHeadDim];  // the head twice: rotate_half reads x2[i + D / 2]
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 v = load16(src, bf16, i);
    _mm512_store_ps(x2 + i, v);
    _mm512_store_ps(x2 + D + i, v);
  }
  for (int64_t i = 0; i < D; i += 16) {
    const __m512 a = round_to(_mm512_mul_ps(_mm512_load_ps(x2 + i), load16(cos, bf16, i)), bf16);
    const __m512 b = round_to(_mm512_mul_ps(_mm512_loadu_ps(x2 + i + D / 2), load16(sin, bf16, i)), bf16);
    store16(dst, bf16, i, _mm512_add_ps(a, b));
  }
}

}  // namespace

void rms_norm_rows_avx512(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const void* x = static_cast<const char*>(a.x) + r * a.ldx * a.esz;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 v = load16(x, a.bf16, i, tail16(n - i));
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    scale_row(x, static_cast<char*>(a.out) + r * a.ldo * a.esz, weight, n, inv_rms(ss, n, eps), a.bf16);
  }
}

void add_rms_norm_rows_avx512(const AddNormArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  for (int64_t r = r0; r < r1; ++r) {
    void* x = static_cast<char*>(a.x) + r * a.ldx * a.esz;
    const void* d = static_cast<const char*>(a.d) + r * a.ldd * a.esz;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail16(n - i);
      const __m512 v = round_to(_mm512_add_ps(load16(x, a.bf16, i, m), load16(d, a.bf16, i, m)), a.bf16);
      store16(x, a.bf16, i, v, m);
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    scale_row(x, static_cast<char*>(a.out) + r * a.ldo * a.esz, a.weight, n, inv_rms(ss, n, a.eps), a.bf16);
  }
}

void rope_store_rows_avx512(const RopeArgs& a, int64_t t0, int64_t t1) {
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

void silu_mul_rows_avx512(const RowArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const void* gate = static_cast<const char*>(a.x) + r * a.ldx * a.esz;
    const void* up = static_cast<const char*>(gate) + n * a.esz;
    void* out = static_cast<char*>(a.out) + r * a.ldo * a.esz;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail16(n - i);
      const __m512 g = load16(gate, a.bf16, i, m);
      const __m512 s = round_to(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(
                                                                                        _mm512_setzero_ps(), g)))),
                                a.bf16);
      store16(out, a.bf16, i, round_to(_mm512_mul_ps(s, load16(up, a.bf16, i, m)), a.bf16), m);
    }
  }
}

}  // namespace swiftspec
