// Plain-pointer interface of the K-quant linear (GGUF Q4_K / Q5_K / Q6_K blocks run as stored):
// kquant_linear.cpp (torch glue) -> kquant_avx512.cpp / kquant_avxvnni.cpp / kquant_avx2.cpp.
//
// Numerics.  Each activation row is quantized to int8 per super-block of 256 values (scale
// xs = amax / 127, round half to even) and xsum holds the sum of its int8 values per sub-block.
// A weight super-block of a channel is w[k] = d * sc[j] * q[k] + dm * mm[j] for k in sub-block j,
// q unsigned (4, 5 or 6 bits), sc and mm small signed ints; Q4_K and Q5_K: dm = -dmin, mm = the
// 6-bit min; Q6_K (w = d * sc * (q - 32)): dm = -32 d, mm = sc.  Per (row, super-block) the kernel sums
//   isum = sum_j sc[j] * sum_{k in j} q[k] xq[k]   and   msum = sum_j mm[j] * xsum[j]
// exactly in int32, then y += xs * fma(isum, d, msum * dm) in fp32.  The AVX-512 and AVX2 paths
// do the same integer sums and the same fp32 operations, so they give the same bits; a row's
// result never depends on the other rows.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace swiftspec {

constexpr int kSuperK = 256;  // k per super-block (and per activation quantization block)

// Quantized activations.  xq goes in passes of `pass` rows (the kernel's pass size): pass p holds
// rows [p pass, p pass + R), R = min(pass, M - p pass), as [K/4][R][4] int8, so a 4-byte k-group
// of every row of the pass is one short stride apart.  xs [M, K / 256], xsum [M, K / sub] int16.
struct KAct {
  const int8_t* xq;
  const float* xs;
  const int16_t* xsum;
  int64_t K;
};
constexpr int kPassAvx512 = 8;  // rows per pass of each path
constexpr int kPassAvx2 = 4;      // more ymm than 16 (the compiler spills some); 2 rows unpack twice as often
constexpr int kPassAvxVnni = 4;  // int32 sums of 4 rows x 2 halves, weights and scales: 16 ymm

// One packed weight, T = ceil(N / 16) tiles of 16 channels (layouts: swiftspec/kernels/quant.py).
//   q   [T, K/8, 16, 4]  low 4 bits: byte i of a channel holds k = 8s + i (low nibble) and
//                        k = 8s + 4 + i (high nibble)
//   qh  [T, K/16, 16, 4] 6-bit: bits 4 and 5 of q; for step pair (2u, 2u + 1) the byte of
//                        (channel, i) holds, 2 bits each from bit 0: k = 16u + i, 16u + 4 + i,
//                        16u + 8 + i, 16u + 12 + i
//       [T, K/32, 16, 4] 5-bit: bit 4 of q; for steps 4u..4u + 3 the byte of (channel, i) holds
//                        k = 8s + i in bit 2 (s - 4u) and k = 8s + 4 + i in bit 2 (s - 4u) + 1
//   sc, mm [T, K/(2 sub), 16, 2] int8: sub-blocks (2j, 2j + 1) of a channel side by side (one
//                        vpmaddwd operand); a pure Q6_K weight has mm == sc (same memory)
//   d, dm [T, K/256, 16] fp16
struct KWeight {
  const uint8_t* q;
  const uint8_t* qh;
  const int8_t* sc;
  const int8_t* mm;
  const uint16_t* d;
  const uint16_t* dm;
  int bits;  // 4 and 5: sub-blocks of 32 k; 6: sub-blocks of 16 k
};

constexpr int ksub(int bits) { return bits == 6 ? 16 : 32; }

// Tile t of a packed weight of K columns: each stream advanced to the tile, and the counts per row
// of super-blocks (nsb: xs) and sub-blocks (nsub: xsum) that index the activations.
template <int Bits>
struct KTile {
  static constexpr int kSubs = kSuperK / ksub(Bits);  // sub-blocks per super-block
  int64_t nsb, nsub;
  const uint8_t* q;   // [K/8, 16, 4]
  const uint8_t* qh;  // [K/16, 16, 4] (6-bit), [K/32, 16, 4] (5-bit); null for 4-bit weights
  const int8_t* sc;   // [K/(2 sub), 16, 2]
  const int8_t* mm;
  const uint16_t* d;  // [K/256, 16]
  const uint16_t* dm;
  KTile(const KWeight& w, int64_t K, int64_t t)
      : nsb(K / kSuperK),
        nsub(nsb * kSubs),
        q(w.q + t * K * 8),
        qh(Bits == 4 ? nullptr : w.qh + t * K * (Bits == 6 ? 4 : 2)),
        sc(w.sc + t * nsub * kTileN),
        mm(w.mm + t * nsub * kTileN),
        d(w.d + t * nsb * kTileN),
        dm(w.dm + t * nsb * kTileN) {}
};

// Quantizes one row x [K] (bf16 or fp32; rounding in the header comment: scale = amax / 127,
// q = round_half_even(x * (127 / amax)), two IEEE fp32 operations, the same bits on each path)
// into its place in the pass layout: the 4-byte group g of k goes to dst[g * R * 4], R = the
// rows of its pass.  xs [K/256], xsum [K/sub].
struct KRowIn {
  const void* x;
  bool bf16;
  int64_t K;
  int sub;
};
void kquantize_row_avx512(const KRowIn& in, int8_t* dst, int64_t R, float* xs, int16_t* xsum);
void kquantize_row_avx2(const KRowIn& in, int8_t* dst, int64_t R, float* xs, int16_t* xsum);

void ktiles_avx512(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1);  // 4, 6 bits
void ktiles_avx2(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1);  // 4, 5, 6 bits
void ktiles_avxvnni(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1);  // 4, 6 bits

}  // namespace swiftspec
