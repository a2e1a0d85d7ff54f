// A metal-cpp method that does not exist: MTLDevice has
// maxThreadsPerThreadgroup, a pipeline state does not.
#include <Metal/Metal.hpp>

NS::UInteger widest(const MTL::ComputePipelineState* kernel) {
#if MACHOST_BAD == 1
  return kernel->maxThreadsPerThreadgroup(); // MACHOST-ERROR 1
#else
  return kernel->maxTotalThreadsPerThreadgroup();
#endif
}
