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

#include "avx512_util.h"
#include "qgemm.h"

namespace swiftspec {
namespace {

// The storage dtype's value of y: rounded to bf16 (and back), or y itself for fp32.
inline __m512 round_to(__m512 y, bool bf16) { return bf16 ? round_bf16(y) : y; }

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
