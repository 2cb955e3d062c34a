// GGUF Q8_0 / Q5_0 / Q4_0 blocks -> the dense weight: w[k] = d * q[k] per block of 32 k (exact in
// fp32, the product gguf.quants.dequantize forms), rounded once to the output dtype: the values of
// qblock.py's numpy decode, bit for bit (tests/unit/test_gguf_kernels.py holds the two side by
// side).  Rows in parallel; the caller releases the GIL (bindings.cpp).
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>

#include "glue.h"

namespace swiftspec {
namespace {

constexpr int64_t kBlock = 32;

// Bytes of a block in the file: d (fp16), then Q8_0 32 int8; Q5_0 4 bytes of fifth bits and 16 of
// nibbles; Q4_0 16 of nibbles.
int64_t block_bytes(int64_t bits) { return bits == 8 ? 34 : bits == 5 ? 22 : 18; }

// One block's signed q [32]: element l < 16 is the low nibble of byte l, else the high nibble of
// byte l - 16; Q5_0's bit 4 of element l is bit l of the little-endian 32-bit qh.
void block_q(const uint8_t* blk, int64_t bits, float* q) {
  if (bits == 8) {
    for (int l = 0; l < kBlock; ++l) q[l] = static_cast<int8_t>(blk[2 + l]);
    return;
  }
  const uint8_t* qs = blk + block_bytes(bits) - 16;
  uint32_t qh = 0;
  if (bits == 5) std::memcpy(&qh, blk + 2, 4);
  const int offset = bits == 5 ? 16 : 8;
  for (int l = 0; l < 16; ++l) {
    const int lo = (qs[l] & 15) | static_cast<int>(((qh >> l) & 1u) << 4);
    const int hi = (qs[l] >> 4) | static_cast<int>(((qh >> (l + 16)) & 1u) << 4);
    q[l] = static_cast<float>(lo - offset);
    q[l + 16] = static_cast<float>(hi - offset);
  }
}

template <typename T>
void dequant_rows(const uint8_t* raw, int64_t row_bytes, int64_t bits, int64_t K, T* out, int64_t r0, int64_t r1) {
  float q[kBlock];
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const uint8_t* blk = raw + r * row_bytes + b * block_bytes(bits);
      uint16_t h;
      std::memcpy(&h, blk, 2);
      const float d = static_cast<float>(c10::Half(h, c10::Half::from_bits()));
      block_q(blk, bits, q);
      T* o = out + r * K + b * kBlock;
      for (int l = 0; l < kBlock; ++l) o[l] = static_cast<T>(d * q[l]);
    }
  }
}

}  // namespace

at::Tensor qblock_dequantize(const at::Tensor& raw, int64_t bits, at::ScalarType dtype) {
  TORCH_CHECK(bits == 8 || bits == 5 || bits == 4, "qblock_dequantize: bits must be 8, 5 or 4");
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.is_contiguous() && raw.device().is_cpu() &&
                  raw.size(1) % block_bytes(bits) == 0,
              "qblock_dequantize: raw must be contiguous uint8 [rows, whole blocks]");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "qblock_dequantize: dtype must be float32, bfloat16 or float16");
  const int64_t rows = raw.size(0), row_bytes = raw.size(1), K = row_bytes / block_bytes(bits) * kBlock;
  at::Tensor out = at::empty({rows, K}, raw.options().dtype(dtype));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    if (dtype == at::kFloat) {
      dequant_rows(src, row_bytes, bits, K, out.data_ptr<float>(), r0, r1);
    } else if (dtype == at::kBFloat16) {
      dequant_rows(src, row_bytes, bits, K, out.data_ptr<c10::BFloat16>(), r0, r1);
    } else {
      dequant_rows(src, row_bytes, bits, K, out.data_ptr<c10::Half>(), r0, r1);
    }
  });
  return out;
}

}  // namespace swiftspec
