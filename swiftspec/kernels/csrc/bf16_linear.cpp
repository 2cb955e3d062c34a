// Torch glue of the bf16 linear (kernels in bf16_gemm_avx512.cpp, bf16_gemm_avx2.cpp and
// bf16_prefill_avx2.cpp): argument checks, the ISA path, scratch buffers and the thread split
// over channel blocks.
#include "glue.h"
#include "parallel.h"

namespace swiftspec {

// Small M: AVX-512 BF16's vdpbf16ps, else the AVX2 FMA kernel.
int64_t bf16_linear_path(int64_t level) {
  return level >= kAvx512Bf16 ? kAvx512Bf16 : level >= kAvx2 ? kAvx2 : kNoIsa;
}

namespace {

void check_args(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "bf16_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16_linear: bf16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "bf16_linear: x [M, K], w [N, K]");
  TORCH_CHECK(x.stride(1) == 1 && w.stride(1) == 1, "bf16_linear: rows must be contiguous");
}

// Small M: one channel-block split; the AVX2 path first widens x into a per-calling-thread
// scratch (no allocation per call).
void small_m(const Bf16Gemm& g, int64_t path) {
  thread_local std::vector<float> split;
  const float* xs = nullptr;
  if (path == kAvx2) {
    float* s = sized(split, g.M * bf16_split_stride(g.K));
    bf16_split_rows_avx2(g, s);
    xs = s;
  }
  const int64_t C = path == kAvx2 ? bf16_block_channels_avx2(g.M) : bf16_block_channels(g.M);
  const int64_t blocks = (g.N + C - 1) / C;
  parallel_chunks(blocks, blocks * C * g.K * g.M / 16, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * C, n1 = std::min(g.N, b1 * C);
    path == kAvx2 ? bf16_cols_avx2(g, xs, n0, n1) : bf16_cols_avx512(g, n0, n1);
  });
}

// Large M (prefill): x widened and packed in passes of rows (a fresh buffer: a long prompt does not
// pin memory afterwards), then panels of channels in parallel, each thread with its own
// fixed-size scratch (accumulator tiles and a weight block).
void large_m(const Bf16Gemm& g) {
  const int64_t passes = (g.M + kPrefillRows - 1) / kPrefillRows;
  std::vector<float> a(passes * kPrefillRows * g.K);
  at::parallel_for(0, passes, 1, [&](int64_t p0, int64_t p1) { bf16_prefill_pack_x_avx2(g, a.data(), p0, p1); });
  const int64_t panels = (g.N + kPrefillPanel - 1) / kPrefillPanel;
  parallel_chunks(panels, panels * g.K * g.M, [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> s(kPrefillScratch);
    bf16_prefill_cols_avx2(g, a.data(), s.data(), p0 * kPrefillPanel, std::min(g.N, p1 * kPrefillPanel));
  });
}

}  // namespace

// out [M, N] = x [M, K] @ w^T (+ bias), bf16 x and w (w row-major [N, K], e.g. an embedding
// shared with the LM head).  Up to kMaxSmallRows rows run the level's small-M kernel (each row's
// result independent of the others); more rows run the AVX2 prefill GEMM (any level).
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       int64_t level) {
  check_level(level, "bf16_linear");
  const int64_t path = bf16_linear_path(level);
  TORCH_CHECK(path != kNoIsa, "bf16_linear: no kernel at ISA level ", level);
  check_args(x, w);
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  const at::Tensor b32 = bias_fp32(bias, N, "bf16_linear");
  const Bf16Gemm g{reinterpret_cast<const uint16_t*>(x.data_ptr()), x.stride(0),
                   reinterpret_cast<const uint16_t*>(w.data_ptr()), w.stride(0),
                   b32.defined() ? b32.data_ptr<float>() : nullptr,
                   reinterpret_cast<uint16_t*>(out.data_ptr()), N, M, N, K};
  if (M <= kMaxSmallRows) {
    small_m(g, path);
  } else {
    large_m(g);
  }
  return out;
}

}  // namespace swiftspec
