// Harness self-test kernels that are correct: every schedule must give the
// NumPy result.
#include <metal_stdlib>
using namespace metal;

struct ScaleParams {
  uint n;
  float scale;
};

kernel void scale(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    constant ScaleParams& p [[buffer(2)]],
    uint gid [[thread_position_in_grid]]) {
  if (gid < p.n) {
    y[gid] = x[gid] * p.scale;
  }
}

// No bounds guard: correct only when the grid has exactly n threads
// (dispatch_threads with a partial last threadgroup).
kernel void copy_unguarded(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    uint gid [[thread_position_in_grid]]) {
  y[gid] = x[gid];
}

// Vector types, swizzles (read and write), half literals, as_type, select.
kernel void vector_ops(
    device const float4* x [[buffer(0)]],
    device float4* y [[buffer(1)]],
    device uint* z [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  float4 v = x[i];
  float4 r = float4(v.yx, v.w * 2.0h, 1.0f);
  r.zw += float2(0.5f);
  r.xy = r.yx;
  y[i] = select(r, clamp(r, -1.0f, 1.0f), r > 2.0f);
  uint2 u = uint2(as_type<uint>(v.x), i);
  z[i] = u.x ^ popcount(u.y);
}

// Reverses each threadgroup's slice through a [[threadgroup(0)]] buffer.
kernel void reverse_groups(
    device const float* x [[buffer(0)]],
    device float* y [[buffer(1)]],
    threadgroup float* scratch [[threadgroup(0)]],
    uint gid [[thread_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint tpg [[threads_per_threadgroup]]) {
  scratch[tid] = x[gid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[gid] = scratch[tpg - 1 - tid];
}

// Every simd-group function the harness emulates, one output slot each.
kernel void simd_ops(
    device const float* x [[buffer(0)]],
    device float* out [[buffer(1)]],
    device uint* bits [[buffer(2)]],
    uint i [[thread_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  const float v = x[i];
  device float* o = out + i * 12;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_min(v);
  o[3] = simd_prefix_exclusive_sum(v);
  o[4] = simd_prefix_inclusive_sum(v);
  o[5] = simd_shuffle(v, (lane * 7) % 32);
  o[6] = simd_shuffle_down(v, 3);
  o[7] = simd_shuffle_up(v, 5);
  o[8] = simd_shuffle_xor(v, 6);
  o[9] = simd_broadcast(v, 17);
  o[10] = simd_sum(float2(v, 1.0f)).y;
  o[11] = quad_sum(v);
  bits[i * 2] = uint(static_cast<simd_vote::vote_t>(simd_ballot(v > 0.0f)));
  bits[i * 2 + 1] = simd_prefix_exclusive_sum(uint(v > 0.0f));
}

// Inclusive scan within each threadgroup: simd prefix sums, then a prefix
// over the per-simdgroup totals in threadgroup memory.
kernel void block_scan(
    device const uint* x [[buffer(0)]],
    device uint* y [[buffer(1)]],
    constant uint& n [[buffer(2)]],
    uint gid [[thread_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint nsg [[simdgroups_per_threadgroup]]) {
  threadgroup uint partial[32];
  const uint v = gid < n ? x[gid] : 0u;
  const uint incl = simd_prefix_inclusive_sum(v);
  if (lane == 31 || gid == n - 1) {
    partial[sg] = incl;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    const uint p = lane < nsg ? partial[lane] : 0u;
    const uint before = simd_prefix_exclusive_sum(p);
    partial[lane] = before;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (gid < n) {
    y[gid] = incl + partial[sg];
  }
}

// Histogram of x % 64: threadgroup atomics, then device atomics; and a float
// atomic sum.
kernel void histogram(
    device const uint* x [[buffer(0)]],
    device atomic_uint* hist [[buffer(1)]],
    device atomic_float* total [[buffer(2)]],
    constant uint& n [[buffer(3)]],
    uint gid [[thread_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint tpg [[threads_per_threadgroup]]) {
  threadgroup atomic_uint local[64];
  for (uint b = tid; b < 64; b += tpg) {
    atomic_store_explicit(&local[b], 0u, memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (gid < n) {
    atomic_fetch_add_explicit(&local[x[gid] % 64], 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(total, float(x[gid]), memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint b = tid; b < 64; b += tpg) {
    const uint c = atomic_load_explicit(&local[b], memory_order_relaxed);
    if (c != 0) {
      atomic_fetch_add_explicit(&hist[b], c, memory_order_relaxed);
    }
  }
}

struct GemmParams {
  uint m;
  uint n;
  uint k;
};

// C = A B with 16x16 output tiles: 4 simdgroups, one 8x8 block each; A and
// B tiles staged in threadgroup memory, products with simdgroup_matrix.
template <typename T>
[[kernel]] void gemm_tiled(
    device const T* a [[buffer(0)]],
    device const T* b [[buffer(1)]],
    device T* c [[buffer(2)]],
    constant GemmParams& p [[buffer(3)]],
    uint2 group [[threadgroup_position_in_grid]],
    uint tid [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup T ta[16 * 8];
  threadgroup T tb[8 * 16];
  threadgroup float tc[16 * 16];
  const uint row0 = group.y * 16;
  const uint col0 = group.x * 16;
  const uint sr = (sg / 2) * 8;
  const uint sc = (sg % 2) * 8;
  simdgroup_matrix<float, 8, 8> acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  for (uint k0 = 0; k0 < p.k; k0 += 8) {
    {
      const uint r = tid / 8, kk = tid % 8;
      const uint gr = row0 + r, gk = k0 + kk;
      ta[r * 8 + kk] = (gr < p.m && gk < p.k) ? a[gr * p.k + gk] : T(0);
    }
    {
      const uint kk = tid / 16, cc = tid % 16;
      const uint gk = k0 + kk, gc = col0 + cc;
      tb[kk * 16 + cc] = (gk < p.k && gc < p.n) ? b[gk * p.n + gc] : T(0);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_matrix<T, 8, 8> ma;
    simdgroup_matrix<T, 8, 8> mb;
    simdgroup_load(ma, ta + sr * 8, 8);
    simdgroup_load(mb, tb + sc, 16);
    simdgroup_multiply_accumulate(acc, ma, mb, acc);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  simdgroup_store(acc, tc + sr * 16 + sc, 16);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint i = tid; i < 256; i += 128) {
    const uint r = i / 16, cc = i % 16;
    if (row0 + r < p.m && col0 + cc < p.n) {
      c[(row0 + r) * p.n + col0 + cc] = T(tc[i]);
    }
  }
}

template [[host_name("gemm_tiled_float")]] [[kernel]] decltype(gemm_tiled<float>) gemm_tiled<float>;
template [[host_name("gemm_tiled_half")]] [[kernel]] decltype(gemm_tiled<half>) gemm_tiled<half>;

// One 8x8 block of a 16x16 matrix loaded at an origin, optionally
// transposed, and stored back: exercises matrix_origin and transpose.
kernel void matrix_roundtrip(
    device const float* src [[buffer(0)]],
    device float* dst [[buffer(1)]],
    device float* diag [[buffer(2)]],
    uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, src, 16, ulong2(8, 0), true);
  simdgroup_store(m, dst, 8);
  simdgroup_float8x8 d = simdgroup_float8x8(2.0f);
  simdgroup_float8x8 prod;
  simdgroup_multiply(prod, d, m);
  simdgroup_store(prod, diag, 8);
  (void)lane;
}

// MSL's matrices: products with vectors and matrices, transpose,
// determinants of three sizes, construction from columns, scaling.
kernel void matrix_ops(
    device const float4x4* m [[buffer(0)]],
    device const float4* v [[buffer(1)]],
    device float4* out [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  const float4x4 a = m[i];
  out[4 * i + 0] = a * v[i];
  out[4 * i + 1] = v[i] * a;
  out[4 * i + 2] = (transpose(a) * a)[1];
  const float3x3 a3 = float3x3(a[0].xyz, a[1].xyz, a[2].xyz);
  const float2x2 a2 = float2x2(a[0].xy, a[1].xy);
  out[4 * i + 3] = float4(determinant(a), determinant(a3), determinant(a2), (a * 2.0f - a)[3][2]);
}

// Vector comparisons into bool vectors, select, any, all and swizzles in
// both letter sets, read and written.
kernel void compare_select(
    device const float4* a [[buffer(0)]],
    device const float4* b [[buffer(1)]],
    device float4* out [[buffer(2)]],
    device uint* flags [[buffer(3)]],
    uint i [[thread_position_in_grid]]) {
  const bool4 lt = a[i] < b[i];
  float4 r = select(a[i], b[i], lt).wzyx;
  r.rg = r.gr;
  out[i] = r;
  flags[i] = (any(lt) ? 1u : 0u) | (all(lt) ? 2u : 0u) | (all(!lt.xy) ? 4u : 0u);
}

// The dispatch built-ins beside the actual ones: an edge threadgroup of a
// grid dispatch is smaller than the launch's.
kernel void dispatch_inputs(
    device uint* out [[buffer(0)]],
    uint3 dispatch [[dispatch_threads_per_threadgroup]],
    uint3 actual [[threads_per_threadgroup]],
    uint simdgroups [[dispatch_simdgroups_per_threadgroup]],
    uint quads [[dispatch_quadgroups_per_threadgroup]],
    uint3 gid [[thread_position_in_grid]]) {
  out[gid.x * 4 + 0] = dispatch.x;
  out[gid.x * 4 + 1] = actual.x;
  out[gid.x * 4 + 2] = simdgroups;
  out[gid.x * 4 + 3] = quads;
}
