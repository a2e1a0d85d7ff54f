// Breadth of the MSL shim: one kernel touching many functions and types,
// each slot with a known value (see test_metal_harness.py).
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
using namespace metal;

constant constexpr int kN = 4;
static constant constexpr const float kHalf = 0.5f;
constant float lut[3] = {1.0f, 2.0f, 3.0f};

template <typename T>
METAL_FUNC T min_plus_max(T a, T b) {
  return metal::max(a, b) + metal::min(a, b);
}

kernel void features(
    device float* out [[buffer(0)]],
    device atomic_int* counter [[buffer(1)]],
    uint3 gid [[thread_position_in_grid]],
    ushort lane [[thread_index_in_simdgroup]],
    uint qi [[thread_index_in_quadgroup]]) {
  device float* o = out + gid.x * 18;
  o[0] = dot(float3(1, 2, 3), float3(4, 5, 6));
  o[1] = length(float2(3.0f, 4.0f));
  const float4 st = step(kHalf, float4(0, 1, 0, 1));
  o[2] = st.x + st.y + st.z + st.w;
  const int4 c = clamp(int4(-9, 3, 9, 0), -5, 5);
  o[3] = float(c.x + c.y + c.z + c.w);
  const bfloat bf = bfloat(1.5f) * bfloat(1.5f) + bfloat(0.25f);
  o[4] = float(bf);
  o[5] = float(as_type<uint>(half2(1.0h, 2.0h)) & 0xFFFFu);
  o[6] = quad_sum(float(qi));
  o[7] = simd_shuffle_and_fill_down(float(lane), -1.0f, ushort(4));
  o[8] = float(popcount(0xF0u) + clz(1u) + ctz(8u));
  float2 f2 = float2(1.0f);
  f2 *= 2.0f;
  f2.y = f2.x + 1.0f;
  f2 = f2.yx;
  o[9] = f2.x * 10.0f + f2.y;
  const packed_float3 pf = packed_float3(1.0f, 2.0f, 3.0f);
  const float3 p3 = pf;
  o[10] = p3.z;
  metal::array<float, kN> arr;
  for (int i = 0; i < kN; ++i) {
    arr[i] = float(i);
  }
  o[11] = arr[0] + arr[1] + arr[2] + arr[3];
  o[12] = fast::exp(0.0f) + precise::sqrt(4.0f);
  o[13] = select(1.0f, 2.0f, gid.x < 1000u) + lut[0] - 1.0f;
  o[14] = float(static_cast<uint>(static_cast<simd_vote::vote_t>(simd_ballot(lane < 8))));
  o[15] = min_plus_max(1.0f, 2.0f);
  o[16] = float(exp(half(0.0h))) + (isinf(INFINITY) && isnan(NAN) ? 0.0f : 100.0f);
  o[17] = mix(1.0f, 3.0f, 0.5f) + float(numeric_limits<half>::max()) * 0.0f;
  int expected = 0;
  atomic_compare_exchange_weak_explicit(counter, &expected, 7, memory_order_relaxed, memory_order_relaxed);
  atomic_fetch_max_explicit(counter, int(gid.x), memory_order_relaxed);
  simdgroup_barrier(mem_flags::mem_none);
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
}
