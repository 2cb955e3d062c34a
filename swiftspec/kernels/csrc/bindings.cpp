// The Python module: every op, the fused decoder, the ISA level detection and each op's path per
// level.  The only file that includes torch/python.h (pybind11 and torch's type casters).
#include <ATen/Parallel.h>
#include <torch/python.h>

#include "decoder.h"

namespace {

// {op: the level whose code it runs at `level`} (0: none, the torch reference runs instead).
std::map<std::string, int64_t> kernel_paths(int64_t level) {
  using namespace swiftspec;
  return {{"quant_linear", quant_linear_path(level)},
          {"bf16_linear", bf16_linear_path(level)},
          {"attention", attention_path(level)},
          {"rowwise", rowwise_path(level)},
          {"gguf_blocks", qblock_linear_path(level)}};
}

// torch sets a thread's intra-op count at its first parallel call from each library (a thread_local
// in an inline header), to the count last set by any thread: this makes that call now, for this one.
void take_thread_count() {
  at::parallel_for(0, 1, 1, [](int64_t, int64_t) {});
}

// The fused decoder's weights and the decoder (decoder.h).
void register_decoder(pybind11::module& m) {
  using namespace swiftspec;
  namespace py = pybind11;
  py::class_<PackedLinear>(m, "PackedLinear")
      .def(py::init([](int64_t fmt, at::Tensor q, at::Tensor scale, at::Tensor d, at::Tensor mn,
                       c10::optional<at::Tensor> bias, int64_t N, int64_t K, int64_t blk) {
        return PackedLinear{fmt, q, scale, d, mn, bias, N, K, blk, {}, {}, {}};
      }))
      .def(py::init([](int64_t fmt, at::Tensor q, at::Tensor d, at::Tensor dm, c10::optional<at::Tensor> bias,
                       int64_t N, int64_t K, at::Tensor qh, at::Tensor sc, at::Tensor mm) {
        return PackedLinear{fmt, q, {}, d, dm, bias, N, K, 256, qh, sc, mm};
      }));
  py::class_<Layer>(m, "DecoderLayerWeights")
      .def(py::init([](at::Tensor input_norm, at::Tensor post_norm, PackedLinear qkv, PackedLinear o,
                       PackedLinear gate_up, PackedLinear down) {
        return Layer{input_norm, post_norm, qkv, o, gate_up, down};
      }));
  py::class_<CpuDecoder>(m, "CpuDecoder")
      .def(py::init<std::vector<Layer>, at::Tensor, double, int64_t, int64_t, int64_t, int64_t>())
      .def("forward", &CpuDecoder::forward, "embeddings [T, hidden] -> final-normed hidden [T, hidden]");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("detect_level", &swiftspec::detect_level,
        "best ISA level here: 0 none, 1 AVX2+FMA+F16C, 2 +AVX-VNNI, 3 AVX-512 F/BW/VL/DQ, 4 +VNNI, 5 +BF16");
  m.def("level_supported", &swiftspec::level_supported, "whether this CPU runs an ISA level");
  m.def("take_thread_count", &take_thread_count, "fix this thread's intra-op count for these kernels now");
  m.def("kernel_paths", &kernel_paths, "each op's path (a level, 0 = none) at an ISA level");
  m.def("quant_linear", &swiftspec::quant_linear, "quantized linear (int8/int4 weights)");
  m.def("int4_fit", &swiftspec::int4_fit, "int4 quantizer: each group's searched (d, mn)");
  m.def("int4_quantize", &swiftspec::int4_quantize, "int4 quantizer: a dense weight -> the packed int4 weight",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("bf16_linear", &swiftspec::bf16_linear, "bf16 linear at small M");
  m.def("masked_attention", &swiftspec::masked_attention, "layout-invariant masked attention");
  m.def("rms_norm", &swiftspec::rms_norm, "RMSNorm with the model's rounding");
  m.def("silu_mul", &swiftspec::silu_mul, "SwiGLU activation silu(gate) * up");
  register_decoder(m);
  m.def("kquant_repack", &swiftspec::kquant_repack, "GGUF K-quant blocks -> the packed K-quant streams",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("kquant_linear", &swiftspec::kquant_linear, "K-quant linear (GGUF Q4_K / Q5_K / Q6_K blocks)");
  m.def("qblock_dequantize", &swiftspec::qblock_dequantize, "GGUF Q8_0 / Q5_0 / Q4_0 blocks -> the dense weight",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("qblock_linear", &swiftspec::qblock_linear, "GGUF block linear (Q8_0 / Q5_0 / Q4_0 blocks)");
}
