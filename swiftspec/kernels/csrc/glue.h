// The torch-level entry points of quant_linear.cpp that other glue files (decoder_cpu.cpp) call.
#pragma once
#include <torch/extension.h>

#include "qgemm.h"

namespace swiftspec {

constexpr int64_t kMaxBf16Rows = 16;  // bf16_linear's row limit; larger batches (prefill) go to oneDNN

int64_t detect_isa();
bool has_avx512();
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& d,
                        const at::Tensor& mn, const c10::optional<at::Tensor>& bias, bool int4, int64_t N, int64_t K,
                        int64_t blk, int64_t isa_request);
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias);
at::Tensor silu_mul(const at::Tensor& gate_up);
void run_attention(const AttnArgs& a);  // all T * Hkv work items, in parallel
void register_decoder(pybind11::module& m);  // decoder_cpu.cpp

}  // namespace swiftspec
