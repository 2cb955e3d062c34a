// Plain-pointer interface between the torch glue (quant_linear.cpp) and the ISA kernels.
//
// The kernel files are compiled with `#pragma GCC target(...)` and must not include torch
// headers (inline torch code compiled for AVX-512 could leak into the generic binary).
//
// Numerics (identical on every ISA path): each row of x is quantized to int8 per K-block of
// `blk` values (scale = amax / 127, round half to even); the int8 x int dot products are
// exact int32 sums, combined per block in fp32.  Per row, the result does not depend on M.
#pragma once
#include <xmmintrin.h>

#include <cstdint>

namespace swiftspec {

constexpr int kTileN = 16;  // output channels per tile (one zmm of fp32 lanes)
// The packed weight streams of the quantized linears are prefetched into L1 this far ahead
// (why: kquant_avx512.cpp).
constexpr int kPrefetchBytes = 2048;

// Row-wise quantized activations.  Rows go in passes of kPassRows; the AVX-512 layout puts the
// 4-byte k-groups of a pass's rows side by side so one base pointer reaches them all:
//   AVX-512: xq pass p (rows 16p..): [Kp/4][R] int32 groups; xs, xc pass p: [nb][R]
//   AVX2:    xq, xabs: [M, Kp];                                xs, xc: [M, nb]
// xc is the per-(row, block) correction: int8 weights: -128 * sum(xq) (int32);
// int4 weights: the bits of the float xs * sum(xq).
constexpr int kPassRows = 16;  // 16 int32 accumulators + weights fit the 32 zmm registers

struct ActQ {  // buffers owned by the caller; quantize_act_* fills them, tiles_* reads them
  int8_t* xq;
  uint8_t* xabs;  // AVX2 and AVX-VNNI only (|xq|), else nullptr
  float* xs;     // block scales (amax / 127)
  int32_t* xc;   // block corrections (see above)
  int64_t Kp;          // padded K (multiple of the block)
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

// Per-ISA entry points.  quantize_act_*: rows [r0, r1) of x (r0 a multiple of kPassRows) into
// `a`; tiles_*: output tiles [t0, t1) for all M rows.
struct ActIn {
  const void* x;
  bool bf16;
  int64_t ld;  // row stride of x, elements
  int64_t K;
  int64_t M;
  bool int4;
  int blk;
};
void quantize_act_avx512(const ActIn& in, const ActQ& a, int64_t r0, int64_t r1);
void tiles_avx512(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1);
void quantize_act_avx2(const ActIn& in, const ActQ& a, int64_t r0, int64_t r1);
void tiles_avx2(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1);
void tiles_avxvnni(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1);  // AVX2's layout

// int4 weight quantization (int4_fit.cpp, plain x86-64): groups [g0, g1) of x (n fp32 values each,
// n a multiple of 8, <= 128) -> dm[2 g] = d, dm[2 g + 1] = mn, the searched fit of each group.
constexpr int kInt4FitGrids = 21;  // candidate grids per group (each a sweep of its n values)
void int4_fit_groups(const float* x, int64_t g0, int64_t g1, int n, float* dm);

// bf16 linear at small M (bf16_gemm_avx512.cpp): out [M, N] bf16 = x [M, K] @ w[N, K]^T + bias,
// all bf16 except the fp32 bias; ld* are row strides in elements.  bf16_cols_avx512 computes
// output channels [n0, n1) (n0 a multiple of bf16_block_channels(M)) for all M rows.
struct Bf16Gemm {
  const uint16_t* x;
  int64_t ldx;
  const uint16_t* w;
  int64_t ldw;
  const float* bias;
  uint16_t* out;
  int64_t ldo;
  int64_t M;
  int64_t N;
  int64_t K;
};
int bf16_block_channels(int64_t M);
// The AVX2 path (bf16_gemm_avx2.cpp): bf16_split_rows_avx2 widens the M rows of x once per call
// into xs [M, bf16_split_stride(K)] fp32 (each 16-value chunk as its 8 even then 8 odd
// elements, zero-padded); bf16_cols_avx2 then computes channels [n0, n1) (n0 a multiple of
// bf16_block_channels_avx2(M)) for all M rows.
int64_t bf16_split_stride(int64_t K);
int bf16_block_channels_avx2(int64_t M);
void bf16_split_rows_avx2(const Bf16Gemm& g, float* xs);
void bf16_cols_avx2(const Bf16Gemm& g, const float* xs, int64_t n0, int64_t n1);
// bf16 linear at large M (prefill; bf16_prefill_avx2.cpp), fp32 accumulation in k order.
// bf16_prefill_pack_x_avx2 widens passes [p0, p1) of kPrefillRows rows of x into a (passes *
// kPrefillRows * K floats; rows past M are 0); bf16_prefill_cols_avx2 computes channels [n0, n1)
// (n0 a multiple of kPrefillPanel) for all M rows, with kPrefillScratch floats of the calling
// thread's scratch (a weight block and the accumulator tiles of a group of panels).
constexpr int kPrefillRows = 6;     // rows per pass (register tile height)
constexpr int kPrefillPanel = 16;   // channels per panel (register tile width)
constexpr int kPrefillKc = 256;     // K-block
constexpr int kPrefillGroup = 8;    // panels per group
constexpr int kPrefillMc = 32;      // passes per m-block
constexpr int64_t kPrefillScratch = (kPrefillKc + kPrefillGroup * kPrefillMc * kPrefillRows) * kPrefillPanel;
void bf16_prefill_pack_x_avx2(const Bf16Gemm& g, float* a, int64_t p0, int64_t p1);
void bf16_prefill_cols_avx2(const Bf16Gemm& g, const float* a, float* scratch, int64_t n0, int64_t n1);

// Masked attention (attention_avx512.cpp): q [T, H, D] (rotated), k, v [S_max, Hkv, D] (cache
// layer), mask [T, S] bool -> out [T, H, D] contiguous; all bf16 or all fp32; D % 16 == 0 and
// D <= kMaxHeadDim.  attention_block_avx512 runs query rows [t0, t1) (at most kAttnRowBlock) of
// KV head g together, so that each K and V row the block attends is read from memory once;
// attention_items_avx2 runs work items [w0, w1) of T * Hkv (row t, KV head g = w % Hkv) with
// caller scratch idx (S int32) and scores (S * H / Hkv floats).
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kAttnRowBlock = 8;   // query rows per AVX-512 block
constexpr int64_t kAttnHeads = 16;     // query heads of a KV head one AVX-512 pass takes
constexpr int64_t kAttnSlotBlock = 32; // K or V rows widened at once (AVX-512)
// Caller scratch of attention_block_avx512, for rows = t1 - t0 and heads = min(H / Hkv, kAttnHeads).
// Words of AttnScratch.bits per row: S bits, and a word for the spill of the last 64-slot step.
inline int64_t attn_bit_words(int64_t S) { return S / 64 + 2; }
struct AttnScratch {
  int32_t* slots;  // [S]: the slots some row of the block attends, in slot order (the union list)
  uint64_t* bits;  // [rows][attn_bit_words(S)]: bit j of the row's words: the row attends union slot j
  float* q;        // [rows][heads][D]: the queries in fp32
  float* scores;   // [rows][heads][S]: per row and head, its attended slots' scores, then weights
  float* acc;      // [rows][heads][D]: the weighted V sums
  float* kv;       // [kAttnSlotBlock][D]: a block of K or V rows widened to fp32
};
struct AttnArgs {
  const void* q;
  int64_t q_ld_t, q_ld_h;  // element strides of q over tokens and heads
  const void* k;
  const void* v;
  int64_t kv_ld_s, kv_ld_h;  // element strides of k and v over slots and heads (same for both)
  const bool* mask;
  int64_t mask_ld;
  void* out;
  int64_t T, H, Hkv, D, S;
  bool bf16;
  float scale;
};
// Element offset of KV head g's row in compact slot j (idx: the slots the mask keeps).
inline int64_t slot_offset(const AttnArgs& a, const int32_t* idx, int64_t j, int64_t g) {
  return idx[j] * a.kv_ld_s + g * a.kv_ld_h;
}
// Slots ahead of the one being read whose K (score loop) or V row (sum loop) each attention path
// prefetches: a head's row sits kv_ld_s elements (512 bytes for 2 KV heads of 128 bf16) from the
// next slot's, and a 1-row decode at 3k contiguous slots spent most of its time waiting on them.
constexpr int64_t kKvPrefetchSlots = 64;
// Prefetches into L1 the `len` elements from column `col` of KV head g's row in compact slot
// j + kKvPrefetchSlots of the K or V cache layer `base`, where that slot is one of the n.
inline void prefetch_slot_ahead(const void* base, const AttnArgs& a, const int32_t* idx, int64_t n, int64_t j,
                                int64_t g, int64_t col, int64_t len) {
  if (j + kKvPrefetchSlots >= n) return;
  const int64_t esz = a.bf16 ? 2 : 4;
  const char* p = static_cast<const char*>(base) + (slot_offset(a, idx, j + kKvPrefetchSlots, g) + col) * esz;
  for (int64_t b = 0; b < len * esz; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}
// Row-wise ops (rowwise_avx512.cpp) on rows [r0, r1) of x [rows, ld] -> out [rows, ldo], bf16 or
// fp32 (esz bytes per element).  rms_norm: cols = hidden size, weight [cols] in the same dtype.
// silu_mul: x rows hold [gate | up], 2 * cols values; out rows hold cols values.
struct RowArgs {
  const void* x;
  int64_t ldx;
  void* out;
  int64_t ldo;
  int64_t cols;
  bool bf16;
  int64_t esz;
};
void rms_norm_rows_avx512(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1);
void silu_mul_rows_avx512(const RowArgs& a, int64_t r0, int64_t r1);
// Residual add, then RMSNorm (rowwise_avx512.cpp), rows [r0, r1): x <- x + d (rounded to the
// dtype), out <- rms_norm(x) * weight; x, d, out [rows, cols] with their own row strides.
struct AddNormArgs {
  void* x;
  int64_t ldx;
  const void* d;
  int64_t ldd;
  void* out;
  int64_t ldo;
  const void* weight;
  int64_t cols;
  float eps;
  bool bf16;
  int64_t esz;
};
void add_rms_norm_rows_avx512(const AddNormArgs& a, int64_t r0, int64_t r1);
// RoPE and cache store of one layer (rowwise_avx512.cpp), tokens [t0, t1): the packed qkv row
// [H + 2 Hkv heads of D] is split; q heads are rotated into q [T, H, D], k heads rotated into
// k_cache[slots[t]] and v heads copied to v_cache[slots[t]] (cache rows [Hkv, D], slot stride
// kv_ld_s).  cos, sin [T, D] rows hold HF's half-split tables (sin negated in the first half);
// rotation is x cos + rotate_half(x) sin with the dtype's rounding after each product and the sum.
struct RopeArgs {
  const void* qkv;
  int64_t ld_qkv;
  const void* cos;
  const void* sin;
  int64_t ld_cs;
  void* q;
  void* k_cache;
  void* v_cache;
  int64_t kv_ld_s;
  const int64_t* slots;
  int64_t H, Hkv, D;
  bool bf16;
  int64_t esz;
};
void rope_store_rows_avx512(const RopeArgs& a, int64_t t0, int64_t t1);

void attention_block_avx512(const AttnArgs& a, int64_t g, int64_t t0, int64_t t1, const AttnScratch& sc);
// The AVX2 twins (attention_avx2.cpp, rowwise_avx2.cpp): same results per row, own bits.
void attention_items_avx2(const AttnArgs& a, int64_t w0, int64_t w1, int32_t* idx, float* scores);
void rms_norm_rows_avx2(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1);
void silu_mul_rows_avx2(const RowArgs& a, int64_t r0, int64_t r1);
void add_rms_norm_rows_avx2(const AddNormArgs& a, int64_t r0, int64_t r1);
void rope_store_rows_avx2(const RopeArgs& a, int64_t t0, int64_t t1);
void bf16_cols_avx512(const Bf16Gemm& g, int64_t n0, int64_t n1);

}  // namespace swiftspec
