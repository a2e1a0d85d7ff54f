// Run by CMakeLists.txt at configure time: prints the x86-64 instruction-set
// paths beyond the baseline that the building machine can run, as a CMake
// list (the same tests the extension makes when it loads).
#include <cstdio>

#include "cpu/cpu_features.h"

int main() {
  using namespace mlx_lattice::cpu;
  std::printf("%s%s", has_avx2() ? "avx2;" : "", has_avx512() ? "avx512;" : "");
  return 0;
}
