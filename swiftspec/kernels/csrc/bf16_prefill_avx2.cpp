// AVX2 GEMM for bf16 linear layers at large M (prompt prefill) on CPUs without AVX-512 BF16,
// where torch's bf16 matmul falls back to oneDNN's emulated bf16 (several times slower than fp32).
//
// A panel GEMM on widened operands (GotoBLAS loop order).  x is widened to fp32 once per call,
// packed in passes of 6 rows, K-block by K-block.  A thread takes a group of kGroup panels of 16
// output channels and an m-block of kMc passes; for each K-block it widens and transposes each
// panel's weights into b [kKc][16] (16 KiB, stays in L1) and runs every pass of the m-block over
// it, so the m-block's slice of x (kMc * 6 rows x kKc, L2-resident) serves all the group's panels.
// The register tile is 6 rows x 16 channels: 12 accumulators, 2 weight vectors and 1 broadcast x
// value (15 of the 16 ymm registers), 12 FMAs per 8 loads; the accumulators park in per-thread
// tiles between K-blocks.
//
// Numerics: output (r, n) is one fp32 FMA chain over k = 0, 1, ..., K-1 (products of bf16 values
// are exact in fp32), plus the bias, rounded once to bf16.  The order does not depend on M, the
// pass or the thread split (it differs from the small-M kernels' order).
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels.h"

namespace swiftspec {
namespace {

// Cache fit: b [kKc][16] fp32 = 16 KiB and a pass's a block [kKc][6] = 6 KiB share L1; an
// m-block's a block ([kMc * 6][kKc] = 192 KiB) and the group's tiles ([kGroup][kMc * 6][16] =
// 96 KiB) stay in L2 (512 KiB on Zen 3).
constexpr int kRows = kPrefillRows;
constexpr int kPanel = kPrefillPanel;
constexpr int kKc = kPrefillKc;
constexpr int kGroup = kPrefillGroup;
constexpr int kMc = kPrefillMc;
static_assert(kRows == 6 && kPanel == 16, "micro() holds a 6 x 16 tile");

inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// 8 bf16 at p as 8 fp32.
inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// In-register transpose of an 8 x 8 fp32 block.
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// b [kc][16] fp32 <- weight rows [n0, n0 + nv) (nv <= 16; missing channels are 0), k in [k0, k0 + kc).
void pack_b(const Bf16Gemm& g, int64_t n0, int64_t nv, int64_t k0, int64_t kc, float* b) {
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    for (int half = 0; half < 2; ++half) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t c = half * 8 + i;
        r[i] = c < nv ? widen8(g.w + (n0 + c) * g.ldw + k0 + k) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(b + (k + j) * kPanel + half * 8, r[j]);
    }
  }
  for (; k < kc; ++k) {
    for (int c = 0; c < kPanel; ++c) b[k * kPanel + c] = c < nv ? widen(g.w[(n0 + c) * g.ldw + k0 + k]) : 0.f;
  }
}

// tile [6][16] += a [kc][6] x b [kc][16], one FMA chain per output in k order.
void micro(const float* a, const float* b, int64_t kc, float* tile) {
  __m256 c[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    c[r][0] = _mm256_loadu_ps(tile + r * kPanel);
    c[r][1] = _mm256_loadu_ps(tile + r * kPanel + 8);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * kPanel), b1 = _mm256_loadu_ps(b + k * kPanel + 8);
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + k * kRows + r);
      c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm256_storeu_ps(tile + r * kPanel, c[r][0]);
    _mm256_storeu_ps(tile + r * kPanel + 8, c[r][1]);
  }
}

inline __m256i to_bf16(__m256 y) {  // round to nearest even, in the low half of each dword
  __m256i u = _mm256_castps_si256(y);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_srli_epi32(u, 16);
}

// out rows [r0, r1) x channels [n0, n0 + nv) <- tile (row 0 = row r0) + bias, rounded to bf16.
void store_panel(const Bf16Gemm& g, int64_t n0, int64_t nv, int64_t r0, int64_t r1, const float* tile) {
  alignas(32) float bias[kPanel] = {};
  if (g.bias) std::memcpy(bias, g.bias + n0, nv * sizeof(float));
  const __m256 b0 = _mm256_load_ps(bias), b1 = _mm256_load_ps(bias + 8);
  for (int64_t r = r0; r < r1; ++r) {
    const float* t = tile + (r - r0) * kPanel;
    const __m256 y0 = _mm256_add_ps(_mm256_loadu_ps(t), b0), y1 = _mm256_add_ps(_mm256_loadu_ps(t + 8), b1);
    alignas(32) uint16_t h[kPanel];
    const __m256i p = _mm256_packus_epi32(to_bf16(y0), to_bf16(y1));  // lanes: 0-3 8-11 4-7 12-15
    _mm256_store_si256(reinterpret_cast<__m256i*>(h), _mm256_permute4x64_epi64(p, 0xD8));
    std::memcpy(g.out + r * g.ldo + n0, h, nv * sizeof(uint16_t));
  }
}

inline int64_t passes(int64_t M) { return (M + kRows - 1) / kRows; }

// Passes [q0, q1) x the panels of channels [n0, n1) (at most kGroup): for each K-block, every
// panel's weights are packed once and meet all the passes, whose a block stays in L2 meanwhile.
void run_block(const Bf16Gemm& g, const float* a, int64_t n0, int64_t n1, int64_t q0, int64_t q1,
               float* b, float* tiles) {
  const int64_t P = passes(g.M), rows = (q1 - q0) * kRows, panels = (n1 - n0 + kPanel - 1) / kPanel;
  std::memset(tiles, 0, panels * rows * kPanel * sizeof(float));
  for (int64_t k0 = 0; k0 < g.K; k0 += kKc) {
    const int64_t kc = g.K - k0 < kKc ? g.K - k0 : kKc;
    for (int64_t i = 0; i < panels; ++i) {
      const int64_t n = n0 + i * kPanel;
      pack_b(g, n, n1 - n < kPanel ? n1 - n : kPanel, k0, kc, b);
      for (int64_t p = q0; p < q1; ++p) {
        micro(a + k0 * P * kRows + p * kc * kRows, b, kc, tiles + (i * rows + (p - q0) * kRows) * kPanel);
      }
    }
  }
  const int64_t r1 = std::min(g.M, q1 * kRows);
  for (int64_t i = 0; i < panels; ++i) {
    const int64_t n = n0 + i * kPanel;
    store_panel(g, n, n1 - n < kPanel ? n1 - n : kPanel, q0 * kRows, r1, tiles + i * rows * kPanel);
  }
}

}  // namespace

// a: K-block by K-block (k0 = 0, kKc, ...), each [passes][kc][6] at a + k0 * passes * 6, so the
// block of all passes is one contiguous stream.
void bf16_prefill_pack_x_avx2(const Bf16Gemm& g, float* a, int64_t p0, int64_t p1) {
  const int64_t P = passes(g.M);
  for (int64_t p = p0; p < p1; ++p) {
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = p * kRows + r;
      const uint16_t* x = g.x + row * g.ldx;
      for (int64_t k0 = 0; k0 < g.K; k0 += kKc) {
        const int64_t kc = g.K - k0 < kKc ? g.K - k0 : kKc;
        float* dst = a + k0 * P * kRows + p * kc * kRows + r;
        for (int64_t k = 0; k < kc; ++k) dst[k * kRows] = row < g.M ? widen(x[k0 + k]) : 0.f;
      }
    }
  }
}

void bf16_prefill_cols_avx2(const Bf16Gemm& g, const float* a, float* scratch, int64_t n0, int64_t n1) {
  float* b = scratch;                   // [kKc][16] weight block
  float* tiles = scratch + kKc * kPanel;  // [kGroup][kMc * 6][16] accumulators
  const int64_t P = passes(g.M);
  for (int64_t c0 = n0; c0 < n1; c0 += kGroup * kPanel) {
    for (int64_t q0 = 0; q0 < P; q0 += kMc) {
      run_block(g, a, c0, std::min(n1, c0 + kGroup * kPanel), q0, std::min(P, q0 + kMc), b, tiles);
    }
  }
}

}  // namespace swiftspec
