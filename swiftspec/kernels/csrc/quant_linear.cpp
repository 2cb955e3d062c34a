// Torch glue of the int8/int4 linear (kernels in qgemm_avx512.cpp and qgemm_avx2.cpp): argument
// checks, the ISA path, activation quantization and the thread split; and of the int4
// quantizer's search (int4_fit.cpp).
#include "glue.h"
#include "parallel.h"

namespace swiftspec {

at::Tensor bias_fp32(const c10::optional<at::Tensor>& bias, int64_t N, const char* op) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  TORCH_CHECK(bias->numel() == N, op, ": bias must have N elements");
  return bias->to(at::kFloat).contiguous();
}

void check_gguf_x(const at::Tensor& x, int64_t K, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(1) == K && x.stride(1) == 1,
              op, ": x must be a row-major [M, K] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op, ": x must be bfloat16 or float32");
}

void check_stream(const at::Tensor& t, at::ScalarType dt, int64_t numel, const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == dt && t.is_contiguous() && t.numel() == numel && t.device().is_cpu(),
              op, ": bad ", what, " (dtype, size or layout)");
}

// AVX-512 VNNI's vpdpbusd, AVX-VNNI's, else the AVX2 path (the AVX-512 level without VNNI too).
int64_t quant_linear_path(int64_t level) {
  return level >= kAvx512Vnni ? kAvx512Vnni : level == kAvx2Vnni ? kAvx2Vnni : level >= kAvx2 ? kAvx2 : kNoIsa;
}

namespace {

// Activation buffers.  Small batches reuse a per-calling-thread set (no allocation per call);
// large ones (prefill) get fresh buffers, so a long prompt does not pin memory afterwards.
constexpr int64_t kCachedRows = 64;
struct Scratch {
  std::vector<int8_t> xq;
  std::vector<uint8_t> xabs;
  std::vector<float> xs;
  std::vector<int32_t> xc;
};

ActQ quantize_activations(const at::Tensor& x, int64_t K, int64_t Kp, int blk, bool int4, int64_t isa,
                          Scratch& scratch) {
  const int64_t M = x.size(0), nb = Kp / blk;
  const ActQ a{sized(scratch.xq, M * Kp), isa != kAvx512Vnni ? sized(scratch.xabs, M * Kp) : nullptr,
               sized(scratch.xs, M * nb), sized(scratch.xc, M * nb), Kp, static_cast<int>(nb)};
  const ActIn in{x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), K, M, int4, blk};
  auto quantize = [&](int64_t p0, int64_t p1) {  // passes [p0, p1)
    const int64_t r0 = p0 * kPassRows, r1 = std::min(M, p1 * kPassRows);
    isa == kAvx512Vnni ? quantize_act_avx512(in, a, r0, r1) : quantize_act_avx2(in, a, r0, r1);
  };
  const int64_t passes = (M + kPassRows - 1) / kPassRows;
  if (passes == 1) {
    quantize(0, 1);
  } else {
    at::parallel_for(0, passes, 1, quantize);
  }
  return a;
}

void check_args(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& d,
                const at::Tensor& mn, bool int4, int64_t N, int64_t K, int64_t blk) {
  TORCH_CHECK(x.device().is_cpu() && q.device().is_cpu(), "quant_linear: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.stride(1) == 1, "quant_linear: x must be [M, K], row-major");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "quant_linear: x must be bfloat16 or float32");
  TORCH_CHECK(blk == 32 || blk == 64 || blk == 128, "quant_linear: block must be 32, 64 or 128");
  TORCH_CHECK(N > 0 && K > 0, "quant_linear: empty weight");
  const int64_t Kp = (K + blk - 1) / blk * blk, T = (N + kTileN - 1) / kTileN;
  TORCH_CHECK(q.scalar_type() == at::kByte && q.is_contiguous() && q.numel() == T * kTileN * Kp / (int4 ? 2 : 1),
              "quant_linear: the packed weight must be contiguous uint8 of the packed size");
  if (int4) {
    TORCH_CHECK(Kp == K && d.scalar_type() == at::kHalf && mn.scalar_type() == at::kHalf &&
                d.is_contiguous() && mn.is_contiguous() && d.numel() == T * kTileN * (K / blk) &&
                mn.numel() == d.numel(), "quant_linear: bad int4 scales/mins");
  } else {
    TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == T * kTileN,
                "quant_linear: bad int8 scales");
  }
}

}  // namespace

// y[M, N] = x[M, K] @ W^T (+ bias), W given in the packed format of swiftspec/kernels/quant.py.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                        const at::Tensor& d, const at::Tensor& mn, const c10::optional<at::Tensor>& bias,
                        bool int4, int64_t N, int64_t K, int64_t blk, int64_t level) {
  check_level(level, "quant_linear");
  check_args(x, q, scale, d, mn, int4, N, K, blk);
  const int64_t isa = quant_linear_path(level);
  const int64_t Kp = (K + blk - 1) / blk * blk, T = (N + kTileN - 1) / kTileN;
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  thread_local Scratch cached;
  Scratch fresh;
  const ActQ act = quantize_activations(x, K, Kp, static_cast<int>(blk), int4, isa,
                                        x.size(0) <= kCachedRows ? cached : fresh);
  const at::Tensor b32 = bias_fp32(bias, N, "quant_linear");
  const PackedW w{q.data_ptr<uint8_t>(),
                  int4 ? nullptr : scale.data_ptr<float>(),
                  int4 ? reinterpret_cast<const uint16_t*>(d.data_ptr()) : nullptr,
                  int4 ? reinterpret_cast<const uint16_t*>(mn.data_ptr()) : nullptr,
                  Kp, static_cast<int>(blk), int4};
  const OutSpec o{out.data_ptr(), b32.defined() ? b32.data_ptr<float>() : nullptr, x.size(0), N, N,
                  x.scalar_type() == at::kBFloat16};
  auto run = isa == kAvx512Vnni ? tiles_avx512 : isa == kAvx2Vnni ? tiles_avxvnni : tiles_avx2;
  parallel_chunks(T, T * Kp * x.size(0), [&](int64_t t0, int64_t t1) { run(act, w, o, t0, t1); });
  return out;
}

// The int4 quantizer's per-group fit (int4_fit.cpp): groups [G, n] fp32 -> [G, 2] fp32 (d, mn).
at::Tensor int4_fit(const at::Tensor& groups) {
  TORCH_CHECK(groups.device().is_cpu() && groups.scalar_type() == at::kFloat && groups.dim() == 2 &&
              groups.is_contiguous(), "int4_fit: groups must be a contiguous CPU float32 [G, n]");
  const int64_t G = groups.size(0), n = groups.size(1);
  TORCH_CHECK(n == 32 || n == 64 || n == 128, "int4_fit: groups of 32, 64 or 128 values");
  at::Tensor dm = at::empty({G, 2}, groups.options());
  const float* x = groups.data_ptr<float>();
  float* out = dm.data_ptr<float>();
  parallel_chunks(G, G * n * kInt4FitGrids, [&](int64_t g0, int64_t g1) { int4_fit_groups(x, g0, g1, static_cast<int>(n), out); });
  return dm;
}

}  // namespace swiftspec
