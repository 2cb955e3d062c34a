// CPU feature detection: the best ISA level (glue.h) this CPU runs.
#include "glue.h"

namespace swiftspec {

int64_t detect_level() {
  static const int64_t level = [] {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) {
      return static_cast<int64_t>(kNoIsa);
    }
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))) {
      return static_cast<int64_t>(kAvx2);
    }
    if (!__builtin_cpu_supports("avx512vnni")) return static_cast<int64_t>(kAvx512);
    return static_cast<int64_t>(__builtin_cpu_supports("avx512bf16") ? kAvx512Bf16 : kAvx512Vnni);
  }();
  return level;
}

void check_level(int64_t level, const char* what) {
  TORCH_CHECK(detect_level() >= kAvx2, what, ": this CPU lacks AVX2/FMA/F16C");
  TORCH_CHECK(level >= kAvx2 && level <= detect_level(), what, ": ISA level ", level,
              " is not available here (this CPU runs levels 1..", detect_level(), ")");
}

}  // namespace swiftspec
