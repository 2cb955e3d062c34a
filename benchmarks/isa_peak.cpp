// Peak throughput of the two dot-product instructions the CPU kernels are built on, per core:
// vdpbf16ps (32 bf16 multiply-adds) and vpdpbusd (64 u8 x s8 multiply-adds), 16 independent
// accumulator chains.  It bounds what a linear over M rows can take once it is compute-bound:
// time >= M * params / (2 cores x MACs per second).
//
//   g++ -O2 -Wno-ignored-attributes -o /tmp/isa_peak benchmarks/isa_peak.cpp && /tmp/isa_peak
// Run one copy per core at once to see whether the clock holds with both cores busy:
//   (/tmp/isa_peak & /tmp/isa_peak; wait)
// Dev box (Zen 4 VM, 2 cores, 2026-11-29): 3.6-3.7 G/s each, i.e. one zmm instruction per cycle:
// 117 GMAC/s bf16 and 235 GMAC/s int8 per core, also with both cores busy.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <type_traits>

// Instructions per second of one dot-product kind (Bf16: vdpbf16ps, else vpdpbusd).
template <bool Bf16>
double per_second(long iters) {
  constexpr int kChains = 16;
  using V = std::conditional_t<Bf16, __m512, __m512i>;
  V acc[kChains];
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int i = 0; i < kChains; ++i) acc[i] = V{};
  const auto t0 = std::chrono::steady_clock::now();
  for (long it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) {
      if constexpr (Bf16) {
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
      } else {
        acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      }
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0;
  for (int i = 0; i < kChains; ++i) sink += _mm512_reduce_add_ps(_mm512_castsi512_ps((__m512i)acc[i]));
  if (sink == 42.f) std::printf(" ");  // keeps the chains alive
  return iters * static_cast<double>(kChains) / s;
}

int main() {
  if (__builtin_cpu_supports("avx512bf16")) {  // an AVX-512 VNNI CPU without it (Ice Lake) would fault
    const double bf = per_second<true>(25000000L);
    std::printf("vdpbf16ps zmm: %.2f G/s = %.0f GMAC/s per core\n", bf / 1e9, bf * 32 / 1e9);
  }
  const double vnni = per_second<false>(25000000L);
  std::printf("vpdpbusd zmm:  %.2f G/s = %.0f GMAC/s per core\n", vnni / 1e9, vnni * 64 / 1e9);
}
