// The int4 weight quantizer (quant.py quantize_int4): a dense [N, K] weight -> the packed int4
// layout the linear kernels read, in one pass per tile of 16 channels.  Each group's (d, mn) is
// int4_fit.cpp's search, rounded to fp16; each value q = clamp(round((x - mn) / d), 0, 15) in fp32
// (round half to even; q = 0 where d is 0), as quant.py's torch path computes it byte for byte.
// The caller checks the fp16 scales for overflow.
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "glue.h"
#include "kernels.h"
#include "parallel.h"

namespace swiftspec {
namespace {

// Row r of w as fp32 into out [K].
void row_fp32(const at::Tensor& w, int64_t r, int64_t K, float* out) {
  if (w.scalar_type() == at::kFloat) {
    const float* src = w.data_ptr<float>() + r * K;
    std::copy(src, src + K, out);
  } else {
    const c10::BFloat16* src = w.data_ptr<c10::BFloat16>() + r * K;
    std::copy(src, src + K, out);  // exact: a bf16 is the high half of an fp32
  }
}

// The levels q[i] = clamp(round((x[i] - m) / d), 0, 15) of one group (n a multiple of 8, d > 0):
// the same IEEE operations (subtract, divide, round half to even) in plain code or 8 lanes at once.
void levels_plain(const float* x, int n, float d, float m, uint8_t* q) {
  for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(std::min(15.f, std::max(0.f, std::nearbyint((x[i] - m) / d))));
}

__attribute__((target("avx2"))) void levels_avx2(const float* x, int n, float d, float m, uint8_t* q) {
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m), zero = _mm256_setzero_ps(), top = _mm256_set1_ps(15.f);
  alignas(32) int32_t lane[8];
  for (int i = 0; i < n; i += 8) {
    const __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vd),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane), _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top)));
    for (int j = 0; j < 8; ++j) q[i + j] = static_cast<uint8_t>(lane[j]);
  }
}

}  // namespace

// w [N, K] fp32 or bf16 (K % group == 0) -> {q uint8 [T, K/8, 16, 4], d fp16 [T, K/G, 16], mn fp16 [T, K/G, 16]}.
std::vector<at::Tensor> int4_quantize(const at::Tensor& w, int64_t group) {
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.is_contiguous() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "int4_quantize: w must be a contiguous CPU float32 or bfloat16 [N, K]");
  TORCH_CHECK(group == 32 || group == 64 || group == 128, "int4_quantize: groups of 32, 64 or 128 values");
  const int64_t N = w.size(0), K = w.size(1), ng = K / group, T = (N + kTileN - 1) / kTileN;
  TORCH_CHECK(K % group == 0, "int4_quantize: K must be a multiple of the group size");
  auto u8 = at::TensorOptions().dtype(at::kByte);
  at::Tensor q = at::zeros({T, K / 8, kTileN, 4}, u8);
  at::Tensor d = at::zeros({T, ng, kTileN}, at::TensorOptions().dtype(at::kHalf));
  at::Tensor mn = at::zeros({T, ng, kTileN}, at::TensorOptions().dtype(at::kHalf));
  uint8_t* qp = q.data_ptr<uint8_t>();
  c10::Half* dp = d.data_ptr<c10::Half>();
  c10::Half* mp = mn.data_ptr<c10::Half>();
  const auto levels = __builtin_cpu_supports("avx2") ? levels_avx2 : levels_plain;
  parallel_chunks(T, T * kTileN * K * kInt4FitGrids, [&](int64_t t0, int64_t t1) {
    std::vector<float> x(K), dm(2 * ng);
    uint8_t lv[128];
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t r = 0; r < kTileN && t * kTileN + r < N; ++r) {
        row_fp32(w, t * kTileN + r, K, x.data());
        int4_fit_groups(x.data(), 0, ng, static_cast<int>(group), dm.data());
        for (int64_t g = 0; g < ng; ++g) {
          const c10::Half d16(dm[2 * g]), m16(dm[2 * g + 1]);
          const float dg = d16, mg = m16;
          dp[(t * ng + g) * kTileN + r] = d16;
          mp[(t * ng + g) * kTileN + r] = m16;
          if (dg > 0.f) {
            levels(x.data() + g * group, static_cast<int>(group), dg, mg, lv);
          } else {
            std::fill(lv, lv + group, uint8_t{0});
          }
          for (int64_t k = 0; k < group; k += 8) {
            uint8_t* out = qp + ((t * (K / 8) + (g * group + k) / 8) * kTileN + r) * 4;  // k = 8 s + 4 h + i
            for (int i = 0; i < 4; ++i) out[i] = lv[k + i] | static_cast<uint8_t>(lv[k + 4 + i] << 4);
          }
        }
      }
    }
  });
  return {q, d, mn};
}

}  // namespace swiftspec
