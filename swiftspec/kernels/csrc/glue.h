// The torch-level entry points shared by the glue files (quant_linear.cpp, bf16_linear.cpp,
// attention.cpp, rowwise.cpp, kquant_linear.cpp, isa.cpp, decoder_cpu.cpp, bindings.cpp).
//
// ISA levels: each level is a superset of the one below, except avx2-vnni: AVX-VNNI (VEX) comes
// with Intel's client cores since 12th gen and AMD's since Zen 5, but not with Skylake-SP or
// Zen 4, which have AVX-512.  Every op takes the level to run at (Python passes the best level
// this CPU supports at or below the SWIFTSPEC_ISA cap, fixed for the process) and picks, kernel by
// kernel, the best path that level allows: a kernel never needs more than the features it uses.
#pragma once
// Only the ATen headers the glue uses: torch/extension.h cost ~55 s of compile per file; only
// bindings.cpp includes torch's Python headers (torch/python.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "kernels.h"

namespace swiftspec {

enum Level : int64_t {
  kNoIsa = 0,       // no kernels: the torch references run
  kAvx2 = 1,        // AVX2 + FMA + F16C
  kAvx2Vnni = 2,    // + AVX-VNNI (only the int8/int4 linear uses it)
  kAvx512 = 3,      // AVX2 + FMA + F16C + AVX-512 F, BW, VL, DQ
  kAvx512Vnni = 4,  // + AVX-512 VNNI
  kAvx512Bf16 = 5,  // + AVX-512 BF16
};

constexpr int64_t kMaxSmallRows = 16;  // bound of the small-M paths (decode, verification, drafting)

int64_t detect_level();                        // isa.cpp: the best level this CPU runs
bool level_supported(int64_t level);           // this CPU runs level (kNoIsa: always)
void check_level(int64_t level, const char* what);  // kAvx2 <= level, supported, else throws
// A linear's bias as contiguous fp32 (undefined when there is none); op names it in the error when
// it does not have N elements.  Defined in quant_linear.cpp.
at::Tensor bias_fp32(const c10::optional<at::Tensor>& bias, int64_t N, const char* op);
// The GGUF linears' argument checks (quant_linear.cpp): x a row-major [M, K] bf16/fp32 CPU tensor;
// a packed stream `what` contiguous, on the CPU, of dtype dt and numel elements.
void check_gguf_x(const at::Tensor& x, int64_t K, const char* op);
void check_stream(const at::Tensor& t, at::ScalarType dt, int64_t numel, const char* op, const char* what);

// Each op's path at a level: the level whose code it runs (kNoIsa: the op refuses; use torch).
int64_t quant_linear_path(int64_t level);
int64_t bf16_linear_path(int64_t level);
int64_t attention_path(int64_t level);
int64_t rowwise_path(int64_t level);
int64_t qblock_linear_path(int64_t level);  // also the K-quant linear's path for 5-bit weights

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& d,
                        const at::Tensor& mn, const c10::optional<at::Tensor>& bias, bool int4, int64_t N, int64_t K,
                        int64_t blk, int64_t level);
// GGUF K-quant parts (uint8 [rows, K / 256 * block bytes], part_bits 4/5/6 each) stacked along N ->
// the packed streams of a `bits`-bit weight {q, qh, sc, mm, d, dm} (kquant.h): kquant_repack.cpp.
std::vector<at::Tensor> kquant_repack(const std::vector<at::Tensor>& raws, const std::vector<int64_t>& part_bits,
                                      int64_t K, int64_t bits);
// GGUF Q8_0 / Q5_0 / Q4_0 rows (uint8 [rows, K / 32 * block bytes]) -> the [rows, K] weight in dtype:
// qblock_dequant.cpp.
at::Tensor qblock_dequantize(const at::Tensor& raw, int64_t bits, at::ScalarType dtype);
at::Tensor int4_fit(const at::Tensor& groups);  // [G, n] fp32 -> [G, 2] (d, mn): int4_fit.cpp's search
// w [N, K] fp32/bf16 -> the packed int4 weight {q, d, mn} (quant.py's layout): int4_quantize.cpp.
std::vector<at::Tensor> int4_quantize(const at::Tensor& w, int64_t group);
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                       int64_t level);
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale, int64_t level);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t level);
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t level);

// Plain-pointer dispatchers for the fused decoder (no checks beyond the level's).
void run_attention(const AttnArgs& a, int64_t level);  // all T * Hkv work items, in parallel
void rms_norm_rows(const RowArgs& a, const void* weight, float eps, int64_t r0, int64_t r1, int64_t level);
void add_rms_norm_rows(const AddNormArgs& a, int64_t r0, int64_t r1, int64_t level);
void rope_store_rows(const RopeArgs& a, int64_t t0, int64_t t1, int64_t level);

// K-quant linear (kquant_linear.cpp): GGUF Q4_K / Q5_K / Q6_K super-blocks as stored (bits 4 / 5 / 6).
at::Tensor kquant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& qh, const at::Tensor& sc,
                         const at::Tensor& mm, const at::Tensor& d, const at::Tensor& dm,
                         const c10::optional<at::Tensor>& bias, int64_t bits, int64_t N, int64_t K, int64_t level);

// GGUF block linear (qblock_linear.cpp): Q8_0 / Q5_0 / Q4_0 blocks as stored (bits 8 / 5 / 4).
at::Tensor qblock_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& qh, const at::Tensor& d,
                         const c10::optional<at::Tensor>& bias, int64_t bits, int64_t N, int64_t K, int64_t level);

}  // namespace swiftspec
