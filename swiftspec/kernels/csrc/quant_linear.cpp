// Torch glue for the CPU kernels: argument checks, ISA dispatch, activation quantization and the
// thread splits.  The kernels live in qgemm_*.cpp (int8/int4 linear), bf16_gemm_avx512.cpp (bf16
// linear), attention_avx512.cpp (layout-invariant masked attention) and rowwise_avx512.cpp
// (RMSNorm, SwiGLU activation).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "glue.h"
#include "qgemm.h"

namespace swiftspec {
namespace {

// Below this many (tile x K x row) steps, waking the thread pool costs more than it saves.
constexpr int64_t kSerialWork = 1 << 15;

}  // namespace

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

namespace {

int64_t pick_isa(int64_t requested) {
  static const int64_t best = detect_isa();
  TORCH_CHECK(best > 0, "quant_linear: this CPU has neither AVX-512 VNNI nor AVX2/FMA/F16C");
  TORCH_CHECK(requested <= best, "quant_linear: requested ISA ", requested, " > supported ", best);
  return requested > 0 ? requested : best;
}

// Activation buffers.  Small batches reuse a per-calling-thread set (no allocation per call);
// large ones (prefill) get fresh buffers, so a long prompt does not pin memory afterwards.
constexpr int64_t kCachedRows = 64;
struct Scratch {
  std::vector<int8_t> xq;
  std::vector<int16_t> x16;
  std::vector<float> xs;
  std::vector<int32_t> xc;
};

template <typename T>
T* sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

ActQ quantize_activations(const at::Tensor& x, int64_t K, int64_t Kp, int blk, bool int4, int64_t isa,
                          Scratch& scratch) {
  const int64_t M = x.size(0), nb = Kp / blk;
  const ActQ a{sized(scratch.xq, M * Kp), isa == 1 ? sized(scratch.x16, M * Kp) : nullptr,
               sized(scratch.xs, M * nb), sized(scratch.xc, M * nb), Kp, static_cast<int>(nb)};
  const ActIn in{x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), K, M, int4, blk};
  auto quantize = [&](int64_t p0, int64_t p1) {  // passes [p0, p1)
    const int64_t r0 = p0 * kPassRows, r1 = std::min(M, p1 * kPassRows);
    isa == 2 ? quantize_act_avx512(in, a, r0, r1) : quantize_act_avx2(in, a, r0, r1);
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

// Runs fn(u0, u1) over units [0, n): threads take chunks from a shared counter, so a thread slowed
// down by a busy core simply takes fewer chunks, and each chunk is one sequential weight stream.
// Below kSerialWork, waking the thread pool costs more than it saves.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t work, const Fn& fn) {
  const int64_t nthreads = std::max<int64_t>(1, at::get_num_threads());
  if (nthreads == 1 || work < kSerialWork) {
    fn(0, n);
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, n / (nthreads * 8));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    for (int64_t u0 = next.fetch_add(chunk); u0 < n; u0 = next.fetch_add(chunk)) fn(u0, std::min(n, u0 + chunk));
  });
}

}  // namespace

// AVX-512 (F, BW, VL, DQ + VNNI), detected once: the attention and row-wise kernels need it.
bool has_avx512() {
  static const bool ok = detect_isa() == 2;
  return ok;
}

// y[M, N] = x[M, K] @ W^T (+ bias), W given in the packed format of swiftspec/kernels/quant.py.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                        const at::Tensor& d, const at::Tensor& mn, const c10::optional<at::Tensor>& bias,
                        bool int4, int64_t N, int64_t K, int64_t blk, int64_t isa_request) {
  check_args(x, q, scale, d, mn, int4, N, K, blk);
  const int64_t isa = pick_isa(isa_request);
  const int64_t Kp = (K + blk - 1) / blk * blk, T = (N + kTileN - 1) / kTileN;
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  thread_local Scratch cached;
  Scratch fresh;
  const ActQ act = quantize_activations(x, K, Kp, static_cast<int>(blk), int4, isa,
                                        x.size(0) <= kCachedRows ? cached : fresh);
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
  auto run = isa == 2 ? tiles_avx512 : tiles_avx2;
  parallel_chunks(T, T * Kp * x.size(0), [&](int64_t t0, int64_t t1) { run(act, w, o, t0, t1); });
  return out;
}

bool has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bf16");
}

// out [M, N] = x [M, K] @ w^T (+ bias), bf16 x and w (w row-major [N, K], e.g. an embedding
// shared with the LM head), at most kMaxBf16Rows rows; see bf16_gemm_avx512.cpp.
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  static const bool ok = has_bf16();
  TORCH_CHECK(ok, "bf16_linear: this CPU lacks AVX-512 BF16");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "bf16_linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16_linear: bf16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "bf16_linear: x [M, K], w [N, K]");
  TORCH_CHECK(x.stride(1) == 1 && w.stride(1) == 1, "bf16_linear: rows must be contiguous");
  TORCH_CHECK(x.size(0) <= kMaxBf16Rows, "bf16_linear: at most ", kMaxBf16Rows, " rows");
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

// out [T, H, D] = softmax(q k^T * scale, masked) v over slots [0, S) of a cache layer; see
// attention_avx512.cpp for the numerics.  Rows of T run in parallel per KV head.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  TORCH_CHECK(has_avx512(), "masked_attention: needs AVX-512");
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
                 q.scalar_type() == at::kBFloat16, static_cast<float>(scale)});
  return out;
}

void run_attention(const AttnArgs& a) {
  at::parallel_for(0, a.T * a.Hkv, 1, [&](int64_t w0, int64_t w1) {
    thread_local std::vector<int32_t> idx;
    thread_local std::vector<float> scores;
    attention_items_avx512(a, w0, w1, sized(idx, a.S), sized(scores, a.S * (a.H / a.Hkv)));
  });
}

// Shared checks of the row-wise ops: a 2-D CPU tensor of bf16 or fp32 with unit column stride.
void check_rows(const at::Tensor& x, const char* what) {
  TORCH_CHECK(has_avx512(), what, ": needs AVX-512");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1, what, ": x must be a [rows, n] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, what, ": bf16 or fp32");
}

template <typename Fn>
void parallel_rows(int64_t rows, int64_t cols, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, kSerialWork / std::max<int64_t>(1, cols));
  at::parallel_for(0, rows, grain, fn);  // runs inline below one grain (decode-sized calls)
}

// out [rows, n] = x / rms(x) * weight, normalized in fp32 and rounded as the model's torch code.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, "rms_norm");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == x.size(1),
              "rms_norm: weight must be [n] in x's dtype");
  at::Tensor out = at::empty(x.sizes(), x.options());
  const RowArgs a{x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), x.size(1),
                  x.scalar_type() == at::kBFloat16, x.element_size()};
  parallel_rows(x.size(0), x.size(1), [&](int64_t r0, int64_t r1) {
    rms_norm_rows_avx512(a, weight.data_ptr(), static_cast<float>(eps), r0, r1);
  });
  return out;
}

// gate_up [rows, 2I] (gate columns first) -> silu(gate) * up [rows, I].
at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "silu_mul");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "silu_mul: the row length must be even");
  const int64_t n = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), n}, gate_up.options());
  const RowArgs a{gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), n, n,
                  gate_up.scalar_type() == at::kBFloat16, gate_up.element_size()};
  parallel_rows(gate_up.size(0), n, [&](int64_t r0, int64_t r1) { silu_mul_rows_avx512(a, r0, r1); });
  return out;
}

}  // namespace swiftspec

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quant_linear", &swiftspec::quant_linear, "quantized linear (int8/int4 weights)");
  m.def("detect_isa", &swiftspec::detect_isa, "0: none, 1: AVX2, 2: AVX-512 VNNI");
  m.def("bf16_linear", &swiftspec::bf16_linear, "bf16 linear at small M (AVX-512 BF16)");
  m.def("has_bf16", &swiftspec::has_bf16, "AVX-512 BF16 is available");
  m.def("masked_attention", &swiftspec::masked_attention, "layout-invariant masked attention (AVX-512)");
  m.def("rms_norm", &swiftspec::rms_norm, "RMSNorm with the model's rounding (AVX-512)");
  m.def("silu_mul", &swiftspec::silu_mul, "SwiGLU activation silu(gate) * up (AVX-512)");
  swiftspec::register_decoder(m);
}
