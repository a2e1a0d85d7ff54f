// What an x86-64 CPU offers the kernels' instruction-set paths: read by the
// path selection at load time (cpu/isa.cpp) and by the build, which asks the
// building machine the same questions (cmake/cpu_paths_probe.cpp).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

namespace mlx_lattice::cpu {

// F16C from CPUID leaf 1 (ECX bit 29): Clang 16 knows no "f16c" in
// __builtin_cpu_supports. Its registers are AVX's, whose OS support the
// avx2 check below covers.
inline bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

// __builtin_cpu_supports also checks that the OS saves the vector state.
inline bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

inline bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f");
}

} // namespace mlx_lattice::cpu
#endif
