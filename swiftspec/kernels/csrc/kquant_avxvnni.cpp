// AVX-VNNI kernel of the K-quant linear: the passes of kquant_avx2_passes.h with vpdpbusd, in
// passes of kPassAvxVnni rows (activations come from kquantize_row_avx2).
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include "kquant_avx2_passes.h"

namespace swiftspec {

void ktiles_avxvnni(const KAct& a, const KWeight& w, const OutSpec& o, int64_t t0, int64_t t1) {
  run_ktiles<true, kPassAvxVnni>(a, w, o, t0, t1);
}

}  // namespace swiftspec
