// The fused CPU decoder's weights and forward (decoder_cpu.cpp); bindings.cpp exposes them.
#pragma once
#include <vector>

#include "glue.h"

namespace swiftspec {

// One linear layer in the packed formats of swiftspec/kernels/quant.py.
struct PackedLinear {
  int64_t fmt;  // 0: bf16 (q is the [N, K] weight), 1: int8, 2: int4, 3: q4k, 4: q6k, 5: q8_0, 6: q5k,
                // 7: q5_0, 8: q4_0
  at::Tensor q, scale, d, mn;
  c10::optional<at::Tensor> bias;
  int64_t N, K, blk;
  at::Tensor qh, sc, mm;  // K-quants only (d, mn: the block scales d and dm); GGUF blocks: d, and qh for q5_0

  at::Tensor operator()(const at::Tensor& x, int64_t level) const;  // x [T, K] -> [T, N]
};

struct Layer {
  at::Tensor input_norm, post_norm;  // [hidden] RMSNorm weights
  PackedLinear qkv, o, gate_up, down;
};

// Tensors of one call: the KV cache [L, S_max, Hkv, D], slots [T] int64, cos and sin [T, D]
// rows (RotaryEmbedding's tables), mask [T, S] bool.
struct CallArgs {
  const at::Tensor& k_cache;
  const at::Tensor& v_cache;
  const at::Tensor& slots;
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& mask;
};

class CpuDecoder {
 public:
  CpuDecoder(std::vector<Layer> layers, at::Tensor final_norm, double eps, int64_t heads, int64_t kv_heads,
             int64_t head_dim, int64_t level);

  // x [T, hidden] (the embeddings) -> the final-normed hidden states [T, hidden]; writes each
  // layer's K/V at the slots.
  at::Tensor forward(const at::Tensor& x_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& slots, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& mask) const;

 private:
  void check(const at::Tensor& x, const CallArgs& c) const;
  at::Tensor attend(int64_t l, const at::Tensor& qkv, const CallArgs& c) const;
  void norm(const at::Tensor& x, const at::Tensor& weight, at::Tensor& h) const;
  void add_norm(at::Tensor& x, const at::Tensor& d, const at::Tensor& weight, at::Tensor& h) const;

  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  float eps_;
  int64_t H_, Hkv_, D_;
  int64_t level_;  // the ISA level every kernel of a forward runs at
};

}  // namespace swiftspec
