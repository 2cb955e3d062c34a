// The Python module: every op, the ISA level detection and each op's path per level.
#include "glue.h"

namespace {

// {op: the level whose code it runs at `level`} (0: none, the torch reference runs instead).
std::map<std::string, int64_t> kernel_paths(int64_t level) {
  using namespace swiftspec;
  return {{"quant_linear", quant_linear_path(level)},
          {"bf16_linear", bf16_linear_path(level)},
          {"attention", attention_path(level)},
          {"rowwise", rowwise_path(level)}};
}

// torch sets a thread's intra-op count at its first parallel call from each library (a thread_local
// in an inline header), to the count last set by any thread: this makes that call now, for this one.
void take_thread_count() {
  at::parallel_for(0, 1, 1, [](int64_t, int64_t) {});
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("detect_level", &swiftspec::detect_level,
        "best ISA level here: 0 none, 1 AVX2+FMA+F16C, 2 +AVX-VNNI, 3 AVX-512 F/BW/VL/DQ, 4 +VNNI, 5 +BF16");
  m.def("level_supported", &swiftspec::level_supported, "whether this CPU runs an ISA level");
  m.def("take_thread_count", &take_thread_count, "fix this thread's intra-op count for these kernels now");
  m.def("kernel_paths", &kernel_paths, "each op's path (a level, 0 = none) at an ISA level");
  m.def("quant_linear", &swiftspec::quant_linear, "quantized linear (int8/int4 weights)");
  m.def("bf16_linear", &swiftspec::bf16_linear, "bf16 linear at small M");
  m.def("masked_attention", &swiftspec::masked_attention, "layout-invariant masked attention");
  m.def("rms_norm", &swiftspec::rms_norm, "RMSNorm with the model's rounding");
  m.def("silu_mul", &swiftspec::silu_mul, "SwiGLU activation silu(gate) * up");
  swiftspec::register_decoder(m);
  m.def("kquant_linear", &swiftspec::kquant_linear, "K-quant linear (GGUF Q4_K / Q6_K blocks)");
}
