// Torch glue of the K-quant linear (GGUF Q4_K / Q5_K / Q6_K super-blocks; kernels in kquant_avx512.cpp,
// kquant_avxvnni.cpp and kquant_avx2.cpp): argument checks, activation quantization and the
// thread split.  Its path at a level is quant_linear's (5-bit weights: qblock_linear's).
#include "glue.h"
#include "kquant.h"
#include "parallel.h"

namespace swiftspec {
namespace {

// What each kernel path (quant_linear_path) runs: its pass size (the activation layout, kquant.h),
// row quantizer and tiles.
struct KPath {
  int64_t path;
  int64_t pass;
  void (*quantize_row)(const KRowIn&, int8_t*, int64_t, float*, int16_t*);
  void (*tiles)(const KAct&, const KWeight&, const OutSpec&, int64_t, int64_t);
};
constexpr KPath kPaths[] = {
    {kAvx512Vnni, kPassAvx512, kquantize_row_avx512, ktiles_avx512},
    {kAvx2Vnni, kPassAvxVnni, kquantize_row_avx2, ktiles_avxvnni},
    {kAvx2, kPassAvx2, kquantize_row_avx2, ktiles_avx2},
};

const KPath& kpath(int64_t path) {
  for (const KPath& p : kPaths) {
    if (p.path == path) return p;
  }
  TORCH_CHECK(false, "kquant_linear: no kernel for path ", path);
}

struct KScratch {
  std::vector<int8_t> xq;
  std::vector<float> xs;
  std::vector<int16_t> xsum;
};

// Rows [0, M) of x quantized by the path's row quantizer into the pass layout of kquant.h.
KAct quantize(const at::Tensor& x, int64_t K, int sub, const KPath& path, KScratch& s) {
  const int64_t M = x.size(0), pass = path.pass;
  int8_t* xq = sized(s.xq, M * K);
  float* xs = sized(s.xs, M * (K / kSuperK));
  int16_t* xsum = sized(s.xsum, M * (K / sub));
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const char* base = static_cast<const char*>(x.data_ptr());
  const int64_t ld = x.stride(0) * (bf16 ? 2 : 4);
  at::parallel_for(0, M, std::max<int64_t>(1, kSerialWork / K), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p0 = r / pass * pass, R = std::min(pass, M - p0);
      const KRowIn in{base + r * ld, bf16, K, sub};
      int8_t* dst = xq + p0 * K + (r - p0) * 4;
      path.quantize_row(in, dst, R, xs + r * (K / kSuperK), xsum + r * (K / sub));
    }
  });
  return KAct{xq, xs, xsum, K};
}

}  // namespace

// y[M, N] = x[M, K] @ W^T (+ bias), W packed as in swiftspec/kernels/kquant.py (fmt q4k / q5k / q6k).
at::Tensor kquant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& qh, const at::Tensor& sc,
                         const at::Tensor& mm, const at::Tensor& d, const at::Tensor& dm,
                         const c10::optional<at::Tensor>& bias, int64_t bits, int64_t N, int64_t K, int64_t level) {
  check_level(level, "kquant_linear");
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6, "kquant_linear: bits must be 4, 5 or 6");
  check_gguf_x(x, K, "kquant_linear");
  TORCH_CHECK(N > 0 && K > 0 && K % kSuperK == 0, "kquant_linear: K must be a positive multiple of 256");
  const int sub = ksub(static_cast<int>(bits));
  const int64_t T = (N + kTileN - 1) / kTileN, TN = T * kTileN;
  check_stream(q, at::kByte, TN * K / 2, "kquant_linear", "q");
  if (bits != 4) check_stream(qh, at::kByte, TN * K / (bits == 6 ? 4 : 8), "kquant_linear", "qh");
  check_stream(sc, at::kChar, TN * K / sub, "kquant_linear", "sc");
  check_stream(mm, at::kChar, TN * K / sub, "kquant_linear", "mm");
  check_stream(d, at::kHalf, TN * K / kSuperK, "kquant_linear", "d");
  check_stream(dm, at::kHalf, TN * K / kSuperK, "kquant_linear", "dm");
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  if (x.size(0) == 0) return out;
  thread_local KScratch cached;
  KScratch fresh;
  // 5-bit weights take the AVX2 path at every level, as the GGUF block linear does (glue.h).
  const KPath& path = kpath(bits == 5 ? qblock_linear_path(level) : quant_linear_path(level));
  const KAct act = quantize(x, K, sub, path, x.size(0) <= kMaxSmallRows ? cached : fresh);
  const at::Tensor b32 = bias_fp32(bias, N, "kquant_linear");
  const KWeight w{q.data_ptr<uint8_t>(), bits != 4 ? qh.data_ptr<uint8_t>() : nullptr, sc.data_ptr<int8_t>(),
                  mm.data_ptr<int8_t>(), reinterpret_cast<const uint16_t*>(d.data_ptr()),
                  reinterpret_cast<const uint16_t*>(dm.data_ptr()), static_cast<int>(bits)};
  const OutSpec o{out.data_ptr(), b32.defined() ? b32.data_ptr<float>() : nullptr, x.size(0), N, N,
                  x.scalar_type() == at::kBFloat16};
  parallel_chunks(T, T * K * x.size(0), [&](int64_t t0, int64_t t1) { path.tiles(act, w, o, t0, t1); });
  return out;
}

}  // namespace swiftspec
