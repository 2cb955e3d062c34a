// Fused CPU forward of a decoder stack for a few rows (decode, tree verification, draft expansion).
//
// One call runs every layer: RMSNorm, packed qkv linear, RoPE with the KV-cache store, masked
// attention, o_proj, residual add + RMSNorm, gate_up, SwiGLU activation, down, residual add +
// RMSNorm (the next layer's, or the final norm).  Between the kernels there is no Python and no
// ATen op but the allocation of each output: at a decode-sized call the unfused forward spends
// about as long dispatching ~20 ops per layer as the 0.5B draft spends reading its int4 weights.
// The kernels are the ones the model's torch code calls, in the same order with the same
// rounding, so the result equals the unfused forward's bit for bit.
#include <cmath>

#include "decoder.h"

namespace swiftspec {

at::Tensor PackedLinear::operator()(const at::Tensor& x, int64_t level) const {
  switch (fmt) {
    case 0: return bf16_linear(x, q, bias, level);
    case 3: case 4: case 6:
      return kquant_linear(x, q, qh, sc, mm, d, mn, bias, fmt == 3 ? 4 : fmt == 4 ? 6 : 5, N, K, level);
    case 5: case 7: case 8: return qblock_linear(x, q, qh, d, bias, fmt == 5 ? 8 : fmt == 7 ? 5 : 4, N, K, level);
    default: return quant_linear(x, q, scale, d, mn, bias, fmt == 2, N, K, blk, level);
  }
}

CpuDecoder::CpuDecoder(std::vector<Layer> layers, at::Tensor final_norm, double eps, int64_t heads,
                       int64_t kv_heads, int64_t head_dim, int64_t level)
    : layers_(std::move(layers)), final_norm_(std::move(final_norm)), eps_(static_cast<float>(eps)),
      H_(heads), Hkv_(kv_heads), D_(head_dim), level_(level) {
  check_level(level_, "CpuDecoder");
  TORCH_CHECK(attention_path(level_) != kNoIsa && rowwise_path(level_) != kNoIsa,
              "CpuDecoder: no attention or row-wise kernel at ISA level ", level_);
  TORCH_CHECK(!layers_.empty() && H_ % Hkv_ == 0 && D_ % 16 == 0 && D_ <= kMaxHeadDim, "CpuDecoder: shapes");
  for (const Layer& w : layers_) {
    TORCH_CHECK(w.input_norm.scalar_type() == final_norm_.scalar_type() &&
                    w.post_norm.scalar_type() == final_norm_.scalar_type() && w.input_norm.is_contiguous() &&
                    w.post_norm.is_contiguous() && final_norm_.is_contiguous(),
                "CpuDecoder: the RMSNorm weights must be contiguous and of one dtype");
  }
}

at::Tensor CpuDecoder::forward(const at::Tensor& x_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                               const at::Tensor& slots, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& mask) const {
  const CallArgs c{k_cache, v_cache, slots, cos, sin, mask};
  check(x_in, c);
  at::Tensor x = x_in.contiguous().clone();  // the residual stream, updated in place
  at::Tensor h = at::empty_like(x);           // its normed copy, each sublayer's input
  norm(x, layers_[0].input_norm, h);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    add_norm(x, w.o(attend(static_cast<int64_t>(l), w.qkv(h, level_), c), level_), w.post_norm, h);
    const at::Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
    add_norm(x, w.down(silu_mul(w.gate_up(h, level_), level_), level_), next_norm, h);
  }
  return h;
}

void CpuDecoder::check(const at::Tensor& x, const CallArgs& c) const {
  const auto dt = x.scalar_type();
  TORCH_CHECK((dt == at::kBFloat16 || dt == at::kFloat) && final_norm_.scalar_type() == dt,
              "CpuDecoder: bf16 or fp32 activations, in the RMSNorm weights' dtype");
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.size(0) <= kMaxSmallRows, "CpuDecoder: x must be [T <= 16, hidden]");
  const int64_t T = x.size(0), S_max = c.k_cache.size(1);
  TORCH_CHECK(c.k_cache.is_contiguous() && c.v_cache.is_contiguous() && c.k_cache.sizes() == c.v_cache.sizes() &&
                  c.k_cache.dim() == 4 && c.k_cache.size(0) == static_cast<int64_t>(layers_.size()) &&
                  c.k_cache.size(2) == Hkv_ && c.k_cache.size(3) == D_ && c.k_cache.scalar_type() == dt &&
                  c.v_cache.scalar_type() == dt,
              "CpuDecoder: the caches must be contiguous [layers, S_max, Hkv, D] in x's dtype");
  TORCH_CHECK(c.cos.scalar_type() == dt && c.sin.scalar_type() == dt && c.cos.size(0) == T && c.sin.size(0) == T &&
                  c.cos.size(1) == D_ && c.sin.size(1) == D_ && c.cos.stride(1) == 1 && c.sin.stride(1) == 1 &&
                  c.cos.stride(0) == c.sin.stride(0),
              "CpuDecoder: cos and sin must be [T, D] rows in x's dtype");
  TORCH_CHECK(c.mask.scalar_type() == at::kBool && c.mask.dim() == 2 && c.mask.size(0) == T &&
                  c.mask.stride(1) == 1 && c.mask.size(1) <= S_max,
              "CpuDecoder: mask must be [T, S <= S_max] bool");
  TORCH_CHECK(c.slots.scalar_type() == at::kLong && c.slots.is_contiguous() && c.slots.numel() == T,
              "CpuDecoder: slots must be [T] int64");
  const int64_t* s = c.slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(s[t] >= 0 && s[t] < S_max, "CpuDecoder: slot out of range");
}

// qkv [T, (H + 2 Hkv) D] -> attention output [T, H D] over cache layer l, after storing this
// call's rotated keys and values at the slots.
at::Tensor CpuDecoder::attend(int64_t l, const at::Tensor& qkv, const CallArgs& c) const {
  const int64_t T = qkv.size(0), esz = qkv.element_size();
  const bool bf16 = qkv.scalar_type() == at::kBFloat16;
  at::Tensor q = at::empty({T, H_, D_}, qkv.options());
  char* k = static_cast<char*>(c.k_cache.data_ptr()) + l * c.k_cache.stride(0) * esz;
  char* v = static_cast<char*>(c.v_cache.data_ptr()) + l * c.v_cache.stride(0) * esz;
  const RopeArgs r{qkv.data_ptr(), qkv.stride(0), c.cos.data_ptr(), c.sin.data_ptr(), c.cos.stride(0),
                   q.data_ptr(), k, v, c.k_cache.stride(1), c.slots.data_ptr<int64_t>(), H_, Hkv_, D_, bf16, esz};
  rope_store_rows(r, 0, T, level_);
  at::Tensor out = at::empty({T, H_ * D_}, qkv.options());
  run_attention({q.data_ptr(), H_ * D_, D_, k, v, c.k_cache.stride(1), c.k_cache.stride(2),
                 c.mask.data_ptr<bool>(), c.mask.stride(0), out.data_ptr(), T, H_, Hkv_, D_, c.mask.size(1), bf16,
                 1.f / std::sqrt(static_cast<float>(D_))},
                level_);
  return out;
}

// h <- rms_norm(x) * weight, row by row.
void CpuDecoder::norm(const at::Tensor& x, const at::Tensor& weight, at::Tensor& h) const {
  const int64_t n = x.size(1);
  const RowArgs a{x.data_ptr(), n, h.data_ptr(), n, n, x.scalar_type() == at::kBFloat16, x.element_size()};
  rms_norm_rows(a, weight.data_ptr(), eps_, 0, x.size(0), level_);
}

// x <- x + d (rounded to the dtype), then h <- rms_norm(x) * weight, row by row.
void CpuDecoder::add_norm(at::Tensor& x, const at::Tensor& d, const at::Tensor& weight, at::Tensor& h) const {
  const int64_t n = x.size(1);
  const AddNormArgs a{x.data_ptr(), n, d.data_ptr(), d.stride(0), h.data_ptr(), n, weight.data_ptr(), n, eps_,
                      x.scalar_type() == at::kBFloat16, x.element_size()};
  add_rms_norm_rows(a, 0, x.size(0), level_);
}

}  // namespace swiftspec
