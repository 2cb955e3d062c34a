// Small AVX-512 helpers shared by the kernel files.  Include after the file's `#pragma GCC target`
// (AVX-512 F/BW/VL/DQ at least): the helpers have internal linkage, so every file compiles its own
// copy for its own target and none leaks into the generic glue.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace swiftspec {
namespace {

inline __mmask16 tail16(int64_t n) {
  return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

// 16 values at p[i, i + 16) (lanes outside m read as 0), bf16 or fp32, widened to fp32.
inline __m512 load16(const void* p, bool bf16, int64_t i, __mmask16 m = 0xFFFF) {
  if (bf16) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

// y rounded to bf16 (nearest even, as torch rounds finite values), kept as fp32.
inline __m512 round_bf16(__m512 y) {
  __m512i u = _mm512_castps_si512(y);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                                           _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Stores the lanes m of y at p[i, ...) as fp32, or rounded to bf16.
inline void store16(void* p, bool bf16, int64_t i, __m512 y, __mmask16 m = 0xFFFF) {
  if (!bf16) {
    _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, y);
    return;
  }
  const __m512i u = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(y)), 16);
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
}  // namespace swiftspec
