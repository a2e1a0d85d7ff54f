// The build compiles what a Mac build with Metal compiles: the definitions
// the configure gives the extension reach its units, so the branches under
// MLX_LATTICE_METAL and MLX_LATTICE_TENSOROPS are seen (and checked against
// Apple's metal-cpp: setThreadgroupMemoryLength takes a length and an index).
#include <Metal/Metal.hpp>

void encode(MTL::ComputeCommandEncoder* enc) {
#ifdef MLX_LATTICE_METAL
#if MACBUILD_BAD == 1
  enc->setThreadgroupMemoryLength(16); // MACBUILD-ERROR 1
#endif
#endif
#ifdef MLX_LATTICE_TENSOROPS
#if MACBUILD_BAD == 2
  enc->setThreadgroupMemoryLength(16, 0, 0); // MACBUILD-ERROR 2
#endif
#endif
  enc->setThreadgroupMemoryLength(16, 0);
}
