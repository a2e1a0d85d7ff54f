"""The CUDA routes as the registry (mlx_lattice/routes.py) selects them:
their predicates, priorities and passes. Each name is a key of the CUDA
route table (backends/cuda/routes.py, the functions that run them), or of
the backend's neighbour queries (backends/cuda/__init__.py). Registered in
this order: equal priorities are taken in it. A module of its own beside
backends/cuda/ so that any machine can ask which route a CUDA GPU would take
without loading the CUDA backend."""

from __future__ import annotations

from ..routes import NEIGHBOR_PASSES, Condition, Route, register, register_table_file
from ..route_conditions import KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, DENSE, NBR_ROWS, NBR_BATCHES


def _table_file(route: Route) -> str:
    if set(route.passes) <= set(NEIGHBOR_PASSES):  # the backend's neighbor_queries
        return "mlx_lattice/backends/cuda/__init__.py"
    return "mlx_lattice/backends/cuda/routes.py"


register_table_file("cuda", _table_file)


register(Route(
    name="cuda.grouped_fetch_on_demand", backend="cuda", priority=0, conditions=(DENSE,),
    grouped=True, passes=("forward", "dgrad"), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per (row, output channel) over the CSR edges, reading the C_in / groups "
    "input channels of its group",
))
register(Route(
    name="cuda.grouped_wgrad", backend="cuda", priority=0, conditions=(DENSE,),
    grouped=True, passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per element of the (K, C_in / groups, C_out) weight gradient over chunks "
    "of the kernel-major edges, partial sums reduced in order",
))
HALF = Condition("features float16 or bfloat16", lambda c: c.dtype in ("float16", "bfloat16"))
MMA_CHANNELS = Condition(
    "C_in and C_out multiples of 16, at most 1024",
    lambda c: c.c_in % 16 == 0 and c.c_out % 16 == 0 and c.c_in <= 1024 and c.c_out <= 1024,
)
K_LE_64 = Condition("K <= 64", lambda c: c.k <= 64)
register(Route(
    name="cuda.pointwise_mma", backend="cuda", priority=110,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF, MMA_CHANNELS),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="x @ W[0] on tensor cores: cuda.sorted_mma's kernel over the rows in order (no plan); "
    "one kernel where cuBLAS's matmul costs the host several launches' time",
))
register(Route(
    name="cuda.pointwise", backend="cuda", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/routes.py",
    summary="x @ W[0] with mx.matmul (cuBLAS); half precision only, since float32 matmul "
    "may run in TF32",
))
register(Route(
    name="cuda.sorted_mma", backend="cuda", priority=80,
    conditions=(DENSE, HALF, MMA_CHANNELS, K_LE_64), passes=("forward", "dgrad"),
    kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="output-stationary implicit GEMM on tensor cores (WMMA 16x16x16, fp32 accumulation) "
    "over the sorted plan, 64 rows (128 as a tuner variant) by up to 128 output channels per "
    "block (fewer where a layer's few rows would leave the GPU under-filled); offsets absent from a block's masks are skipped; the input gradient reads W "
    "transposed and mirrored where it lies",
))
register(Route(
    name="cuda.fetch_on_demand", backend="cuda", priority=0, conditions=(DENSE,),
    passes=("forward", "dgrad"), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per (row, output channel) over the CSR edges",
))
register(Route(
    name="cuda.pointwise_wgrad_mma", backend="cuda", priority=110,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF, MMA_CHANNELS),
    passes=("wgrad",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="dW[0] = x^T G on tensor cores: cuda.wgrad_mma's kernel over chunks of rows, partial "
    "sums reduced in order",
))
register(Route(
    name="cuda.pointwise_wgrad", backend="cuda", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, HALF),
    passes=("wgrad",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/routes.py",
    summary="dW[0] = x^T G with mx.matmul (cuBLAS reads x transposed in place); half precision "
    "only, as cuda.pointwise",
))
register(Route(
    name="cuda.wgrad_mma", backend="cuda", priority=80,
    conditions=(DENSE, HALF, MMA_CHANNELS), passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="per-offset X^T G on tensor cores over edge chunks (256 edges at 128 x 128 channels, "
    "longer for wider), up to 128 x 128 of dW per block, partial sums reduced in order",
))
register(Route(
    name="cuda.wgrad_direct", backend="cuda", priority=0, conditions=(DENSE,),
    passes=("wgrad",), kernel_file="mlx_lattice/backends/cuda/kernels.py",
    summary="one thread per weight element over chunks of the kernel-major edges (256 or more), "
    "partial sums reduced in order",
))
register(Route(
    name="cuda.hash_map", backend="cuda", priority=0, conditions=(), passes=("map",),
    kernel_file="mlx_lattice/backends/cuda/maps.py",
    summary="atomicCAS table on packed keys; one thread per (row, offset), symmetric half lookup; "
    "count then fill with one host sync per map; arrays equal to cpu.hash_map's",
))

# The grid's cell side is a float32 (CUDA's distances are float64).
NBR_RADIUS_FINITE = Condition(
    "radius a positive finite float32 (2^-149 <= radius < 2^128)", lambda c: 2.0**-149 <= c.radius < 2.0**128
)
register(Route(
    name="cuda.knn", backend="cuda", priority=0, conditions=(NBR_ROWS, NBR_BATCHES), passes=("knn",),
    uses_relation=False, kernel_file="mlx_lattice/backends/cuda/neighbors.py",
    summary="dense grid per batch item (count, scan, fill); one thread per query over Chebyshev "
    "shells of cells with a bounded list in its output slice; float64 squared distances in the "
    "CPU's order: arrays equal to cpu.knn's; one host sync (the edge count)",
))
register(Route(
    name="cuda.radius", backend="cuda", priority=0, conditions=(NBR_ROWS, NBR_BATCHES, NBR_RADIUS_FINITE),
    passes=("radius",), uses_relation=False, kernel_file="mlx_lattice/backends/cuda/neighbors.py",
    summary="the grid of cuda.knn; one thread per query over the cells of [x - r, x + r], count then "
    "fill; arrays equal to cpu.radius's; one host sync (the edge count)",
))
