// Accepted by the strict pass (test_metal_strict.py): operand types from
// decltype with a reference, cv and the thread address space, which
// MetalPerformancePrimitives strips before it checks them.
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using mpp::tensor_ops::matmul2d;
using mpp::tensor_ops::matmul2d_descriptor;

kernel void accepted(
    device half* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device float* d [[buffer(2)]]) {
  constexpr auto desc = matmul2d_descriptor(32, 16, 16);
  matmul2d<desc, execution_simdgroups<1>> op;
  auto ta = tensor(a, dextents<int32_t, 2>(16, 32));
  auto tb = tensor(b, dextents<int32_t, 2>(16, 16));
  auto td = tensor(d, dextents<int32_t, 2>(16, 32));
  thread auto& ra = ta;
  auto acc = op.get_destination_cooperative_tensor<const thread decltype(ra)&, const decltype(tb), float>();
  for (int i = 0; i < int(acc.get_capacity()); ++i) {
    acc[i] = 0.0f;
  }
  op.run(ta, tb, acc);
  acc.store(td);
}
