"""Sparse convolution operations.

Each op equals the dense operation on the voxel grid (features zero where no
voxel is active) read out at the op's output support; see docs/semantics.md.
Weights are dense 5D ``(C_out, Kx, Ky, Kz, C_in // groups)`` as in
``mlx.nn.Conv3d``; ``groups`` splits the channels into groups convolved
separately (``groups == C_in``: depthwise).

:func:`record_products` collects every convolution product the ops run in a
block (its route, arrays, relation and host time), for profilers that
replay or time them.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import mlx.core as mx

from . import autodiff, backends, routes, tuning
from ._args import dtype_name, triple
from ._recorder import CallRecorder
from .quantized import QuantizedWeight
from .relation import KernelGeometry, Relation
from .tensor import SparseTensor, target_set

__all__ = ["conv3d", "subm_conv3d", "conv_transpose3d", "generative_conv_transpose3d", "linear"]


class Product(NamedTuple):
    """One convolution product an op ran (see :func:`record_products`)."""

    op: str  # conv3d, subm_conv3d, conv_transpose3d, ...
    kind: str  # the map kind: submanifold, forward, transposed, generative, target
    geometry: KernelGeometry
    route: str  # the route's name
    backend: str  # the route's backend: cpu, metal or cuda
    x: mx.array  # the input features, as the kernel read them
    # the weight as the product took it: kernel-major (K, C_in // groups,
    # C_out), or the parameter itself where the backend reads it in place
    # (layout.is_parameter); the QuantizedWeight when quantized
    weight: object
    quantized: bool
    native: object  # the relation's native maps (None: pointwise)
    view: object  # the backend's product view of the relation (None: pointwise)
    stream: mx.Stream
    groups: int
    variant: dict | None  # the route's tile shapes, where it has some (CUDA)
    host_s: float  # host seconds of the call, building its relation included


_products = CallRecorder()


def record_products():
    """``with record_products() as products: ...`` collects a :class:`Product`
    for every convolution product the ops run in the block, in call order
    (in every open block, when they nest). With a product's ``x``,
    ``weight``, ``view``, ``route`` and ``groups`` the same product can be
    run again, with its autodiff (``autodiff.conv`` on
    ``backends.get(backend)``); ``host_s`` is the host time the op
    spent on it (MLX runs the kernel later, at evaluation)."""
    return _products.record()


def _check_groups(op: str, groups, c_in: int, c_out: int) -> int:
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise TypeError(f"{op}: groups must be an int, got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"{op}: groups must be >= 1, got {groups}")
    if c_in % groups or c_out % groups:
        raise ValueError(
            f"{op}: groups={groups} must divide both C_in={c_in} and C_out={c_out}"
        )
    return groups


def _check(op: str, x, weight, bias, groups=1, shape=None):
    """The call's checks; ``shape``: the 5D shape to check the weight as
    (a linear layer's weight as its 1x1x1 convolution)."""
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{op}: x must be a SparseTensor, got {type(x).__name__}")
    if not isinstance(weight, (mx.array, QuantizedWeight)):
        raise TypeError(
            f"{op}: weight must be an mx.array or a QuantizedWeight, got {type(weight).__name__}"
        )
    c_in = x.feats.shape[1]
    shape = tuple(weight.shape) if shape is None else shape
    if len(shape) != 5:
        raise ValueError(
            f"{op}: weight must have shape (C_out, Kx, Ky, Kz, C_in) (last axis "
            f"C_in // groups when grouped), got {shape}"
        )
    _check_groups(op, groups, c_in, int(shape[0]))
    if groups > 1 and isinstance(weight, QuantizedWeight):
        raise ValueError(
            f"{op}: groups={groups} takes a float weight, not a QuantizedWeight; "
            "call .dequantize()"
        )
    if shape[4] * groups != c_in:
        if groups == 1:
            raise ValueError(
                f"{op}: weight has C_in={shape[4]} (last axis of "
                f"{'(C_out, C_in)' if op == 'linear' else '(C_out, Kx, Ky, Kz, C_in)'}) "
                f"but x has {c_in} channels"
            )
        raise ValueError(
            f"{op}: weight's last axis is {shape[4]}, expected C_in // groups = "
            f"{c_in} // {groups} = {c_in // groups}"
        )
    if isinstance(weight, QuantizedWeight) and x.feats.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        raise TypeError(f"{op}: features must be floating for a quantized weight")
    if min(shape[:4]) < 1:
        raise ValueError(f"{op}: weight shape {shape} has an empty axis")
    if weight.dtype != x.feats.dtype and not isinstance(weight, QuantizedWeight):
        raise TypeError(
            f"{op}: weight dtype {dtype_name(weight.dtype)} does not match feats dtype "
            f"{dtype_name(x.feats.dtype)}; cast one of them"
        )
    if bias is not None:
        if not isinstance(bias, mx.array):
            raise TypeError(f"{op}: bias must be an mx.array, got {type(bias).__name__}")
        if tuple(bias.shape) != (shape[0],):
            raise ValueError(f"{op}: bias must have shape ({shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype != x.feats.dtype:
            raise TypeError(
                f"{op}: bias dtype {dtype_name(bias.dtype)} does not match feats dtype "
                f"{dtype_name(x.feats.dtype)}"
            )
    return tuple(int(k) for k in shape[1:4])


def _execute(op, x, weight, bias, geom, kind, out_set, relation_fn, explicit_target=False, groups=1):
    """Select (and record) a route, run it and wrap the output."""
    t0 = time.perf_counter()
    # A GPU this install has no kernels for runs the call on the CPU, on record.
    backend, unusable = backends.executing()
    pointwise = relation_fn is None
    relation: Relation | None = None if pointwise else relation_fn()
    stats = (
        {"n_in": len(x), "n_out": len(x), "edges": len(x)} if pointwise else relation.stats()
    )
    quantized = isinstance(weight, QuantizedWeight)
    ctx = routes.context(
        op,
        backend.name,
        map_kind=kind,
        dtype=dtype_name(x.feats.dtype),
        kernel_size=geom.kernel_size,
        stride=geom.stride,
        padding=geom.padding,
        dilation=geom.dilation,
        explicit_target=explicit_target,
        c_in=int(weight.shape[-1]) * groups,
        quantized=quantized,
        weight_layout="packed" if quantized else "dense5d",
        group_size=weight.group_size if quantized else 0,
        c_out=int(weight.shape[0]),
        n_in=stats["n_in"],
        n_out=stats["n_out"],
        edges=stats["edges"],
        groups=groups,
    )
    # The call's data, should the route tuner measure this shape now.
    probe = tuning.probe(x.feats, weight, relation, groups) if relation is not None else None
    sel = routes.choose(ctx, fallback=unusable, probe=probe)
    route = sel.route
    if not route.uses_relation:
        relation = None
    elif relation is None:
        # Identity geometry on a route that wants edges: the 1x1x1 relation.
        relation = x.manager.submanifold_kernel_relation(x.coordinate_set, geom)
    runner = backends.get(route.backend)
    w = weight if quantized else runner.product_weight(weight)
    view = runner.product_view(relation)
    if quantized:
        y = runner.quantized_conv(route.name, x.feats, w, relation)
    else:
        y = autodiff.conv(runner, route.name, x.feats, w, view, groups, sel.variant)
    if bias is not None:
        y = y + bias
    out = SparseTensor._from_set(out_set, y, x.manager)
    if _products:
        native = None if relation is None else relation._native
        _products.add(Product(
            op, kind, geom, route.name, route.backend, x.feats, w, quantized, native,
            view, runner.stream(), groups, sel.variant, time.perf_counter() - t0,
        ))
    return out


def conv3d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, coordinates=None, groups=1):
    """Sparse 3D convolution ``y[q] = sum_d W[d] x[s*q - padding + dilation*d]``.

    Output support: ``coordinates`` when given (kind ``target``), else every q
    whose receptive field holds an active input (kind ``forward``), sorted by
    (batch, x, y, z). A 1x1x1, stride-1, unpadded convolution keeps the input
    rows. The output tensor stride is ``x.stride * stride``. With ``groups``
    the channels split into groups convolved separately (weight
    ``(C_out, Kx, Ky, Kz, C_in // groups)``; ``groups == C_in``: depthwise).
    """
    ks = _check("conv3d", x, weight, bias, groups)
    geom = KernelGeometry(
        ks,
        triple(stride, "stride", minimum=1),
        triple(padding, "padding", minimum=0),
        triple(dilation, "dilation", minimum=1),
    )
    src = x.coordinate_set
    out_stride = tuple(a * b for a, b in zip(x.stride, geom.stride))
    if coordinates is not None:
        dst = target_set(x, coordinates, out_stride)
        return _execute(
            "conv3d", x, weight, bias, geom, "target", dst,
            lambda: x.manager.target_kernel_relation(src, dst, geom), explicit_target=True,
            groups=groups,
        )
    if ks == (1, 1, 1) and geom.stride == (1, 1, 1) and geom.padding == (0, 0, 0):
        # Every input maps onto itself: keep the rows (and the coordinate set).
        return _execute("conv3d", x, weight, bias, geom, "forward", src, None, groups=groups)
    rel, dst = x.manager.kernel_relation(src, geom)
    return _execute("conv3d", x, weight, bias, geom, "forward", dst, lambda: rel, groups=groups)


_POINTWISE = KernelGeometry((1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))


def linear(x, weight, bias=None):
    """``y = x W^T + b`` on each voxel: ``conv3d`` with a 1x1x1 kernel, its
    weight given as a linear layer's ``(C_out, C_in)`` (taken as it is:
    no reshape of the parameter enters the graph). Rows and coordinate set
    are kept."""
    if not isinstance(x, SparseTensor):
        raise TypeError(f"linear: x must be a SparseTensor, got {type(x).__name__}")
    if not isinstance(weight, mx.array) or weight.ndim != 2:
        raise TypeError("linear: weight must be an mx.array of shape (C_out, C_in)")
    c_out, c_in = weight.shape
    _check("linear", x, weight, bias, shape=(c_out, 1, 1, 1, c_in))
    return _execute("conv3d", x, weight, bias, _POINTWISE, "forward", x.coordinate_set, None)


def subm_conv3d(x, weight, bias=None, *, dilation=1, groups=1):
    """Submanifold convolution: stride 1, output rows = input rows (same order).

    The kernel is centred at offset ``(k - 1) // 2`` per axis, so odd kernels
    are symmetric and an even kernel of size k reaches ``k // 2`` voxels in
    the positive direction and ``(k - 1) // 2`` in the negative one. Equals
    ``conv3d(x, w, padding=dilation * ((k - 1) // 2), coordinates=x)``.
    """
    ks = _check("subm_conv3d", x, weight, bias, groups)
    dil = triple(dilation, "dilation", minimum=1)
    pad = tuple(d * ((k - 1) // 2) for d, k in zip(dil, ks))
    geom = KernelGeometry(ks, (1, 1, 1), pad, dil)
    src = x.coordinate_set
    if ks == (1, 1, 1):
        return _execute("subm_conv3d", x, weight, bias, geom, "submanifold", src, None, groups=groups)
    return _execute(
        "subm_conv3d", x, weight, bias, geom, "submanifold", src,
        lambda: x.manager.submanifold_kernel_relation(src, geom), groups=groups,
    )


def conv_transpose3d(
    x, weight, bias=None, *, stride=1, padding=0, dilation=1, coordinates=None, groups=1
):
    """Sparse transposed convolution ``y[s*p - padding + dilation*d] += W[d] x[p]``.

    Output support: ``coordinates`` when given; else the finer coordinate set
    from which a ``conv3d`` with this stride produced x's coordinates (a U-Net
    decoder lands on its encoder's voxels, reusing that layer's relation when
    the geometry matches); else ``s * p`` for every input p.
    """
    ks = _check("conv_transpose3d", x, weight, bias, groups)
    geom = KernelGeometry(
        ks,
        triple(stride, "stride", minimum=1),
        triple(padding, "padding", minimum=0),
        triple(dilation, "dilation", minimum=1),
    )
    src = x.coordinate_set
    dst = None
    if coordinates is not None:
        out_stride = tuple(a // b if a % b == 0 else 1 for a, b in zip(x.stride, geom.stride))
        dst = target_set(x, coordinates, out_stride)
    rel, dst = x.manager.transposed_kernel_relation(src, geom, dst)
    return _execute(
        "conv_transpose3d", x, weight, bias, geom, "transposed", dst, lambda: rel,
        explicit_target=coordinates is not None, groups=groups,
    )


def generative_conv_transpose3d(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1):
    """Transposed convolution onto every reachable voxel ``s*p - padding + dilation*d``
    (deduplicated, sorted): the support grows, as in sparse generative decoders."""
    ks = _check("generative_conv_transpose3d", x, weight, bias, groups)
    geom = KernelGeometry(
        ks,
        triple(stride, "stride", minimum=1),
        triple(padding, "padding", minimum=0),
        triple(dilation, "dilation", minimum=1),
    )
    rel, dst = x.manager.generative_relation(x.coordinate_set, geom)
    return _execute(
        "generative_conv_transpose3d", x, weight, bias, geom, "generative", dst, lambda: rel,
        groups=groups,
    )


# Pooling and point <-> voxel conversion, also reachable from here.
from .pooling import (  # noqa: E402
    avg_pool3d,
    global_avg_pool,
    global_max_pool,
    global_sum_pool,
    max_pool3d,
    sum_pool3d,
)
from .points import devoxelize, sparse_quantize, voxelize  # noqa: E402

__all__ += [
    "max_pool3d",
    "avg_pool3d",
    "sum_pool3d",
    "global_max_pool",
    "global_avg_pool",
    "global_sum_pool",
    "sparse_quantize",
    "voxelize",
    "devoxelize",
]
