// Torch glue of the K-quant linear (GGUF Q4_K / Q6_K super-blocks; kernels in kquant_avx512.cpp
// and kquant_avx2.cpp): argument checks, activation quantization and the thread split.
#include <cmath>
#include <cstring>

#include "glue.h"
#include "kquant.h"
#include "parallel.h"

namespace swiftspec {
namespace {

struct KScratch {
  std::vector<int8_t> xq;
  std::vector<float> xs;
  std::vector<int16_t> xsum;
};

template <typename T>
float value(const T* x, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return x[i];
  const uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(x)[i]) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// One row, super-blocks of 256: scale = amax / 127, q = round_half_even(x * (127 / amax)) (two
// IEEE fp32 operations, as quant.quantize_act_ref does them); xsum per sub-block of `sub` values.
// Plain scalar code: the same bits at every ISA level.  |x * inv| <= 127 (+ rounding), and adding
// then subtracting 1.5 * 2^23 rounds such a value to an integer, half to even, in the default
// rounding mode (baseline x86-64 has no roundss; nearbyintf would be a libm call per value).
constexpr float kRound = 12582912.f;  // 1.5 * 2^23

template <typename T>
void quantize_row(const T* x, int64_t K, int sub, int8_t* q, float* xs, int16_t* xsum) {  // q: [K]
  for (int64_t b = 0; b < K / kSuperK; ++b) {
    const int64_t k0 = b * kSuperK;
    float amax = 0.f;
    for (int i = 0; i < kSuperK; ++i) amax = std::max(amax, std::fabs(value(x, k0 + i)));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int i = 0; i < kSuperK; ++i) {
      const float v = (value(x, k0 + i) * inv + kRound) - kRound;
      q[k0 + i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
    xs[b] = amax / 127.f;
  }
  for (int64_t j = 0; j < K / sub; ++j) {
    int32_t s = 0;
    for (int i = 0; i < sub; ++i) s += q[j * sub + i];
    xsum[j] = static_cast<int16_t>(s);
  }
}

// Row r of xq in the pass layout of kquant.h.
void interleave(const int8_t* q, int64_t K, int64_t M, int pass, int64_t r, int8_t* xq) {
  const int64_t p0 = r / pass * pass, R = std::min<int64_t>(pass, M - p0);
  int8_t* dst = xq + p0 * K + (r - p0) * 4;
  for (int64_t g = 0; g < K / 4; ++g) std::memcpy(dst + g * R * 4, q + g * 4, 4);
}

KAct quantize(const at::Tensor& x, int64_t K, int sub, int pass, KScratch& s) {
  const int64_t M = x.size(0);
  int8_t* xq = sized(s.xq, M * K);
  float* xs = sized(s.xs, M * (K / kSuperK));
  int16_t* xsum = sized(s.xsum, M * (K / sub));
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const char* base = static_cast<const char*>(x.data_ptr());
  const int64_t ld = x.stride(0) * (bf16 ? 2 : 4);
  at::parallel_for(0, M, std::max<int64_t>(1, kSerialWork / K), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<int8_t> row;
    int8_t* q = sized(row, K);
    for (int64_t r = r0; r < r1; ++r) {
      float* scale = xs + r * (K / kSuperK);
      int16_t* sums = xsum + r * (K / sub);
      if (bf16) {
        quantize_row(reinterpret_cast<const at::BFloat16*>(base + r * ld), K, sub, q, scale, sums);
      } else {
        quantize_row(reinterpret_cast<const float*>(base + r * ld), K, sub, q, scale, sums);
      }
      interleave(q, K, M, pass, r, xq);
    }
  });
  return KAct{xq, xs, xsum, K};
}

void check(const at::Tensor& t, at::ScalarType dt, int64_t numel, const char* what) {
  TORCH_CHECK(t.scalar_type() == dt && t.is_contiguous() && t.numel() == numel && t.device().is_cpu(),
              "kquant_linear: bad ", what, " (dtype, size or layout)");
}

}  // namespace

// y[M, N] = x[M, K] @ W^T (+ bias), W packed as in swiftspec/kernels/quant.py (fmt q4k / q6k).
at::Tensor kquant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& qh, const at::Tensor& sc,
                         const at::Tensor& mm, const at::Tensor& d, const at::Tensor& dm,
                         const c10::optional<at::Tensor>& bias, int64_t bits, int64_t N, int64_t K, int64_t level) {
  check_level(level, "kquant_linear");
  TORCH_CHECK(bits == 4 || bits == 6, "kquant_linear: bits must be 4 or 6");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(1) == K && x.stride(1) == 1,
              "kquant_linear: x must be a row-major [M, K] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "kquant_linear: x must be bfloat16 or float32");
  TORCH_CHECK(N > 0 && K > 0 && K % kSuperK == 0, "kquant_linear: K must be a positive multiple of 256");
  const int sub = ksub(static_cast<int>(bits));
  const int64_t T = (N + kTileN - 1) / kTileN, TN = T * kTileN;
  check(q, at::kByte, TN * K / 2, "q");
  if (bits == 6) check(qh, at::kByte, TN * K / 4, "qh");
  check(sc, at::kChar, TN * K / sub, "sc");
  check(mm, at::kChar, TN * K / sub, "mm");
  check(d, at::kHalf, TN * K / kSuperK, "d");
  check(dm, at::kHalf, TN * K / kSuperK, "dm");
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  thread_local KScratch cached;
  KScratch fresh;
  const bool avx512 = quant_linear_path(level) == kAvx512Vnni;
  const KAct act = quantize(x, K, sub, avx512 ? kPassAvx512 : kPassAvx2, x.size(0) <= kMaxSmallRows ? cached : fresh);
  at::Tensor b32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "kquant_linear: bias must have N elements");
    b32 = bias->to(at::kFloat).contiguous();
  }
  const KWeight w{q.data_ptr<uint8_t>(), bits == 6 ? qh.data_ptr<uint8_t>() : nullptr, sc.data_ptr<int8_t>(),
                  mm.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr()),
                  reinterpret_cast<const uint16_t*>(dm.data_ptr()), static_cast<int>(bits)};
  const OutSpec o{out.data_ptr(), b32.defined() ? b32.data_ptr<float>() : nullptr, x.size(0), N, N,
                  x.scalar_type() == at::kBFloat16};
  auto run = avx512 ? ktiles_avx512 : ktiles_avx2;
  parallel_chunks(T, T * K * x.size(0), [&](int64_t t0, int64_t t1) { run(act, w, o, t0, t1); });
  return out;
}

}  // namespace swiftspec
