// metal-cpp calls with the wrong arguments: a library where a pipeline state
// goes, setBytes without its buffer index, a two-dimensional MTL::Size.
#include <Metal/Metal.hpp>

void encode(
    MTL::ComputeCommandEncoder* enc,
    MTL::ComputePipelineState* kernel,
    MTL::Library* library,
    const float* params) {
  (void)kernel;
  (void)library;
#if MACHOST_BAD == 1
  enc->setComputePipelineState(library); // MACHOST-ERROR 1
#else
  enc->setComputePipelineState(kernel);
#endif
#if MACHOST_BAD == 2
  enc->setBytes(params, sizeof(float)); // MACHOST-ERROR 2
#else
  enc->setBytes(params, sizeof(float), 0);
#endif
#if MACHOST_BAD == 3
  MTL::Size grid(4, 2); // MACHOST-ERROR 3
#else
  MTL::Size grid(4, 2, 1);
#endif
  (void)grid;
}
