// GGUF K-quant super-blocks (Q4_K, Q5_K, Q6_K) repacked into the layout of kquant.h, losslessly:
// what kquant.py's numpy decode, widen and pack produce, byte for byte (tests/unit/test_gguf_kernels.py
// holds the two side by side), in one pass over the file's bytes.  Plain C++, one thread per call:
// pack_native_ packs several linears at once, and this call releases the GIL (bindings.cpp).
#include <ATen/ops/zeros.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "glue.h"
#include "kquant.h"

namespace swiftspec {
namespace {

// One super-block decoded: q [256] (0..63), sub-block scales and mins (8 of 32 k, or 16 of 16), the
// block scale d and dm as fp16 bits.
struct Block {
  uint8_t q[kSuperK];
  int8_t sc[16], mm[16];
  int nsub;
  uint16_t d, dm;
};

// Bytes of a super-block in the file: Q4_K, Q5_K, Q6_K.
int64_t block_bytes(int64_t bits) { return bits == 4 ? 144 : bits == 5 ? 176 : 210; }

uint16_t half_bits(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q4_K (144 bytes) and Q5_K (176: 32 bytes of fifth bits before the nibbles): d, dmin, 12 bytes of
// 6-bit scales and mins (gguf's get_scale_min), 128 bytes of nibbles (64-k chunk c: sub-block 2c low
// nibbles, 2c + 1 high).  dm = -dmin.
void decode_4or5(const uint8_t* blk, bool five, Block& out) {
  out.d = half_bits(blk);
  out.dm = half_bits(blk + 2) ^ 0x8000;
  const uint8_t *a = blk + 4, *b = blk + 8, *c = blk + 12;
  for (int j = 0; j < 4; ++j) {
    out.sc[j] = static_cast<int8_t>(a[j] & 63);
    out.sc[4 + j] = static_cast<int8_t>((c[j] & 15) | ((a[j] >> 2) & 48));
    out.mm[j] = static_cast<int8_t>(b[j] & 63);
    out.mm[4 + j] = static_cast<int8_t>((c[j] >> 4) | ((b[j] >> 2) & 48));
  }
  out.nsub = 8;
  const uint8_t* qs = blk + (five ? 48 : 16);
  for (int c4 = 0; c4 < 4; ++c4) {
    for (int l = 0; l < 32; ++l) {
      out.q[64 * c4 + l] = qs[32 * c4 + l] & 15;
      out.q[64 * c4 + 32 + l] = qs[32 * c4 + l] >> 4;
    }
  }
  if (five) {  // element l of sub-block j: bit j of qh[l]
    const uint8_t* qh = blk + 16;
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) out.q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
    }
  }
}

// Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, d.  w = d sc (q - 32):
// mm = sc, dm = -32 d (fp16; a block scale whose -32 d overflows fp16 is refused).
void decode_q6k(const uint8_t* blk, Block& out) {
  const uint8_t *ql = blk, *qh = blk + 128;
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < 64; ++m) {
      out.q[128 * h + m] = ql[64 * h + m] & 15;
      out.q[128 * h + 64 + m] = ql[64 * h + m] >> 4;
    }
    for (int quarter = 0; quarter < 4; ++quarter) {
      for (int l = 0; l < 32; ++l) out.q[128 * h + 32 * quarter + l] |= ((qh[32 * h + l] >> (2 * quarter)) & 3) << 4;
    }
  }
  std::memcpy(out.sc, blk + 192, 16);
  std::memcpy(out.mm, blk + 192, 16);
  out.nsub = 16;
  out.d = half_bits(blk + 208);
  const c10::Half d = c10::Half(out.d, c10::Half::from_bits());
  const c10::Half dm = c10::Half(static_cast<float>(d) * -32.0f);
  TORCH_CHECK(std::isfinite(static_cast<float>(dm)), "Q6_K block scale too large for the packed -32 d (fp16)");
  out.dm = dm.x;
}

// The packed streams (kquant.h) and their sizes in whole tiles.
struct Out {
  uint8_t *q, *qh;
  int8_t *sc, *mm;
  uint16_t *d, *dm;
  int64_t K, bits;
};

// Super-block b of channel `row` into the tiles (sub-blocks of 32 widened to 16 for a 6-bit weight).
void put(const Block& blk, int64_t row, int64_t b, const Out& o) {
  const int64_t t = row / kTileN, c = row % kTileN, K = o.K;
  const int64_t groups = K / 8;  // low nibbles: group g holds k = 8 g + 4 j + i in byte i, bits 4 j
  for (int g = 0; g < kSuperK / 8; ++g) {
    uint8_t* dst = o.q + ((t * groups + b * (kSuperK / 8) + g) * kTileN + c) * 4;
    for (int i = 0; i < 4; ++i) dst[i] = (blk.q[8 * g + i] & 15) | ((blk.q[8 * g + 4 + i] & 15) << 4);
  }
  if (o.bits != 4) {  // the high bits: width 2 (6-bit) or 1 (5-bit), k = 32 g / width + 4 f + i
    const int width = static_cast<int>(o.bits) - 4, nf = 8 / width, span = 4 * nf;
    const int64_t hgroups = K / span;
    for (int g = 0; g < kSuperK / span; ++g) {
      uint8_t* dst = o.qh + ((t * hgroups + b * (kSuperK / span) + g) * kTileN + c) * 4;
      for (int i = 0; i < 4; ++i) {
        uint8_t v = 0;
        for (int f = 0; f < nf; ++f) v |= static_cast<uint8_t>((blk.q[span * g + 4 * f + i] >> 4) << (width * f));
        dst[i] = v;
      }
    }
  }
  const int nsub = o.bits == 6 ? 16 : 8, widen = nsub / blk.nsub;  // 2: a Q4_K/Q5_K block in 6-bit tiles
  const int64_t pairs = K / kSuperK * nsub / 2;
  for (int s = 0; s < nsub; ++s) {
    const int64_t at = ((t * pairs + (b * nsub + s) / 2) * kTileN + c) * 2 + s % 2;
    o.sc[at] = blk.sc[s / widen];
    o.mm[at] = blk.mm[s / widen];
  }
  const int64_t at = (t * (K / kSuperK) + b) * kTileN + c;
  o.d[at] = blk.d;
  o.dm[at] = blk.dm;
}

}  // namespace

std::vector<at::Tensor> kquant_repack(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& part_bits,
                                      int64_t K, int64_t bits) {
  TORCH_CHECK(raws.size() == part_bits.size() && !raws.empty(), "kquant_repack: one bit width per part");
  TORCH_CHECK(K % kSuperK == 0 && bits >= 4 && bits <= 6, "kquant_repack: K a multiple of 256, bits 4..6");
  int64_t rows = 0;
  for (size_t p = 0; p < raws.size(); ++p) {
    const int64_t pb = part_bits[p], bytes = block_bytes(pb);
    TORCH_CHECK(pb >= 4 && pb <= bits, "kquant_repack: a part wider than bits");
    TORCH_CHECK(raws[p].scalar_type() == at::kByte && raws[p].is_contiguous() && raws[p].dim() == 2 &&
                    raws[p].size(1) == K / kSuperK * bytes,
                "kquant_repack: each part contiguous uint8 [rows, K / 256 * block bytes]");
    TORCH_CHECK(p + 1 == raws.size() || raws[p].size(0) % kTileN == 0, "kquant_repack: parts of 16-row multiples");
    rows += raws[p].size(0);
  }
  const int64_t T = (rows + kTileN - 1) / kTileN, nsub = K / (bits == 6 ? 16 : 32);
  const auto u8 = at::TensorOptions().dtype(at::kByte), i8 = u8.dtype(at::kChar), f16 = u8.dtype(at::kHalf);
  at::Tensor q = at::zeros({T, K / 8, kTileN, 4}, u8);
  at::Tensor qh = bits == 4 ? at::zeros({0}, u8) : at::zeros({T, K * (bits - 4) / 32, kTileN, 4}, u8);
  at::Tensor sc = at::zeros({T, nsub / 2, kTileN, 2}, i8), mm = at::zeros({T, nsub / 2, kTileN, 2}, i8);
  at::Tensor d = at::zeros({T, K / kSuperK, kTileN}, f16), dm = at::zeros({T, K / kSuperK, kTileN}, f16);
  const Out o{q.data_ptr<uint8_t>(), bits == 4 ? nullptr : qh.data_ptr<uint8_t>(), sc.data_ptr<int8_t>(),
              mm.data_ptr<int8_t>(), reinterpret_cast<uint16_t*>(d.data_ptr<at::Half>()),
              reinterpret_cast<uint16_t*>(dm.data_ptr<at::Half>()), K, bits};
  Block blk;
  int64_t row0 = 0;
  for (size_t p = 0; p < raws.size(); ++p) {
    const int64_t pb = part_bits[p], bytes = block_bytes(pb), n = raws[p].size(0);
    const uint8_t* src = raws[p].data_ptr<uint8_t>();
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < K / kSuperK; ++b) {
        const uint8_t* block = src + (r * (K / kSuperK) + b) * bytes;
        if (pb == 6) {
          decode_q6k(block, blk);
        } else {
          decode_4or5(block, pb == 5, blk);
        }
        put(blk, row0 + r, b, o);
      }
    }
    row0 += n;
  }
  return {q, qh, sc, mm, d, dm};
}

}  // namespace swiftspec
