// The check compiles the code a Mac build with Metal compiles: the branches
// under MLX_LATTICE_METAL and MLX_LATTICE_TENSOROPS are seen.
#include <Metal/Metal.hpp>

void encode(MTL::ComputeCommandEncoder* enc) {
#ifdef MLX_LATTICE_METAL
#if MACHOST_BAD == 1
  enc->setThreadgroupMemoryLength(16); // MACHOST-ERROR 1
#endif
#endif
#ifdef MLX_LATTICE_TENSOROPS
#if MACHOST_BAD == 2
  enc->setThreadgroupMemoryLength(16, 0, 0); // MACHOST-ERROR 2
#endif
#endif
  enc->setThreadgroupMemoryLength(16, 0);
}
