// Torch glue of the layout-invariant masked attention (kernels in attention_avx512.cpp and
// attention_avx2.cpp).
#include "glue.h"
#include "parallel.h"

namespace swiftspec {

int64_t attention_path(int64_t level) {
  return level >= kAvx512 ? kAvx512 : level >= kAvx2 ? kAvx2 : kNoIsa;
}

// Query rows per AVX-512 block: up to kAttnRowBlock, fewer where more blocks would keep more
// threads busy (a block runs on one thread).
int64_t rows_per_block(const AttnArgs& a) {
  const int64_t per_head = (at::get_num_threads() + a.Hkv - 1) / a.Hkv;  // blocks per KV head for every thread
  const int64_t blocks = std::min(a.T, std::max(per_head, (a.T + kAttnRowBlock - 1) / kAttnRowBlock));
  return (a.T + blocks - 1) / blocks;
}

void run_attention(const AttnArgs& a, int64_t level) {
  const int64_t path = attention_path(level);
  TORCH_CHECK(path != kNoIsa, "attention: no kernel at ISA level ", level);
  if (path == kAvx2) {
    at::parallel_for(0, a.T * a.Hkv, 1, [&](int64_t w0, int64_t w1) {
      thread_local std::vector<int32_t> idx;
      thread_local std::vector<float> scores;
      attention_items_avx2(a, w0, w1, sized(idx, a.S), sized(scores, a.S * (a.H / a.Hkv)));
    });
    return;
  }
  const int64_t rows = rows_per_block(a), blocks = (a.T + rows - 1) / rows;
  const int64_t heads = std::min(a.H / a.Hkv, kAttnHeads);
  at::parallel_for(0, a.Hkv * blocks, 1, [&](int64_t w0, int64_t w1) {
    thread_local std::vector<int32_t> slots;
    thread_local std::vector<uint64_t> bits;
    thread_local std::vector<float> floats;
    const int64_t qd = rows * heads * a.D, sd = (rows * heads * a.S + 15) / 16 * 16;  // 64-byte multiples
    float* f = sized(floats, 2 * qd + sd + kAttnSlotBlock * a.D + 16);
    float* const aligned = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(f) + 63) & ~uintptr_t{63});
    const AttnScratch sc{sized(slots, a.S), sized(bits, rows * attn_bit_words(a.S)), aligned, aligned + 2 * qd,
                         aligned + qd, aligned + 2 * qd + sd};
    for (int64_t w = w0; w < w1; ++w) {  // work item w = (KV head g, block b of rows)
      const int64_t g = w / blocks, t0 = (w % blocks) * rows;
      attention_block_avx512(a, g, t0, std::min(a.T, t0 + rows), sc);
    }
  });
}

// out [T, H, D] = softmax(q k^T * scale, masked) v over slots [0, S) of a cache layer; see
// attention_avx512.cpp for the numerics.  Rows of T run in parallel per KV head.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale, int64_t level) {
  check_level(level, "masked_attention");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && mask.dim() == 2, "masked_attention: bad ranks");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), S = mask.size(1);
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
              (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat), "masked_attention: bf16 or fp32");
  TORCH_CHECK(D % 16 == 0 && D <= kMaxHeadDim && k.size(2) == D && v.sizes() == k.sizes() && H % Hkv == 0,
              "masked_attention: shapes");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.strides() == k.strides(), "masked_attention: strides");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.size(0) == T && mask.stride(1) == 1 && S <= k.size(0),
              "masked_attention: mask must be [T, S] bool with S <= cache length");
  at::Tensor out = at::empty({T, H, D}, q.options());
  run_attention({q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1),
                 mask.data_ptr<bool>(), mask.stride(0), out.data_ptr(), T, H, Hkv, D, S,
                 q.scalar_type() == at::kBFloat16, static_cast<float>(scale)},
                level);
  return out;
}

}  // namespace swiftspec
