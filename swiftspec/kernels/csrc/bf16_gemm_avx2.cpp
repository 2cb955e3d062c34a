// AVX2 kernel for bf16 linear layers at small M (1..16 rows), on the plain [N, K] weight: the
// path of CPUs without AVX-512 BF16 (AMD Zen 3, Intel client cores).
//
// Widening: a bf16 value is the high half of an fp32, so 16 bf16 loaded as 8 dwords give two
// fp32 vectors with one integer op each: `v << 16` holds the even elements, `v & 0xFFFF0000`
// the odd ones.  The activations are split the same way once per call into an fp32 scratch
// (bf16_split_rows_avx2), so each weight chunk pairs with the matching x halves by plain FMAs.
// Products of two bf16 values are exact in fp32; sums are fp32.
//
// Register blocking (16 ymm): a block of C output channels (C contiguous weight rows) is streamed
// from memory once and re-read from L1/L2 by each further pass of R activation rows.  A pass
// keeps the x halves of its rows in registers and loads, widens and uses one weight chunk at a
// time: with R = 2, C = 4 (8 accumulators, 4 x halves, 2 weight halves and the mask) a 16-value
// step issues 8 loads for 16 FMAs.  The weight-stationary alternative (weights widened into
// registers, x as memory operands; R = 4, C = 2 or R = 3, C = 3) issues about one load per FMA
// and measured clearly slower.  Odd M ends with a one-row pass on the same blocks; M = 1 uses
// C = 8 (the call is bound by DRAM).
//
// Prefetch: while a block runs, every pass prefetches the next block's weights (the C rows that
// follow, at the same k) into L2, one prefetch per 64-byte line; later passes' prefetches hit L2
// and cost little.  So the next block streams from DRAM during all the passes of this one.  A
// fixed distance along the row (16 KiB ahead, as in the AVX-512 kernel) left the first pass of
// each block waiting on DRAM, the other passes idle on the bus, and long rows (K = 8960: the
// prefetch stays within C scattered rows) well below the bandwidth even at M = 1.
//
// Batch invariance: output (r, n) is one accumulator chain over k = 0, 16, 32, ... (the even
// half's FMA, then the odd half's) followed by the same horizontal sum, whatever M, C and the
// row pass are, so a row's result never depends on the other rows of the batch.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include <cstring>

#include "avx2_util.h"
#include "kernels.h"

namespace swiftspec {
namespace {

constexpr int kChunk = 16;             // bf16 values per 32-byte load
constexpr int kPassRowsAvx2 = 2;

inline __m256 even_half(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 odd_half(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline __m256i load_chunk(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The last n < 16 values at p, zero-padded to a chunk in buf.
inline const uint16_t* pad_chunk(const uint16_t* p, int64_t n, uint16_t* buf) {
  std::memset(buf, 0, kChunk * sizeof(uint16_t));
  std::memcpy(buf, p, n * sizeof(uint16_t));
  return buf;
}

// fp32 -> bf16, round to nearest even (as torch does for finite values).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// One 16-value step of a C x R block: w[c] points at the weight chunk, x[r] at the split x
// chunk.  The x halves stay in registers while each weight chunk is loaded, widened and used.
template <int C, int R>
inline __attribute__((always_inline)) void step(__m256 (&acc)[C][R], const uint16_t* const (&w)[C],
                                                const float* const (&x)[R]) {
  __m256 xe[R], xo[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    xe[r] = _mm256_loadu_ps(x[r]);
    xo[r] = _mm256_loadu_ps(x[r] + 8);
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const __m256i v = load_chunk(w[c]);
    const __m256 we = even_half(v), wo = odd_half(v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_fmadd_ps(wo, xo[r], _mm256_fmadd_ps(we, xe[r], acc[c][r]));
  }
}

// Output channels [n0, n0 + C) for activation rows [r0, r0 + R); xs: the split rows [M][Kp].
template <int C, int R>
void block(const Bf16Gemm& g, const float* xs, int64_t n0, int64_t r0) {
  const int64_t Kp = (g.K + kChunk - 1) / kChunk * kChunk;
  __m256 acc[C][R];
  const uint16_t* wr[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    wr[c] = g.w + (n0 + c) * g.ldw;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  }
  auto at = [&](int64_t k) __attribute__((always_inline)) {
    const uint16_t* w[C];
    const float* x[R];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) w[c] = wr[c] + k;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = xs + (r0 + r) * Kp + k;
    step<C, R>(acc, w, x);
  };
  int64_t k = 0;
  for (; k + 2 * kChunk <= g.K; k += 2 * kChunk) {  // two chunks = one 64-byte line per row
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(wr[c] + C * g.ldw + k), _MM_HINT_T1);
    at(k);
    at(k + kChunk);
  }
  if (k + kChunk <= g.K) {
    at(k);
    k += kChunk;
  }
  if (k < g.K) {  // ragged end: zero-padded weight chunks (the split x is zero-padded already)
    uint16_t buf[C][kChunk];
    const uint16_t* w[C];
    const float* x[R];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) w[c] = pad_chunk(wr[c] + k, g.K - k, buf[c]);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = xs + (r0 + r) * Kp + k;
    step<C, R>(acc, w, x);
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const float b = g.bias ? g.bias[n0 + c] : 0.f;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) g.out[(r0 + r) * g.ldo + n0 + c] = to_bf16(hsum8(acc[c][r]) + b);
  }
}

using BlockFn = void (*)(const Bf16Gemm&, const float*, int64_t, int64_t);

// Channels per block when all M <= kPassRowsAvx2 rows go in one pass; larger M runs passes of
// kPassRowsAvx2 rows (and a shorter last pass) on blocks of kPassChannels.  `one` serves the N
// tail channel by channel.
template <int R>
constexpr int kChannels = R == 1 ? 8 : 4;
constexpr int kPassChannels = 4;

template <int... Rs>
struct Blocks {
  static constexpr BlockFn wide[] = {block<kChannels<Rs>, Rs>...};
  static constexpr BlockFn passes[] = {block<kPassChannels, Rs>...};
  static constexpr BlockFn one[] = {block<1, Rs>...};
  static constexpr int channels[] = {kChannels<Rs>...};
};
using Passes = Blocks<1, 2>;
static_assert(kChannels<kPassRowsAvx2> == kPassChannels, "the full pass uses passes[]");

void run_blocks(const BlockFn* fns, const Bf16Gemm& g, const float* xs, int64_t n) {
  for (int64_t r0 = 0; r0 < g.M; r0 += kPassRowsAvx2) {
    const int64_t rows = g.M - r0 < kPassRowsAvx2 ? g.M - r0 : kPassRowsAvx2;
    fns[rows - 1](g, xs, n, r0);
  }
}

}  // namespace

int bf16_block_channels_avx2(int64_t M) {
  return Passes::channels[(M < kPassRowsAvx2 ? M : kPassRowsAvx2) - 1];
}

int64_t bf16_split_stride(int64_t K) { return (K + kChunk - 1) / kChunk * kChunk; }

void bf16_split_rows_avx2(const Bf16Gemm& g, float* xs) {
  const int64_t Kp = bf16_split_stride(g.K);
  for (int64_t r = 0; r < g.M; ++r) {
    const uint16_t* x = g.x + r * g.ldx;
    float* dst = xs + r * Kp;
    uint16_t buf[kChunk];
    for (int64_t k = 0; k < g.K; k += kChunk) {
      const uint16_t* src = k + kChunk <= g.K ? x + k : pad_chunk(x + k, g.K - k, buf);
      const __m256i v = load_chunk(src);
      _mm256_storeu_ps(dst + k, even_half(v));
      _mm256_storeu_ps(dst + k + 8, odd_half(v));
    }
  }
}

void bf16_cols_avx2(const Bf16Gemm& g, const float* xs, int64_t n0, int64_t n1) {
  const int C = bf16_block_channels_avx2(g.M);
  const BlockFn* fns = g.M <= kPassRowsAvx2 ? Passes::wide : Passes::passes;
  int64_t n = n0;
  for (; n + C <= n1; n += C) run_blocks(fns, g, xs, n);
  for (; n < n1; ++n) run_blocks(Passes::one, g, xs, n);
}

}  // namespace swiftspec
