"""The CPU routes as the registry (mlx_lattice/routes.py) selects them: their
predicates, priorities and passes. Each name is a key of the extension's
table (src/cpu/routes.cpp), or a method of the CPU backend (map building and
neighbour queries: backends/cpu.py). Registered in this order: equal
priorities are taken in it."""

from __future__ import annotations

from ..routes import NEIGHBOR_PASSES, Condition, Route, register, register_table_file
from ..route_conditions import KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND, DENSE


def _table_file(route: Route) -> str:
    # map building and queries are the backend's own methods; the products
    # are entries of the extension's table
    if route.passes == ("map",) or set(route.passes) <= set(NEIGHBOR_PASSES):
        return "mlx_lattice/backends/cpu.py"
    return "src/cpu/routes.cpp"


register_table_file("cpu", _table_file)


register(Route(
    name="cpu.pointwise", backend="cpu", priority=100,
    conditions=(DENSE, KERNEL_1, STRIDE_1, NO_PAD_DIL, NO_TARGET, FORWARD_KIND),
    passes=("forward", "dgrad"), uses_relation=False, kernel_file="src/cpu/gather_conv.cpp",
    summary="x.feats @ W[0] in the blocked GEMM kernel; keeps the input coordinates; no relation built",
))
register(Route(
    name="cpu.gather_gemm", backend="cpu", priority=0, conditions=(DENSE,),
    passes=("forward", "dgrad"), kernel_file="src/cpu/gather_conv.cpp",
    summary="blocked gather-GEMM: per block of output rows, edges by offset (from the "
    "relation's offset groups, made once per view), "
    "SIMD register tiles, float32 accumulation (in the float32 output itself where "
    "edges per row x C_in <= 200); weight panels packed through W's strides",
))

# Narrow inputs whose weight panel (K x C_in x C_out, C_out padded to 16)
# fits in 32 KiB of L1: a network's stem (C_in <= 8), and 16-channel strided
# layers (K <= 8: one or two edges per row), whose products are too short
# for the grouping by offset to pay off.
ROW_MAJOR_NARROW = Condition(
    "(C_in <= 8, or C_in <= 16 and K <= 8) and K * C_in * round_up(C_out, 16) * 4 <= 32 KiB",
    lambda c: (c.c_in <= 8 or (c.c_in <= 16 and c.k <= 8))
    and c.k * c.c_in * -(-c.c_out // 16) * 16 * 4 <= 32 << 10,
)
register(Route(
    name="cpu.row_gather", backend="cpu", priority=10, conditions=(DENSE, ROW_MAJOR_NARROW),
    passes=("forward", "dgrad"), kernel_file="src/cpu/gather_conv.cpp",
    summary="the gather-GEMM's row-major traversal for narrow inputs: edges in the view's "
    "order, several rows' products in lockstep, each row summed in registers and written "
    "once (no grouping by offset); the same sums as cpu.gather_gemm, bit for bit",
))
register(Route(
    name="cpu.wgrad_gemm", backend="cpu", priority=0, conditions=(DENSE,),
    passes=("wgrad",), kernel_file="src/cpu/weight_grad.cpp",
    summary="per-offset GEMM over packed panels of gathered rows; chunks by output-row block (all offsets of a block together, >= 512 edges a chunk on average), reduced in block order; written in the (C_out, K, C_in) parameter order",
))
register(Route(
    name="cpu.quantized_gather_gemm", backend="cpu", priority=0,
    conditions=(Condition("quantized weight (QuantizedWeight)", lambda c: c.quantized),),
    kernel_file="src/cpu/gather_conv.cpp",
    summary="int4/int8 codes unpacked (scale * q + bias) into the blocked gather-GEMM's "
    "float32 weight panels; any relation, any feature dtype",
))

# Grouped / depthwise convolution (groups > 1): weight (K, C_in / groups, C_out).
register(Route(
    name="cpu.grouped_gather", backend="cpu", priority=0, conditions=(DENSE,), grouped=True,
    passes=("forward", "dgrad"), kernel_file="src/cpu/grouped_conv.cpp",
    summary="per row, per edge and per input channel of a group, one SIMD multiply-add across "
    "all output channels (the group's input spread over its outputs; the row itself when "
    "depthwise); float32 accumulation in edge order",
))
register(Route(
    name="cpu.grouped_wgrad", backend="cpu", priority=0, conditions=(DENSE,), grouped=True,
    passes=("wgrad",), kernel_file="src/cpu/grouped_conv.cpp",
    summary="per-offset 2048-edge chunks of per-group outer products into float32 partials, "
    "added in chunk order",
))

# Relations (hash table, output support, CSR edges, neighbour map) are built
# where the coordinates are hashed: CUDA or Metal when the default device is
# such a GPU.
register(Route(
    name="cpu.hash_map", backend="cpu", priority=0, conditions=(), passes=("map",),
    kernel_file="src/cpu/kernel_map.cpp",
    summary="open-addressing table on packed keys; relations by batched lookups, count then fill",
))
register(Route(
    name="cpu.knn", backend="cpu", priority=0, conditions=(), passes=("knn",), uses_relation=False,
    kernel_file="src/cpu/neighbors.cpp",
    summary="hash grid of (batch, cell) keys; Chebyshev shells of cells around the query, clipped to "
    "its item's box, with a bounded max-heap; float64 squared distances; 512-query chunks on the "
    "thread pool",
))
register(Route(
    name="cpu.radius", backend="cpu", priority=0, conditions=(), passes=("radius",), uses_relation=False,
    kernel_file="src/cpu/neighbors.cpp",
    summary="hash grid of (batch, cell) keys, cells 1.001 r wide; the 27 cells around the query; "
    "float64 squared distances, hits sorted per query and laid out by the counts' prefix sum",
))
