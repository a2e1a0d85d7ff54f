"""The Metal routes as the registry (mlx_lattice/routes.py) selects them:
their predicates, priorities and passes. Each name is a key of the route
table of its kernels' family, src/metal/<family>.cpp beside
metal/<family>.metal. Registered in this order: equal priorities are taken in
it. A module of its own beside backends/metal/ so that any machine can ask
which route a Mac would take without loading the Metal backend."""

from __future__ import annotations

from ..routes import Condition, Route, register, register_table_file
from ..route_conditions import KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, DENSE, NBR_ROWS, NBR_BATCHES


def _table_file(route: Route) -> str:
    # the host code beside the kernels' family
    return "src/metal/" + route.kernel_file.split("/")[-1].replace(".metal", ".cpp")


register_table_file("metal", _table_file)


METAL_DTYPES = Condition("features float32 or float16", lambda c: c.dtype in ("float32", "float16"))
SORTED_KIND = Condition(
    "map kind forward, target or submanifold",
    lambda c: c.map_kind in ("forward", "target", "submanifold"),
)
FP16 = Condition("features float16", lambda c: c.dtype == "float16")
FP32 = Condition("features float32", lambda c: c.dtype == "float32")
K27 = Condition("K == 27", lambda c: c.k == 27)
SQUARE_32_64 = Condition("C_in == C_out in {32, 64}", lambda c: c.c_in == c.c_out and c.c_in in (32, 64))
DENSE_LAYOUT = Condition("5D dense weight", lambda c: c.weight_layout == "dense5d")
CHANNELS_16_64 = Condition(
    "C_in and C_out in {16, 32, 64}", lambda c: c.c_in in (16, 32, 64) and c.c_out in (16, 32, 64)
)
K_GE_16 = Condition("K >= 16", lambda c: c.k >= 16)
CAP_4096 = Condition("output capacity >= 4096", lambda c: c.n_out >= 4096)
COUT16 = Condition(
    "C_out == 16 and (K >= 16 and output capacity >= 4096, or output capacity >= 50000)",
    lambda c: c.c_out == 16 and ((c.k >= 16 and c.n_out >= 4096) or c.n_out >= 50000),
)
COUT_DIV4 = Condition("C_out divisible by 4", lambda c: c.c_out % 4 == 0)
register(Route(
    name="metal.pointwise", backend="metal", matrix_unit=True, priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, METAL_DTYPES),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="metal/forward_dense.metal",
    summary="GEMM x @ W[0] on simdgroup matrices, any C_in and C_out: 64 rows x 16, 32 or 64 "
    "output channels per threadgroup (4 simdgroups of 8x8 float fragments, each 32 rows, float "
    "accumulation), x and W[0] staged 32 input channels at a time through threadgroup memory "
    "with masked loads",
))
register(Route(
    name="metal.sorted_gemm", backend="metal", matrix_unit=True, priority=90,
    conditions=(DENSE, SORTED_KIND, FP16, K27, SQUARE_32_64),
    kernel_file="metal/sorted_gemm.metal",
    summary="direct sorted route: rows in neighbour-mask order, 64-row tiles, offsets skipped "
    "by tile mask, simdgroup 8x8 matrices, rows written back through reorder_rows",
))
TENSOR_OPS = Condition("TensorOps available (Metal 4 neural accelerators)", lambda c: c.tensor_ops)
register(Route(
    name="metal.tensorops_sorted", backend="metal", matrix_unit=True, priority=95,
    conditions=(DENSE, SORTED_KIND, FP16, K27, SQUARE_32_64, TENSOR_OPS),
    kernel_file="metal/tensorops_sorted.metal",
    summary="TensorOps sorted contraction on the sorted plan: row-stationary 64-row tiles, "
    "one MetalPerformancePrimitives matmul2d per offset in the tile mask over four "
    "simdgroups, float accumulator in a cooperative tensor, rows written back through "
    "reorder_rows",
))
register(Route(
    name="metal.dense_channel", backend="metal", matrix_unit=True, priority=80,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, K_GE_16, CAP_4096, METAL_DTYPES),
    kernel_file="metal/forward_dense.metal",
    summary="neighbour-map traversal on simdgroup matrices, compile-time channel counts: 32 rows "
    "x C_out per threadgroup, consecutive in the relation's row order (rows sorted by their "
    "offset set, the sorted plan's reorder_rows, written back in place; 4 simdgroups of 8x8 "
    "float fragments, float accumulation); offsets "
    "in order, those no row of the tile has skipped; each offset's gathered rows (zeros where a "
    "row lacks it) and W[k] staged once through threadgroup memory",
))
register(Route(
    name="metal.cout16", backend="metal", matrix_unit=True, priority=70,
    conditions=(DENSE, COUT16, METAL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/csr_mma.metal",
    summary="C_out == 16 on the kernels of metal.csr_mma at their 16-channel column block: 32 "
    "rows of the view's row order x 16 output channels per threadgroup (4 simdgroups of 8x8 "
    "float fragments), rows' "
    "edges taken in offset rounds, any C_in staged 16 channels at a time with masked loads",
))

# The matrix-unit route: every dense float product the routes above do not
# take, in any dtype, ahead of the scalar routes below (the order's reason is
# in its summary).
METAL_ALL_DTYPES = Condition(
    "features float32, float16 or bfloat16", lambda c: c.dtype in ("float32", "float16", "bfloat16")
)
register(Route(
    name="metal.csr_mma", backend="metal", matrix_unit=True, priority=65,
    conditions=(DENSE, METAL_ALL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/csr_mma.metal",
    summary="implicit GEMM on simdgroup matrices over the CSR edges of either view, any C_in, "
    "C_out and K: 32 rows x 16-128 output channels per threadgroup, the rows consecutive in the "
    "view's row order (rows sorted by the set of offsets they have: Relation::row_order, the "
    "sorted plan's reorder_rows for the output-major view), so a block's rows mostly share "
    "their offsets (4 simdgroups of 8x8 float "
    "fragments, float accumulation); each round takes the smallest offset pending among the 32 "
    "rows (offsets absent from the block never visited) and stages their gathered rows and W[k], "
    "16 input channels at a time, through threadgroup memory with masked loads. Priority: below "
    "the seed routes, which move fewer bytes or pad fewer MACs per row where they apply (rows "
    "grouped by neighbour mask; compile-time channels, W[k] staged once per offset); above the "
    "scalar routes, which per row read each gathered x row once per 1-4 output channels (this: "
    "once per 16-128) and run its E x C_in x C_out MACs one lane at a time (this: on 8x8 "
    "matrices, channels padded to multiples of 8, rows to the block's rounds)",
))

# Its TensorOps twin where the GPU has them (Apple10, macOS >= 26.2): the
# same program with each staged slice's products on the neural accelerators.
register(Route(
    name="metal.tensorops_csr_mma", backend="metal", matrix_unit=True, priority=66,
    conditions=(DENSE, METAL_ALL_DTYPES, TENSOR_OPS), passes=("forward", "dgrad"),
    kernel_file="metal/tensorops_csr_mma.metal",
    summary="metal.csr_mma's program with TensorOps products, either view, any C_in, C_out "
    "and K: the same 32 rows of the view's row order x 16-128 output channels per threadgroup, "
    "the same rounds of the smallest offset pending among the 32 rows (metal/csr_rounds.h) and "
    "the same staging of their gathered rows and W[k] as float, 16 input channels at a time, "
    "through threadgroup memory with masked loads (metal/mma_tile.h); each staged slice "
    "multiplied by one matmul2d (32 x BN x 16, float accumulator in a cooperative tensor) over "
    "four simdgroups, the tile written once at the end (masked, through the row order). "
    "Against metal.csr_mma, its direct twin (the route on every GPU without TensorOps): the "
    "same reads of x and W per round (each gathered row once per column block, W[k]'s slice "
    "once per 32 rows) and the same padded MACs (channels to 16 and the block, rows to the "
    "block's rounds), run on the neural accelerators instead of as BN/4 simdgroup 8x8 "
    "multiply-accumulates per simdgroup and slice; staged rows without the 8x8 loads' bank "
    "padding; one "
    "extra pass of the 32 x BN float tile through threadgroup memory per threadgroup. "
    "Priority: just above metal.csr_mma; below every seed route, which moves fewer bytes or "
    "pads fewer MACs per row where it applies",
))
register(Route(
    name="metal.vec4", backend="metal", priority=60,
    conditions=(DENSE, FP32, COUT_DIV4), passes=("forward", "dgrad"),
    kernel_file="metal/forward_vector.metal",
    summary="one thread per (row, 4 output channels), float4 arithmetic",
))
register(Route(
    name="metal.fp16_gather", backend="metal", priority=50,
    conditions=(DENSE, FP16), passes=("forward", "dgrad"),
    kernel_file="metal/forward_vector.metal",
    summary="one simdgroup per row; each edge's input row staged in threadgroup memory",
))
register(Route(
    name="metal.fp32_atomic", backend="metal", priority=40,
    conditions=(DENSE, FP32), deterministic=False,
    kernel_file="metal/forward_vector.metal",
    summary="one thread per (edge, channel), float atomics into a zeroed output",
))
register(Route(
    name="metal.fetch_on_demand", backend="metal", priority=0,
    conditions=(DENSE, METAL_DTYPES), passes=("forward", "dgrad"),
    kernel_file="metal/fetch_on_demand.metal",
    summary="one thread per (row, output channel) over the CSR edges",
))
register(Route(
    name="metal.wgrad_direct", backend="metal", priority=0,
    conditions=(DENSE, METAL_DTYPES), passes=("wgrad",),
    kernel_file="metal/fetch_on_demand.metal",
    summary="one thread per weight element over the kernel-major edges",
))

# Backward routes. An autodiff context describes the product being computed:
# for the input gradient (dgrad), C_in/C_out are the product's channels (the
# convolution's C_out/C_in) and n_out its rows, i.e. the convolution's input
# capacity; for the weight gradient (wgrad), n_in is the input capacity.
DGRAD_CAP_4096 = Condition("input capacity >= 4096", lambda c: c.n_out >= 4096)
DGRAD_CAP_65536 = Condition("input capacity >= 65536", lambda c: c.n_out >= 65536)
DGRAD_CAP_32768 = Condition("input capacity >= 32768", lambda c: c.n_out >= 32768)
WGRAD_CAP_32768 = Condition("input capacity >= 32768", lambda c: c.n_in >= 32768)
C16_SQUARE = Condition("C_in == C_out == 16", lambda c: c.c_in == 16 and c.c_out == 16)
MAPPED_LAYOUT = Condition(
    "weight mapped to kernel-major (K, C_in, C_out) (dense 5D or mapped; not packed)",
    lambda c: c.weight_layout in ("dense5d", "mapped"),
)
SQUARE_16_64 = Condition(
    "C_in == C_out in {16, 32, 64}", lambda c: c.c_in == c.c_out and c.c_in in (16, 32, 64)
)
EDGES_4096 = Condition("edges >= 4096", lambda c: c.edges >= 4096)
COUT_16 = Condition("C_out == 16", lambda c: c.c_out == 16)
CHANNELS_DIV4 = Condition("C_in and C_out divisible by 4", lambda c: c.c_in % 4 == 0 and c.c_out % 4 == 0)
register(Route(
    name="metal.tensorops_dgrad", backend="metal", matrix_unit=True, priority=88,
    conditions=(DENSE, C16_SQUARE, K_GE_16, MAPPED_LAYOUT, DGRAD_CAP_32768, TENSOR_OPS, FP32),
    passes=("dgrad",), kernel_file="metal/tensorops_backward.metal",
    summary="TensorOps input-gradient contraction: 64 input rows per threadgroup, one "
    "matmul2d (64x16 by 16x16, float) per offset present in the tile, gathered through the "
    "input-major neighbour map; accumulator in a cooperative tensor",
))
register(Route(
    name="metal.dgrad_dense_grouped", backend="metal", matrix_unit=True, priority=86,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, DGRAD_CAP_65536, METAL_DTYPES),
    passes=("dgrad",), kernel_file="metal/forward_dense.metal",
    summary="grouped dense-channel input gradient: as metal.dgrad_dense_channel in 64-row tiles "
    "(4 simdgroups of 32 rows x C_out/2), so every W[k] staged in threadgroup memory serves "
    "twice the rows; C_in 64 staged in two 32-channel slices where the tiles would pass 28 KiB",
))
register(Route(
    name="metal.dgrad_dense_channel", backend="metal", matrix_unit=True, priority=84,
    conditions=(DENSE, DENSE_LAYOUT, CHANNELS_16_64, DGRAD_CAP_4096, METAL_DTYPES),
    passes=("dgrad",), kernel_file="metal/forward_dense.metal",
    summary="dense-channel input gradient: the simdgroup-matrix kernels of metal.dense_channel "
    "(32 rows x C_out per threadgroup) over the input-major neighbour map (N_in, K), W "
    "transposed per offset; the rows tiled in the input-major row order (input rows sorted by "
    "their offset set)",
))
register(Route(
    name="metal.tensorops_wgrad", backend="metal", matrix_unit=True, priority=90,
    conditions=(DENSE, CHANNELS_16_64, K_GE_16, WGRAD_CAP_32768, TENSOR_OPS, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/tensorops_backward.metal",
    summary="partitioned TensorOps contraction: threadgroup (p, k) sums x^T ct over 32-edge "
    "chunks p, p+P, ... of offset k with matmul2d into a float partial; a second kernel "
    "(metal/backward.metal) adds the P partials in order",
))

# The matrix-unit weight gradient: every dense product's, in any dtype (so a
# bfloat16 product on metal.csr_mma has its gradients on the GPU), ahead of
# the scalar wgrad_* routes below (the order's reason is in its summary).
register(Route(
    name="metal.wgrad_mma", backend="metal", matrix_unit=True, priority=50,
    conditions=(DENSE, METAL_ALL_DTYPES), passes=("wgrad",),
    kernel_file="metal/wgrad_mma.metal",
    summary="x^T ct on simdgroup matrices over the kernel-major edges, any C_in, C_out and K: a "
    "32 x 32 or 32 x 64 block of dW[k] per threadgroup (4 simdgroups of 8x8 float fragments), "
    "16-edge chunks of x rows (transposed) and ct rows staged through threadgroup memory with "
    "masked loads; P partitions of an offset's chunks (about 512 edges each, P fixed by the "
    "shapes) into float partials that wgrad_reduce (metal/backward.metal) adds in order, or dW "
    "directly when P is 1. Priority: below the TensorOps contraction; above the scalar wgrad_* "
    "routes, which read each edge's x and ct rows once per element block of 1-16 weights (this: "
    "once per 32 x 32-64 block) and run the E x C_in x C_out MACs one lane at a time (this: on "
    "8x8 matrices, channels and edges padded to multiples of 8)",
))

# Its TensorOps twin where the GPU has them (Apple10, macOS >= 26.2): the
# same program with the chunk products on the neural accelerators.
register(Route(
    name="metal.tensorops_wgrad_mma", backend="metal", matrix_unit=True, priority=55,
    conditions=(DENSE, METAL_ALL_DTYPES, TENSOR_OPS), passes=("wgrad",),
    kernel_file="metal/tensorops_wgrad_mma.metal",
    summary="metal.wgrad_mma's program with TensorOps products, any C_in, C_out and K: the same "
    "32 x 32 or 32 x 64 blocks of dW[k], 16-edge chunks, P partitions and ordered wgrad_reduce "
    "(metal/backward.metal); each chunk's x rows and ct rows staged through threadgroup memory "
    "(float32 and float16 as they are, bfloat16 as float) and multiplied by one matmul2d "
    "(32 x BN x 16, float accumulator in a cooperative tensor) over four simdgroups. Against "
    "metal.wgrad_mma, its direct twin (the route on every GPU without TensorOps): the same reads "
    "of x and ct per edge (once per output block / input block) and the same padded MACs "
    "(channels to the block, edges to 16), run on the neural accelerators instead of as "
    "BN/4 simdgroup 8x8 multiply-accumulates per simdgroup and chunk; half the staged bytes in "
    "float16; one extra pass of the 32 x BN float block through threadgroup memory per "
    "threadgroup. Priority: just above "
    "metal.wgrad_mma; below metal.tensorops_wgrad, whose compile-time 16-64 channel tiles cover "
    "a whole dW[k] per threadgroup with 32-edge chunks where it applies",
))
register(Route(
    name="metal.wgrad_dense_square", backend="metal", priority=40,
    conditions=(DENSE, SQUARE_16_64, EDGES_4096, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one threadgroup per offset, compile-time channels; 32 edges of x and ct staged "
    "in threadgroup memory per step, each thread owning C*C/256 elements of dW[k]",
))
register(Route(
    name="metal.wgrad_cout16", backend="metal", priority=30,
    conditions=(DENSE, COUT_16, METAL_DTYPES),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one thread per (offset, input channel) computing all 16 output channels",
))
register(Route(
    name="metal.wgrad_block4", backend="metal", priority=20,
    conditions=(DENSE, FP32, CHANNELS_DIV4),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="one thread per 4x4 block of dW[k], float4 loads, an outer product per edge",
))
register(Route(
    name="metal.wgrad_fp16", backend="metal", priority=10,
    conditions=(DENSE, FP16),
    passes=("wgrad",), kernel_file="metal/backward.metal",
    summary="a 32x8 block of dW[k] per threadgroup; 32 edges staged (as float) in "
    "threadgroup memory and shared by the block",
))

# Quantized routes (QuantizedWeight; inference). A QuantizedWeight's group
# size divides C_in, so its storage channels always equal the logical ones.
QUANTIZED = Condition("quantized weight (QuantizedWeight)", lambda c: c.quantized)
CHANNELS_32_64 = Condition(
    "C_in and C_out in {32, 64}", lambda c: c.c_in in (32, 64) and c.c_out in (32, 64)
)
GROUP_LE_CIN = Condition("group size <= C_in", lambda c: 0 < c.group_size <= c.c_in)
GROUP_EQ_CIN = Condition("group_size == C_in", lambda c: c.group_size == c.c_in)
TIER_KNOWN = Condition(
    "TensorOps tier not unavailable (GPU tier detected)", lambda c: "unknown" not in c.tier
)
register(Route(
    name="metal.tensorops_quantized", backend="metal", matrix_unit=True, priority=95,
    conditions=(QUANTIZED, SORTED_KIND, FP16, K27, CHANNELS_32_64, GROUP_EQ_CIN, TENSOR_OPS),
    kernel_file="metal/tensorops_quantized.metal",
    summary="TensorOps quantized contraction on the sorted plan: per offset in a 64-row "
    "tile's mask, W[k] dequantized into a temporary fp16 tile, one matmul2d over four "
    "simdgroups into a float cooperative tensor, rows written back through reorder_rows",
))
register(Route(
    name="metal.sorted_quantized", backend="metal", matrix_unit=True, priority=90,
    conditions=(QUANTIZED, SORTED_KIND, FP16, K27, CHANNELS_32_64, GROUP_LE_CIN, TIER_KNOWN),
    kernel_file="metal/quantized.metal",
    summary="sorted quantized implicit GEMM: the tiles and masks of the direct sorted route, "
    "W[k] dequantized into threadgroup memory 32 input channels at a time, simdgroup 8x8 "
    "matrices, rows written back through reorder_rows",
))
register(Route(
    name="metal.quantized_fetch_on_demand", backend="metal", priority=0,
    conditions=(QUANTIZED, METAL_ALL_DTYPES),
    kernel_file="metal/quantized.metal",
    summary="direct packed convolution, float32/float16/bfloat16 features x int4/int8 codes: one "
    "thread per (row, output channel) over the CSR edges, codes read in place and the "
    "affine reconstruction applied per group (s * sum x q + b * sum x)",
))

# Grouped products on matrix units: metal.csr_mma's and metal.wgrad_mma's
# kernels with a group dimension, where a group has at least 8 input and 8
# output channels (one 8x8 fragment's worth); narrower groups (depthwise)
# keep the scalar kernels, whose one-lane products pad nothing.
GROUP_CHANNELS_8 = Condition(
    "C_in / groups >= 8 and C_out / groups >= 8",
    lambda c: c.c_in // c.groups >= 8 and c.c_out // c.groups >= 8,
)
register(Route(
    name="metal.grouped_csr_mma", backend="metal", matrix_unit=True, priority=10,
    conditions=(DENSE, METAL_ALL_DTYPES, GROUP_CHANNELS_8), grouped=True,
    passes=("forward", "dgrad"), kernel_file="metal/csr_mma.metal",
    summary="the implicit GEMM of metal.csr_mma per group: a threadgroup per (block of 32 rows of "
    "the view's row order, "
    "group, column block of 16-128 of the group's outputs), the group's slice of the gathered "
    "rows and of W[k] staged 16 input channels at a time, 8x8 float fragments, the same rounds "
    "and fixed order. Per output row of E edges it reads E x C_in input values once per column "
    "block of a group (once for groups of <= 128 outputs), W[k]'s group slices once per 32 rows, "
    "and writes C_out values once; its E x C_in / G x C_out MACs run on 8x8 matrices with "
    "C_in / G padded to a multiple of 8 and C_out / G to the column block (2x at 8 "
    "channels a group). Priority: above metal.grouped_fetch_on_demand, which per row reads each "
    "gathered input value once per output channel of its group (C_out / G times) and each W "
    "element once per edge, and runs the same MACs one lane at a time",
))
register(Route(
    name="metal.grouped_wgrad_mma", backend="metal", matrix_unit=True, priority=10,
    conditions=(DENSE, METAL_ALL_DTYPES, GROUP_CHANNELS_8), grouped=True, passes=("wgrad",),
    kernel_file="metal/wgrad_mma.metal",
    summary="the weight gradient of metal.wgrad_mma per group: a 32 x 32 or 32 x 64 block of "
    "one group's dW[k] per threadgroup (blocks over group, input block, output block), 16-edge "
    "chunks of the group's x columns (transposed) and ct columns staged through threadgroup "
    "memory, P partitions of each offset's chunks reduced in order. Per edge it reads the "
    "group's C_in / G x values once per output block and C_out / G ct values once per input "
    "block; its E x C_in / G x C_out MACs run on 8x8 matrices, C_in / G padded to 32 and "
    "C_out / G to 32 or 64 (16x at 8 channels a group). Priority: above "
    "metal.grouped_wgrad, whose one thread per weight element reads both values of every edge "
    "of its offset (2 x E x C_in / G x C_out reads) and runs the MACs one lane at a time, with "
    "only K x C_in / G x C_out threads",
))
register(Route(
    name="metal.grouped_fetch_on_demand", backend="metal", priority=0,
    conditions=(DENSE, METAL_ALL_DTYPES), grouped=True, passes=("forward", "dgrad"),
    kernel_file="metal/grouped.metal",
    summary="one thread per (row, output channel) over the CSR edges, reading the C_in / groups "
    "input channels of its group",
))
register(Route(
    name="metal.grouped_wgrad", backend="metal", priority=0,
    conditions=(DENSE, METAL_ALL_DTYPES), grouped=True, passes=("wgrad",),
    kernel_file="metal/grouped.metal",
    summary="one thread per element of the (K, C_in / groups, C_out) weight gradient over chunks "
    "of the kernel-major edges, partial sums reduced in order",
))
register(Route(
    name="metal.hash_map", backend="metal", priority=0, conditions=(), passes=("map",),
    kernel_file="metal/map_build.metal",
    summary="32-bit CAS table of row indices; one thread per output row, count then fill with one host "
    "sync per map; supports by a bitonic sort of candidate keys; arrays equal to cpu.hash_map's",
))

# Float32 squared distances: (2 * 2^60)^2 * 3 and (2^60)^2 stay finite, and
# (2^-60)^2 normal.
NBR_RANGE_F32 = Condition(
    "coordinates within 2^60 of the origin (float32 squared distances)", lambda c: c.coord_max <= 2.0**60
)
NBR_RADIUS_F32 = Condition(
    "2^-60 <= radius <= 2^60 (float32 squared radius)", lambda c: 2.0**-60 <= c.radius <= 2.0**60
)
register(Route(
    name="metal.knn", backend="metal", priority=0, conditions=(NBR_ROWS, NBR_BATCHES, NBR_RANGE_F32),
    passes=("knn",), uses_relation=False, kernel_file="metal/neighbors.metal",
    summary="dense grid per batch item (count, scan, fill); one thread per query over Chebyshev "
    "shells of cells with a bounded max-heap in its output slice, sorted in place; integral "
    "coordinates: 64-bit integer squared distances (cpu.knn's neighbours), else float32; one host "
    "sync (the edge count)",
))
register(Route(
    name="metal.radius", backend="metal", priority=0,
    conditions=(NBR_ROWS, NBR_BATCHES, NBR_RANGE_F32, NBR_RADIUS_F32),
    passes=("radius",), uses_relation=False, kernel_file="metal/neighbors.metal",
    summary="the grid of metal.knn; one thread per query over the cells of [x - r, x + r], count "
    "then fill (a bounded max-heap, sorted in place); integral coordinates: 64-bit integer squared "
    "distances (cpu.radius's neighbours, boundary included), else float32; one host sync",
))
