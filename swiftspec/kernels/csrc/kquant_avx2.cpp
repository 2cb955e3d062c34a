// AVX2 (+ FMA, F16C) kernel of the K-quant linear: the row quantizer, and the passes of
// kquant_avx2_passes.h without AVX-VNNI (in passes of kPassAvx2 rows).
#pragma GCC target("avx2,fma,f16c")
#include "kquant_avx2_passes.h"

namespace swiftspec {
namespace {

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum8i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

}  // namespace

void kquantize_row_avx2(const KRowIn& in, int8_t* dst, int64_t R, float* xs, int16_t* xsum) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  for (int64_t k0 = 0; k0 < in.K; k0 += kSuperK) {
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < kSuperK; i += 8) {
      amax = _mm256_max_ps(amax, _mm256_and_ps(load8(in.x, in.bf16, k0 + i), absmask));
    }
    const float a = hmax8(amax);
    const __m256 inv = _mm256_set1_ps(a > 0.f ? 127.f / a : 0.f);
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < kSuperK; i += 8) {
      __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(load8(in.x, in.bf16, k0 + i), inv));  // half to even
      q = _mm256_max_epi32(_mm256_min_epi32(q, lim), nlim);
      s = _mm256_add_epi32(s, q);
      const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      const int64_t b = _mm_cvtsi128_si64(_mm_packs_epi16(w, w));  // the 8 int8 values in order
      std::memcpy(dst + (k0 + i) / 4 * R * 4, &b, 4);
      std::memcpy(dst + ((k0 + i) / 4 + 1) * R * 4, reinterpret_cast<const char*>(&b) + 4, 4);
      if ((i + 8) % in.sub == 0) xsum[(k0 + i) / in.sub] = static_cast<int16_t>(hsum8i(s)), s = _mm256_setzero_si256();
    }
    xs[k0 / kSuperK] = a / 127.f;
  }
}

void ktiles_avx2(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1) {
  run_ktiles<false, kPassAvx2>(a, w, o, t0, t1);
}

}  // namespace swiftspec
