// CPU feature detection: the best ISA level (glue.h) this CPU runs, and which levels it runs.
#include "glue.h"

namespace swiftspec {

namespace {

bool has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

}  // namespace

int64_t detect_level() {
  static const int64_t level = [] {
    if (!has_avx2()) return static_cast<int64_t>(kNoIsa);
    if (!has_avx512()) return static_cast<int64_t>(__builtin_cpu_supports("avxvnni") ? kAvx2Vnni : kAvx2);
    if (!__builtin_cpu_supports("avx512vnni")) return static_cast<int64_t>(kAvx512);
    return static_cast<int64_t>(__builtin_cpu_supports("avx512bf16") ? kAvx512Bf16 : kAvx512Vnni);
  }();
  return level;
}

bool level_supported(int64_t level) {
  if (level == kNoIsa) return true;
  if (level == kAvx2Vnni) return has_avx2() && __builtin_cpu_supports("avxvnni");
  return level >= kAvx2 && level <= detect_level();
}

void check_level(int64_t level, const char* what) {
  TORCH_CHECK(detect_level() >= kAvx2, what, ": this CPU lacks AVX2/FMA/F16C");
  TORCH_CHECK(level >= kAvx2 && level_supported(level), what, ": ISA level ", level,
              " is not available on this CPU");
}

}  // namespace swiftspec
