// AVX-512 BF16 kernel for bf16 linear layers at small M (1..16 rows), on the plain [N, K] weight.
//
// oneDNN's bf16 GEMM streams weights far below the bandwidth at M <= 16, so a verify or draft
// forward of 8 rows would cost about twice a one-row forward.  Here a block of C output channels
// (C contiguous weight rows) is streamed once per pass of up to 6 activation rows; every weight
// vector of 32 bf16 values meets every row with one vdpbf16ps.
//
// Tuning (the measurements behind each choice: docs/bench/kernels.md, "Tuning notes"):
// - Weight rows are prefetched into L2 16 KiB ahead: an L1 prefetch 4 KiB ahead left the stream
//   short of requests once the core was busy computing.
// - Passes of 6 rows x 4 channels (24 accumulators, 10 loads per 24 vdpbf16ps) instead of 8 x 2
//   (16 accumulators, 10 loads per 16).
//
// Batch invariance: output (r, n) is one accumulator chain over k = 0, 32, 64, ... followed by the
// same horizontal sum, whatever M, C and the row pass are, so a row's result never depends on the
// other rows of the batch (tree verification computes bit-identical logits to a one-row step).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kPassRowsBf16 = 6;       // rows per pass: C x R accumulators stay in registers
constexpr int kPrefetchElems = 8192;   // L2 prefetch distance along a weight row (16 KiB)

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
  auto step = [&](int64_t k, __mmask32 m) __attribute__((always_inline)) {
    __m512bh wv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      wv[c] = load32(w[c] + k, m);
      _mm_prefetch(reinterpret_cast<const char*>(w[c] + k + kPrefetchElems), _MM_HINT_T1);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = load32(x[r] + k, m);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[c][r] = _mm512_dpbf16_ps(acc[c][r], xv, wv[c]);
    }
  };
  int64_t k = 0;
  for (; k + 32 <= g.K; k += 32) step(k, 0xFFFFFFFFu);
  if (k < g.K) step(k, tail32(g.K - k));
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    const float b = g.bias ? g.bias[n0 + c] : 0.f;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) g.out[(r0 + r) * g.ldo + n0 + c] = to_bf16(_mm512_reduce_add_ps(acc[c][r]) + b);
  }
}

using BlockFn = void (*)(const Bf16Gemm&, int64_t, int64_t);

// Channels per block for a pass of R rows: 8 for one or two rows (8-16 chains hide the
// vdpbf16ps latency), else 4 (12-24 accumulators).  M > 6 runs passes of 6 rows and a shorter
// last pass with C = 4; `one` serves the N tail channel by channel.
template <int R>
constexpr int kChannels = R <= 2 ? 8 : 4;
constexpr int kPassChannels = 4;

template <int... Rs>
struct Blocks {
  static constexpr BlockFn wide[] = {block<kChannels<Rs>, Rs>...};
  static constexpr BlockFn passes[] = {block<kPassChannels, Rs>...};
  static constexpr BlockFn one[] = {block<1, Rs>...};
  static constexpr int channels[] = {kChannels<Rs>...};
};
using Passes = Blocks<1, 2, 3, 4, 5, 6>;
static_assert(kPassRowsBf16 == 6 && kChannels<kPassRowsBf16> == kPassChannels, "passes use passes[]");

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
  const BlockFn* fns = g.M <= kPassRowsBf16 ? Passes::wide : Passes::passes;
  int64_t n = n0;
  for (; n + C <= n1; n += C) run_blocks(fns, g, n);
  for (; n < n1; ++n) run_blocks(Passes::one, g, n);
}

}  // namespace swiftspec
