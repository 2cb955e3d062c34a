// Torch glue for the quantized linear kernels: argument checks, ISA dispatch, activation
// quantization and the thread split over output tiles.  The kernels live in qgemm_*.cpp.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>

#include "qgemm.h"

namespace swiftspec {
namespace {

// 0: no usable ISA, 1: AVX2 + FMA + F16C, 2: AVX-512 (F, BW, VL, DQ) + VNNI.
int64_t detect_isa() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  if (avx512) return 2;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  return avx2 ? 1 : 0;
}

int64_t pick_isa(int64_t requested) {
  const int64_t best = detect_isa();
  TORCH_CHECK(best > 0, "quant_linear: this CPU has neither AVX-512 VNNI nor AVX2/FMA/F16C");
  TORCH_CHECK(requested <= best, "quant_linear: requested ISA ", requested, " > supported ", best);
  return requested > 0 ? requested : best;
}

// Per-call activation buffers; they own the memory the ActQ view points into.
struct ActBuffers {
  at::Tensor xq, x16, xs, xsum;
  ActQ view;
};

ActBuffers quantize_activations(const at::Tensor& x, int64_t K, int64_t Kp, int blk, int64_t isa) {
  const int64_t M = x.size(0), nb = Kp / blk;
  ActBuffers b;
  b.xq = at::empty({M, Kp}, x.options().dtype(at::kChar));
  b.xs = at::empty({M, nb}, x.options().dtype(at::kFloat));
  b.xsum = at::empty({M, nb}, x.options().dtype(at::kInt));
  if (isa == 1) b.x16 = at::empty({M, Kp}, x.options().dtype(at::kShort));
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const int64_t esz = bf16 ? 2 : 4, ld = x.stride(0);
  const char* xp = static_cast<const char*>(x.data_ptr());
  int8_t* xq = b.xq.data_ptr<int8_t>();
  float* xs = b.xs.data_ptr<float>();
  int32_t* xsum = b.xsum.data_ptr<int32_t>();
  int16_t* x16 = isa == 1 ? b.x16.data_ptr<int16_t>() : nullptr;
  at::parallel_for(0, M, 4, [&](int64_t r0, int64_t r1) {
    const char* xr = xp + r0 * ld * esz;
    if (isa == 2) {
      quantize_act_avx512(xr, bf16, r1 - r0, K, ld, blk, Kp, xq + r0 * Kp, xs + r0 * nb, xsum + r0 * nb);
    } else {
      quantize_act_avx2(xr, bf16, r1 - r0, K, ld, blk, Kp, xq + r0 * Kp, xs + r0 * nb, xsum + r0 * nb,
                        x16 + r0 * Kp);
    }
  });
  b.view = ActQ{xq, x16, xs, xsum, Kp, static_cast<int>(nb)};
  return b;
}

void check_args(const at::Tensor& x, const at::Tensor& q, int64_t N, int64_t K, int64_t blk) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu(), "quant_linear: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.stride(1) == 1, "quant_linear: x must be [M, K], row-major");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "quant_linear: x must be bfloat16 or float32");
  TORCH_CHECK(blk == 32 || blk == 64 || blk == 128, "quant_linear: block must be 32, 64 or 128");
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous(), "quant_linear: packed weight must be contiguous uint8");
  TORCH_CHECK(N > 0 && K > 0, "quant_linear: empty weight");
}

}  // namespace

// y[M, N] = x[M, K] @ W^T (+ bias), W given in the packed format of swiftspec/kernels/quant.py.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                        const at::Tensor& d, const at::Tensor& mn, const c10::optional<at::Tensor>& bias,
                        bool int4, int64_t N, int64_t K, int64_t blk, int64_t isa_request) {
  check_args(x, q, N, K, blk);
  const int64_t isa = pick_isa(isa_request);
  const int64_t Kp = (K + blk - 1) / blk * blk, T = (N + kTileN - 1) / kTileN;
  TORCH_CHECK(q.numel() == T * kTileN * Kp / (int4 ? 2 : 1), "quant_linear: packed weight has the wrong size");
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  ActBuffers act = quantize_activations(x, K, Kp, static_cast<int>(blk), isa);
  at::Tensor b32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "quant_linear: bias must have N elements");
    b32 = bias->to(at::kFloat).contiguous();
  }
  const PackedW w{q.data_ptr<uint8_t>(),
                  int4 ? nullptr : scale.data_ptr<float>(),
                  int4 ? reinterpret_cast<const uint16_t*>(d.data_ptr()) : nullptr,
                  int4 ? reinterpret_cast<const uint16_t*>(mn.data_ptr()) : nullptr,
                  Kp, static_cast<int>(blk), int4};
  const OutSpec o{out.data_ptr(), b32.defined() ? b32.data_ptr<float>() : nullptr, x.size(0), N, N,
                  x.scalar_type() == at::kBFloat16};
  // Threads take chunks of tiles from a shared counter: a thread slowed down by a busy core
  // simply takes fewer chunks, and each chunk is one sequential stream of packed weights.
  const int64_t nthreads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t chunk = std::max<int64_t>(1, T / (nthreads * 8));
  std::atomic<int64_t> next{0};
  auto run = isa == 2 ? tiles_avx512 : tiles_avx2;
  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    for (int64_t t0 = next.fetch_add(chunk); t0 < T; t0 = next.fetch_add(chunk)) {
      run(act.view, w, o, t0, std::min(T, t0 + chunk));
    }
  });
  return out;
}

}  // namespace swiftspec

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quant_linear", &swiftspec::quant_linear, "quantized linear (int8/int4 weights)");
  m.def("detect_isa", &swiftspec::detect_isa, "0: none, 1: AVX2, 2: AVX-512 VNNI");
}
