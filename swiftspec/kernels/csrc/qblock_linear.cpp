// Torch glue of the GGUF block linear (Q8_0 / Q5_0 / Q4_0 blocks as stored; kernel in
// qblock_avx2.cpp): argument checks, activation quantization (the int8 linear's AVX2 quantizer,
// blocks of 32) and the thread split.
#include "glue.h"
#include "parallel.h"
#include "qblock.h"

namespace swiftspec {

// The AVX2 path at every level (qblock_avx2.cpp says why; its bits are every path's bits).  The
// K-quant linear's 5-bit weights (Q5_K) follow the same rule.
int64_t qblock_linear_path(int64_t level) { return level >= kAvx2 ? kAvx2 : kNoIsa; }

namespace {

struct QScratch {
  std::vector<int8_t> xq;
  std::vector<uint8_t> xabs;  // filled by the quantizer, unused here
  std::vector<float> xs;
  std::vector<int32_t> xc;
};

ActQ quantize(const at::Tensor& x, int64_t K, QScratch& s) {
  const int64_t M = x.size(0), nb = K / kQBlock;
  const ActQ a{sized(s.xq, M * K), sized(s.xabs, M * K), sized(s.xs, M * nb), sized(s.xc, M * nb), K,
               static_cast<int>(nb)};
  const ActIn in{x.data_ptr(), x.scalar_type() == at::kBFloat16, x.stride(0), K, M, false, kQBlock};
  parallel_rows(M, K, [&](int64_t r0, int64_t r1) { quantize_act_avx2(in, a, r0, r1); });
  return a;
}

}  // namespace

// y[M, N] = x[M, K] @ W^T (+ bias), W packed as in swiftspec/kernels/qblock.py (bits 8, 5 or 4).
at::Tensor qblock_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& qh, const at::Tensor& d,
                         const c10::optional<at::Tensor>& bias, int64_t bits, int64_t N, int64_t K, int64_t level) {
  check_level(level, "qblock_linear");
  TORCH_CHECK(bits == 8 || bits == 5 || bits == 4, "qblock_linear: bits must be 8, 5 or 4");
  check_gguf_x(x, K, "qblock_linear");
  TORCH_CHECK(N > 0 && K > 0 && K % kQBlock == 0, "qblock_linear: K must be a positive multiple of 32");
  const int64_t T = (N + kTileN - 1) / kTileN, TN = T * kTileN;
  check_stream(q, at::kByte, bits == 8 ? TN * K : TN * K / 2, "qblock_linear", "q");
  if (bits == 5) check_stream(qh, at::kByte, TN * K / 8, "qblock_linear", "qh");
  check_stream(d, at::kHalf, TN * K / kQBlock, "qblock_linear", "d");
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  thread_local QScratch cached;
  QScratch fresh;
  const ActQ act = quantize(x, K, x.size(0) <= kMaxSmallRows ? cached : fresh);
  const at::Tensor b32 = bias_fp32(bias, N, "qblock_linear");
  const QBlockW w{q.data_ptr<uint8_t>(), bits == 5 ? qh.data_ptr<uint8_t>() : nullptr,
                  reinterpret_cast<const uint16_t*>(d.data_ptr()), K, static_cast<int>(bits)};
  const OutSpec o{out.data_ptr(), b32.defined() ? b32.data_ptr<float>() : nullptr, x.size(0), N, N,
                  x.scalar_type() == at::kBFloat16};
  parallel_chunks(T, T * K * x.size(0), [&](int64_t t0, int64_t t1) { qblock_tiles_avx2(act, w, o, t0, t1); });
  return out;
}

}  // namespace swiftspec
