// Plain-pointer interface between the torch glue (quant_linear.cpp) and the ISA kernels.
//
// The kernel files are compiled with `#pragma GCC target(...)` and must not include torch
// headers (inline torch code compiled for AVX-512 could leak into the generic binary).
//
// Numerics (identical on every ISA path): each row of x is quantized to int8 per K-block of
// `blk` values (scale = amax / 127, round half to even); the int8 x int dot products are
// exact int32 sums, combined per block in fp32.  Per row, the result does not depend on M.
#pragma once
#include <cstdint>

namespace swiftspec {

constexpr int kTileN = 16;  // output channels per tile (one zmm of fp32 lanes)

// Row-wise quantized activations.  xq: [M, Kp] int8, zero-padded past K.
struct ActQ {
  const int8_t* xq;
  const int16_t* x16;  // same values widened to int16 (AVX2 path only, else nullptr)
  const float* xs;     // [M, nb] block scales
  const int32_t* xsum; // [M, nb] sum of the int8 values of each block
  int64_t ldx;         // row stride of xq / x16 (= Kp)
  int nb;              // blocks per row (= Kp / blk)
};

// One packed weight (layouts are documented in swiftspec/kernels/quant.py).
struct PackedW {
  const uint8_t* q;      // int8: [T, Kp/4, 16, 4] u8 (w + 128); int4: [T, Kp/8, 16, 4] nibbles
  const float* scale;    // int8: [T*16] per-channel scale
  const uint16_t* d;     // int4: [T, Kp/G, 16] fp16 group scales
  const uint16_t* mn;    // int4: [T, Kp/G, 16] fp16 group minimums
  int64_t Kp;            // padded K (multiple of blk)
  int blk;               // K-block: activation block, and int4 group size
  bool int4;
};

// Destination of one call: out [M, N] fp32 or bf16, optional fp32 bias [N].
struct OutSpec {
  void* out;
  const float* bias;
  int64_t M;
  int64_t N;
  int64_t ldo;
  bool bf16;
};

// Per-ISA entry points: quantize activations; compute output tiles [t0, t1).
void quantize_act_avx512(const void* x, bool x_bf16, int64_t M, int64_t K, int64_t ldx_in,
                         int blk, int64_t Kp, int8_t* xq, float* xs, int32_t* xsum);
void tiles_avx512(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1);

void quantize_act_avx2(const void* x, bool x_bf16, int64_t M, int64_t K, int64_t ldx_in,
                       int blk, int64_t Kp, int8_t* xq, float* xs, int32_t* xsum,
                       int16_t* x16);
void tiles_avx2(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1);

}  // namespace swiftspec
