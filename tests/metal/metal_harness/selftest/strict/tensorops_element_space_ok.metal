// Valid neighbour of tensorops_element_space.metal for the strict pass (test_metal_strict.py):
// an unqualified element type; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using mpp::tensor_ops::matmul2d;
using mpp::tensor_ops::matmul2d_descriptor;

kernel void planted(
    device half* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device half* c [[buffer(2)]],
    device float* d [[buffer(3)]],
    constant half* k [[buffer(4)]]) {
  constexpr auto desc = matmul2d_descriptor(32, 16, 16);
  matmul2d<desc, execution_simdgroups<1>> op;
  auto ta = tensor(a, dextents<int32_t, 2>(16, 32));
  auto tb = tensor(b, dextents<int32_t, 2>(16, 16));
  auto acc = op.get_destination_cooperative_tensor<decltype(ta), decltype(tb), float>();
  op.run(ta, tb, acc);
}
