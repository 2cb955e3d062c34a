// AVX-512 row-wise kernels of the decoder: RMSNorm and the SwiGLU activation (silu(gate) * up).
//
// At the few rows of decoding, verification and draft expansion, ATen runs these as 3-6 ops
// each (casts, pow, mean, rsqrt, silu, mul) at 40-100 us per call on the 2-core dev box, ~10% of
// a forward.  Here each is one pass per row.  Rounding follows the model's torch code, step by
// step: RMSNorm normalizes in fp32, rounds to the model dtype, then multiplies by the weight and
// rounds; the activation rounds silu(gate), then the product.  Every row is computed on its own
// in a fixed order, so a row's bits never depend on the other rows of the call.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>

#include <cmath>

#include "qgemm.h"

namespace swiftspec {
namespace {

inline __mmask16 tail16(int64_t n) {
  return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

inline __m512 load16(const void* p, bool bf16, int64_t i, __mmask16 m) {
  if (bf16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

// Rounds to the storage dtype (bf16: nearest even, as torch does for finite values) and back to
// fp32, so the next step computes on exactly the value torch would have stored.
inline __m512 round_to(__m512 y, bool bf16) {
  if (!bf16) return y;
  __m512i u = _mm512_castps_si512(y);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                           _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline void store16(void* p, bool bf16, int64_t i, __m512 rounded, __mmask16 m) {
  if (!bf16) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, rounded);
    return;
  }
  const __m512i u = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, _mm512_cvtepi32_epi16(u));
}

// exp(x): 2^n * P(r), x = n ln2 + r, |r| <= ln2 / 2, P of degree 6 (rel. error ~2e-7); inputs
// below -87 give ~0 and above ~88.7 overflow to +inf, as expf does.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace

void rms_norm_rows_avx512(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1) {
  const int64_t n = a.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const void* x = static_cast<const char*>(a.x) + r * a.ldx * a.esz;
    void* out = static_cast<char*>(a.out) + r * a.ldo * a.esz;
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __m512 v = load16(x, a.bf16, i, tail16(n - i));
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const float inv = 1.f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(n) + eps);
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail16(n - i);
      const __m512 y = round_to(_mm512_mul_ps(load16(x, a.bf16, i, m), vinv), a.bf16);
      store16(out, a.bf16, i, round_to(_mm512_mul_ps(y, load16(weight, a.bf16, i, m)), a.bf16), m);
    }
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
