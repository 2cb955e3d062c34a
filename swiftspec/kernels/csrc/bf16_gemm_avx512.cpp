// AVX-512 BF16 kernel for bf16 linear layers at small M (1..16 rows), on the plain [N, K] weight.
//
// oneDNN's bf16 GEMM reaches only 13-19 GB/s at M <= 16 on the 2-core dev box, so a verify or
// draft forward of 8 rows costs about twice a one-row forward.  Here a block of C output channels
// (C contiguous weight rows) is streamed once per pass of up to 8 activation rows; every weight
// vector of 32 bf16 values meets every row with one vdpbf16ps.
//
// Batch invariance: output (r, n) is one accumulator chain over k = 0, 32, 64, ... followed by the
// same horizontal sum, whatever M, C and the row pass are, so a row's result never depends on the
// other rows of the batch (tree verification computes bit-identical logits to a one-row step).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>

#include <cstring>

#include "qgemm.h"

namespace swiftspec {
namespace {

constexpr int kPassRowsBf16 = 8;   // rows per pass: C x R accumulators stay in registers
constexpr int kPrefetchElems = 2048;  // software prefetch distance along a weight row (1 KiB)

inline __mmask32 tail32(int64_t n) {
  return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : (__mmask32)((1u << n) - 1);
}

inline __m512bh load32(const uint16_t* p, __mmask32 m) {
  return (__m512bh)_mm512_maskz_loadu_epi16(m, p);
}

// fp32 -> bf16, round to nearest even (as torch does for finite values).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// Output channels [n0, n0 + C) for activation rows [r0, r0 + R).
template <int C, int R>
void block(const Bf16Gemm& g, int64_t n0, int64_t r0) {
  __m512 acc[C][R];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[c][r] = _mm512_setzero_ps();
  const uint16_t* w[C];
  const uint16_t* x[R];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) w[c] = g.w + (n0 + c) * g.ldw;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) x[r] = g.x + (r0 + r) * g.ldx;
  for (int64_t k = 0; k < g.K; k += 32) {
    const __mmask32 m = tail32(g.K - k);
    __m512bh wv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      wv[c] = load32(w[c] + k, m);
      _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + kPrefetchElems), _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = load32(x[r] + k, m);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[c][r] = _mm512_dpbf16_ps(acc[c][r], xv, wv[c]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    const float b = g.bias ? g.bias[n0 + c] : 0.f;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) g.out[(r0 + r) * g.ldo + n0 + c] = to_bf16(_mm512_reduce_add_ps(acc[c][r]) + b);
  }
}

using BlockFn = void (*)(const Bf16Gemm&, int64_t, int64_t);

// Channels per block for a pass of R rows: C x R <= 16 accumulators (8 chains for one row, so
// vdpbf16ps latency is hidden).  M > 8 runs passes of 8 rows (C = 2) and a shorter last pass with
// the same C; `one` serves the N tail channel by channel.
template <int R>
constexpr int kChannels = R == 1 || R == 2 ? 8 : R <= 4 ? 4 : 2;

template <int... Rs>
struct Blocks {
  static constexpr BlockFn wide[] = {block<kChannels<Rs>, Rs>...};
  static constexpr BlockFn pair[] = {block<2, Rs>...};
  static constexpr BlockFn one[] = {block<1, Rs>...};
  static constexpr int channels[] = {kChannels<Rs>...};
};
using Passes = Blocks<1, 2, 3, 4, 5, 6, 7, 8>;
static_assert(kPassRowsBf16 == 8 && kChannels<kPassRowsBf16> == 2, "passes after the first use pair[]");

void run_blocks(const BlockFn* fns, const Bf16Gemm& g, int64_t n) {
  for (int64_t r0 = 0; r0 < g.M; r0 += kPassRowsBf16) {
    const int64_t rows = g.M - r0 < kPassRowsBf16 ? g.M - r0 : kPassRowsBf16;
    fns[rows - 1](g, n, r0);
  }
}

}  // namespace

int bf16_block_channels(int64_t M) {
  return Passes::channels[(M < kPassRowsBf16 ? M : kPassRowsBf16) - 1];
}

void bf16_cols_avx512(const Bf16Gemm& g, int64_t n0, int64_t n1) {
  const int C = bf16_block_channels(g.M);
  const BlockFn* fns = g.M <= kPassRowsBf16 ? Passes::wide : Passes::pair;
  int64_t n = n0;
  for (; n + C <= n1; n += C) run_blocks(fns, g, n);
  for (; n < n1; ++n) run_blocks(Passes::one, g, n);
}

}  // namespace swiftspec
