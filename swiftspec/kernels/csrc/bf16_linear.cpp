// Torch glue of the small-M bf16 linear (kernel in bf16_gemm_avx512.cpp): argument checks, the ISA
// path and the thread split over channel blocks.
#include "glue.h"
#include "parallel.h"

namespace swiftspec {

int64_t bf16_linear_path(int64_t level) {
  return level >= kAvx512Bf16 ? kAvx512Bf16 : kNoIsa;
}

// out [M, N] = x [M, K] @ w^T (+ bias), bf16 x and w (w row-major [N, K], e.g. an embedding
// shared with the LM head), at most kMaxSmallRows rows.
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       int64_t level) {
  check_level(level, "bf16_linear");
  const int64_t path = bf16_linear_path(level);
  TORCH_CHECK(path != kNoIsa, "bf16_linear: no kernel at ISA level ", level);
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "bf16_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16_linear: bf16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "bf16_linear: x [M, K], w [N, K]");
  TORCH_CHECK(x.stride(1) == 1 && w.stride(1) == 1, "bf16_linear: rows must be contiguous");
  TORCH_CHECK(x.size(0) <= kMaxSmallRows, "bf16_linear: at most ", kMaxSmallRows, " rows");
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  at::Tensor b32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "bf16_linear: bias must have N elements");
    b32 = bias->to(at::kFloat).contiguous();
  }
  const Bf16Gemm g{reinterpret_cast<const uint16_t*>(x.data_ptr()), x.stride(0),
                   reinterpret_cast<const uint16_t*>(w.data_ptr()), w.stride(0),
                   b32.defined() ? b32.data_ptr<float>() : nullptr,
                   reinterpret_cast<uint16_t*>(out.data_ptr()), N, M, N, K};
  const int64_t C = bf16_block_channels(M), blocks = (N + C - 1) / C;
  parallel_chunks(blocks, blocks * C * K * M / 16, [&](int64_t b0, int64_t b1) {
    bf16_cols_avx512(g, b0 * C, std::min(N, b1 * C));
  });
  return out;
}

}  // namespace swiftspec
