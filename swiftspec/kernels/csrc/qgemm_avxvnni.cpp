// AVX-VNNI kernels for weight-only int8/int4 linear layers at small M: the row passes of
// qgemm_avx2_passes.h with vpdpbusd (activations come from quantize_act_avx2).
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include "qgemm_avx2_passes.h"

namespace swiftspec {

// Passes of 4 rows: vpdpbusd accumulates in place, so the low and high nibbles share one
// int32 sum per row and column pair, and 4 rows fit the 16 ymm registers.
void tiles_avxvnni(const ActQ& a, const PackedW& w, const OutSpec& o, int64_t t0, int64_t t1) {
  run_tiles<true, 4, 4>(a, w, o, t0, t1);
}

}  // namespace swiftspec
