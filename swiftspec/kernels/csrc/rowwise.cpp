// Torch glue of the row-wise kernels (rowwise_avx512.cpp, rowwise_avx2.cpp): RMSNorm, SwiGLU
// activation, and the dispatchers the fused decoder calls (residual add + RMSNorm, RoPE with the
// cache store).
#include "glue.h"
#include "parallel.h"

namespace swiftspec {
namespace {

void require(int64_t level, const char* what) {
  check_level(level, what);
  TORCH_CHECK(rowwise_path(level) != kNoIsa, what, ": no kernel at ISA level ", level);
}

// Shared checks of the row-wise ops: a 2-D CPU tensor of bf16 or fp32 with unit column stride.
void check_rows(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1, what, ": x must be a [rows, n] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, what, ": bf16 or fp32");
}

}  // namespace

int64_t rowwise_path(int64_t level) {
  return level >= kAvx512 ? kAvx512 : level >= kAvx2 ? kAvx2 : kNoIsa;
}

void rms_norm_rows(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1, int64_t level) {
  require(level, "rms_norm");
  if (rowwise_path(level) == kAvx2) {
    rms_norm_rows_avx2(a, weight, eps, r0, r1);
  } else {
    rms_norm_rows_avx512(a, weight, eps, r0, r1);
  }
}

void add_rms_norm_rows(const AddNormArgs& a, int64_t r0, int64_t r1, int64_t level) {
  require(level, "add_rms_norm");
  if (rowwise_path(level) == kAvx2) {
    add_rms_norm_rows_avx2(a, r0, r1);
  } else {
    add_rms_norm_rows_avx512(a, r0, r1);
  }
}

void rope_store_rows(const RopeArgs& a, int64_t t0, int64_t t1, int64_t level) {
  require(level, "rope_store");
  if (rowwise_path(level) == kAvx2) {
    rope_store_rows_avx2(a, t0, t1);
  } else {
    rope_store_rows_avx512(a, t0, t1);
  }
}

// out [rows, n] = x / rms(x) * weight, normalized in fp32 and rounded as the model's torch code.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t level) {
  require(level, "rms_norm");
  check_rows(x, "rms_norm");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == x.size(1),
              "rms_norm: weight must be [n] in x's dtype");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const RowArgs a{x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), x.size(1),
                  x.scalar_type() == at::kBFloat16, x.element_size()};
  parallel_rows(x.size(0), x.size(1), [&](int64_t r0, int64_t r1) {
    rms_norm_rows(a, weight.data_ptr(), static_cast<float>(eps), r0, r1, level);
  });
  return out;
}

// gate_up [rows, 2I] (gate columns first) -> silu(gate) * up [rows, I].
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t level) {
  require(level, "silu_mul");
  check_rows(gate_up, "silu_mul");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_mul: the row length must be even");
  const int64_t n = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), n}, gate_up.options());
  const RowArgs a{gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), n, n,
                  gate_up.scalar_type() == at::kBFloat16, gate_up.element_size()};
  const bool avx2 = rowwise_path(level) == kAvx2;
  parallel_rows(gate_up.size(0), n, [&](int64_t r0, int64_t r1) {
    if (avx2) {
      silu_mul_rows_avx2(a, r0, r1);
    } else {
      silu_mul_rows_avx512(a, r0, r1);
    }
  });
  return out;
}

}  // namespace swiftspec
