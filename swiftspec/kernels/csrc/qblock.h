// Plain-pointer interface of the GGUF block linear: Q8_0, Q5_0 and Q4_0 blocks run as stored
// (qblock_linear.cpp, torch glue -> qblock_avx2.cpp).  Each block of 32 k of a channel is
// w[k] = d * q[k], d fp16 and q a signed integer: Q8_0 int8; Q5_0 and Q4_0 store u = q + 16 / q + 8.
//
// Numerics.  Activation rows are quantized to int8 per block of 32 k by quantize_act_avx2 (scale
// xs = amax / 127, round half to even, xc = -128 * sum(xq)).  Per (row, block) the kernel sums
// isum = sum_k q[k] xq[k] exactly in int32 (Q5_0 / Q4_0: sum u xq + xc / 8 or xc / 16, the same
// integer), then y = fma(float(isum) * xs, d, y) in fp32, blocks in k order.  Each row's result
// depends on that row alone.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace swiftspec {

constexpr int kQBlock = 32;  // k per block: one fp16 scale, one activation block

// One packed weight, T = ceil(N / 16) tiles of 16 channels (layouts: swiftspec/kernels/qblock.py).
//   q   bits 8: [T, K/4, 16, 4] int8, 4 consecutive k per channel (the int8 format's order);
//       bits 5 and 4: [T, K/8, 16, 4] the low 4 bits of u, as int4's nibbles (byte i of a channel:
//       k = 8s + i low, k = 8s + 4 + i high)
//   qh  bits 5: [T, K/32, 16, 4] bit 4 of u: step s of the block (k = 8s + i, 8s + 4 + i) in bits
//       2s and 2s + 1 of byte i of the channel; else null
//   d   [T, K/32, 16] fp16
struct QBlockW {
  const uint8_t* q;
  const uint8_t* qh;
  const uint16_t* d;
  int64_t K;
  int bits;  // 8, 5 or 4
};

// Tiles [t0, t1) for all M rows (activations quantized with blk = 32, int4 = false: xc as above).
void qblock_tiles_avx2(const ActQ& a, const QBlockW& w, const OutSpec& o, int64_t t0, int64_t t1);

}  // namespace swiftspec
