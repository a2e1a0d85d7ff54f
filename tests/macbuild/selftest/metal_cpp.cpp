// Apple's metal-cpp, as the wheel ships it, judges every call: a method a
// class does not have, an object of the wrong class, a Metal object copied
// (metal-cpp deletes their constructors: they live behind pointers).
#include <Metal/Metal.hpp>

NS::UInteger widest(MTL::ComputeCommandEncoder* enc, MTL::ComputePipelineState* kernel, MTL::Library* library,
                    MTL::Buffer* buf) {
  (void)library;
#if MACBUILD_BAD == 1
  NS::UInteger n = kernel->maxThreadsPerThreadgroup(); // MACBUILD-ERROR 1
#else
  NS::UInteger n = kernel->maxTotalThreadsPerThreadgroup();
#endif
#if MACBUILD_BAD == 2
  enc->setComputePipelineState(library); // MACBUILD-ERROR 2
#else
  enc->setComputePipelineState(kernel);
#endif
#if MACBUILD_BAD == 3
  MTL::Buffer copy = *buf; // MACBUILD-ERROR 3
#endif
  enc->setBuffer(buf, 0, 0);
  return n;
}
