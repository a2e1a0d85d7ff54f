// Valid for the strict pass (test_metal_strict.py): every compute built-in
// input, the 3-vector ones of one width. Apple's compiler accepts it, and
// so must the pass.
#include <metal_stdlib>
using namespace metal;
kernel void planted(device uint* y [[buffer(0)]],
              uint tps [[threads_per_simdgroup]],
              uint sgs [[simdgroups_per_threadgroup]],
              uint qg [[quadgroup_index_in_threadgroup]],
              uint3 dtpt [[dispatch_threads_per_threadgroup]],
              uint tiq [[thread_index_in_quadgroup]],
              uint qpt [[quadgroups_per_threadgroup]],
              uint dsg [[dispatch_simdgroups_per_threadgroup]],
              uint dqg [[dispatch_quadgroups_per_threadgroup]],
              uint3 tgpg [[threadgroups_per_grid]],
              uint3 tpg [[threads_per_grid]],
              uint3 tpt [[threads_per_threadgroup]],
              uint3 gid [[thread_position_in_grid]],
              uint3 tig [[thread_position_in_threadgroup]],
              uint ti [[thread_index_in_threadgroup]],
              uint3 tgid [[threadgroup_position_in_grid]],
              uint sgi [[simdgroup_index_in_threadgroup]],
              uint tis [[thread_index_in_simdgroup]]) {
  y[ti] = tps + sgs + qg + dtpt.x + tiq + qpt + dsg + dqg + tgpg.x + tpg.y + tpt.z + gid.x + tig.y + tgid.z + sgi + tis;
}
