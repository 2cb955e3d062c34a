// AVX2 (+ FMA, F16C) kernels for weight-only int8/int4 linear layers at small M: activation
// quantization, and the row passes of qgemm_avx2_passes.h without AVX-VNNI.
#pragma GCC target("avx2,fma,f16c")
#include "qgemm_avx2_passes.h"

namespace swiftspec {
namespace {

// int8: passes of 2 rows x 2 halves: 8 int32 accumulators, 4 weight vectors and the broadcasts
// fit the 16 ymm registers (passes of 4 rows x 1 half measured slower: twice the broadcasts).
// int4: passes of 4 rows x 2 halves: 8 16-bit accumulators (their int32 sums wait in memory
// between flushes), 4 unpacked nibble vectors and 2 broadcasts; each unpacked vector serves twice
// the rows of a 2-row pass (at 4..16 rows, cache-resident, ~10% faster than passes of 2).
constexpr int kPassRowsAvx2 = 2;
constexpr int kInt4PassRowsAvx2 = 4;

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Quantizes one full block of fp32/bf16 values (rounding rule in kernels.h) into q (int8) and
// qa (|q|, u8); returns the scale, *sum gets the sum of the int8 values.
float quantize_block(const void* x, bool bf16, int blk, int8_t* q, uint8_t* qa, int32_t* sum) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < blk; i += 8) amax = _mm256_max_ps(amax, _mm256_and_ps(load8(x, bf16, i), absmask));
  const float a = hmax(amax);
  const __m256 vinv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  __m256i s = _mm256_setzero_si256();
  for (int i = 0; i < blk; i += 16) {
    __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i), vinv));  // round half to even
    __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(load8(x, bf16, i + 8), vinv));
    q0 = _mm256_max_epi32(_mm256_min_epi32(q0, lim), nlim);
    q1 = _mm256_max_epi32(_mm256_min_epi32(q1, lim), nlim);
    s = _mm256_add_epi32(s, _mm256_add_epi32(q0, q1));
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);  // 16 x s16 in order
    const __m128i b = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi16(w, w), 0x08));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qa + i), _mm_abs_epi8(b));
  }
  *sum = hsum(s);
  return a / 127.f;
}

inline float load1(const char* x, bool bf16, int64_t i) {
  if (!bf16) return reinterpret_cast<const float*>(x)[i];
  const uint32_t u = (uint32_t)reinterpret_cast<const uint16_t*>(x)[i] << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

}  // namespace

void quantize_act_avx2(const ActIn& in, const ActQ& a, int64_t r0, int64_t r1) {
  const int64_t esz = in.bf16 ? 2 : 4;
  const int blk = in.blk;
  alignas(32) float tmp[128];
  for (int64_t r = r0; r < r1; ++r) {
    const char* xr = static_cast<const char*>(in.x) + r * in.ld * esz;
    for (int b = 0; b < a.nb; ++b) {
      const int64_t k0 = (int64_t)b * blk, o = r * a.Kp + k0, i = r * a.nb + b;
      const void* src = xr + k0 * esz;
      bool bf16 = in.bf16;
      if (k0 + blk > in.K) {  // the ragged last block goes through a zero-padded fp32 copy
        for (int j = 0; j < blk; ++j) tmp[j] = k0 + j < in.K ? load1(xr, bf16, k0 + j) : 0.f;
        src = tmp;
        bf16 = false;
      }
      int32_t sum;
      const float sc = quantize_block(src, bf16, blk, a.xq + o, a.xabs + o, &sum);
      a.xs[i] = sc;
      const float c = sc * (float)sum;
      if (in.int4) std::memcpy(&a.xc[i], &c, 4);
      else a.xc[i] = -128 * sum;
    }
  }
}

void tiles_avx2(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  run_tiles<false, kPassRowsAvx2, kInt4PassRowsAvx2>(a, w, o, t0, t1);
}

}  // namespace swiftspec
