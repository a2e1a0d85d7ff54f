// The emulated MetalPerformancePrimitives subset (include/mh/tensor.h):
// matmul2d on tensor views and cooperative destinations, checked against
// NumPy in test_metal_harness.py.
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using mpp::tensor_ops::matmul2d;
using mpp::tensor_ops::matmul2d_descriptor;

struct MMParams {
  int rows; // rows of A and C
  int k;    // inner dimension
  int zero; // 1: zero the accumulator before the K loop
};

// C (rows x 32, float) = A (rows x k) B (k x 32), half operands in device
// memory, 64-row tiles of four simdgroups; the last tile is partial.
kernel void mm_coop(
    device half* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant MMParams& p [[buffer(3)]],
    uint3 tg [[threadgroup_position_in_grid]]) {
  constexpr auto desc = matmul2d_descriptor(
      64, 32, static_cast<int>(dynamic_extent), false, false, false, matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroups<4>> op;
  const int row0 = int(tg.x) * 64;
  auto ta = tensor<device half, dextents<int32_t, 2>, tensor_inline>(
      a + row0 * p.k, dextents<int32_t, 2>(p.k, p.rows - row0));
  auto tb = tensor(b, dextents<int32_t, 2>(32, p.k));
  auto tc = tensor(c + row0 * 32, dextents<int32_t, 2>(32, p.rows - row0));
  auto acc = op.get_destination_cooperative_tensor<decltype(ta), decltype(tb), float>();
  op.run(ta, tb, acc);
  acc.store(tc);
}

// C (32 x 16, float) = A (32 x k, float) B (k x 16, half): K in chunks of 16
// staged through threadgroup memory, accumulated in a cooperative tensor of
// one simdgroup; the last chunk reads past B's extents (zeros).
kernel void mm_kloop(
    device float* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant MMParams& p [[buffer(3)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup float as[32 * 16];
  constexpr auto desc =
      matmul2d_descriptor(32, 16, 16, false, false, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroups<1>> op;
  auto ta = tensor<threadgroup float, dextents<int32_t, 2>, tensor_inline>(as, dextents<int32_t, 2>(16, 32));
  auto tb0 = tensor<device half, dextents<int32_t, 2>, tensor_inline>(b, dextents<int32_t, 2>(16, p.k));
  auto acc = op.get_destination_cooperative_tensor<decltype(ta), decltype(tb0), float>();
  if (p.zero) {
    for (int i = 0; i < int(acc.get_capacity()); ++i) {
      acc[i] = 0.0f;
    }
  }
  for (int k0 = 0; k0 < p.k; k0 += 16) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = int(t); i < 32 * 16; i += 32) {
      const int kk = k0 + i % 16;
      as[i] = kk < p.k ? a[(i / 16) * p.k + kk] : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    auto tb = tensor<device half, dextents<int32_t, 2>, tensor_inline>(b + k0 * 16, dextents<int32_t, 2>(16, p.k - k0));
    op.run(ta, tb, acc);
  }
  auto tc = tensor<device float, dextents<int32_t, 2>, tensor_inline>(c, dextents<int32_t, 2>(16, 32));
  acc.store(tc);
}

// C (16 x 24, float, device) += A B, with at = A^T (k x 16) and bt = B^T
// (24 x k): both transposes, dynamic K, two simdgroups.
kernel void mm_transposed(
    device float* at [[buffer(0)]],
    device float* bt [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant MMParams& p [[buffer(3)]]) {
  constexpr auto desc = matmul2d_descriptor(
      16, 24, static_cast<int>(dynamic_extent), true, true, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroups<2>> op;
  auto ta = tensor(at, dextents<int32_t, 2>(16, p.k));
  auto tb = tensor(bt, dextents<int32_t, 2>(p.k, 24));
  auto tc = tensor(c, dextents<int32_t, 2>(24, 16));
  op.run(ta, tb, tc);
}

struct StridedParams {
  int lda, ldb, ldc; // row strides of the three matrices
  int am, k;         // rows and columns of the A view
  int cm, cn;        // rows and columns of the C view
};

// A 16 x 16 tile over strided views: A and B are blocks inside wider
// matrices, C's view is smaller than the tile (elements past it untouched)
// and A has fewer rows than the tile (zeros).
kernel void mm_strided(
    device half* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant StridedParams& p [[buffer(3)]]) {
  constexpr auto desc = matmul2d_descriptor(16, 16, 8, false, false, false, matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroups<1>> op;
  auto ta = tensor(a + 1, dextents<int32_t, 2>(p.k, p.am), array<int, 2>({1, p.lda}));
  auto tb = tensor(b + 2, dextents<int32_t, 2>(16, p.k), array<int, 2>({1, p.ldb}));
  auto tc = tensor(c, dextents<int32_t, 2>(p.cn, p.cm), array<int, 2>({1, p.ldc}));
  op.run(ta, tb, tc);
}

// Stages A in threadgroup memory without a barrier before run(): threads
// read rows other threads have not written yet (NaN in the harness).
kernel void mm_unsynchronised(
    device half* a [[buffer(0)]],
    device half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    uint t [[thread_index_in_threadgroup]]) {
  threadgroup half as[16 * 16];
  for (int i = int(t); i < 16 * 16; i += 32) {
    as[i] = a[i];
  }
  constexpr auto desc = matmul2d_descriptor(16, 16, 16, false, false, false, matmul2d_descriptor::mode::multiply);
  matmul2d<desc, execution_simdgroups<1>> op;
  auto ta = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(as, dextents<int32_t, 2>(16, 16));
  auto tb = tensor(b, dextents<int32_t, 2>(16, 16));
  auto tc = tensor(c, dextents<int32_t, 2>(16, 16));
  op.run(ta, tb, tc);
}
