"""Checkpoint converters: spconv, TorchSparse and MinkowskiEngine state dicts
onto this package's parameters.

Each converter reads a flat ``{name: tensor}`` state dict (torch tensors,
NumPy arrays or mx.arrays), groups the entries by module (the name up to the
last dot) and maps every convolution, linear and batch-norm module:

- convolution kernels to ``(C_out, Kx, Ky, Kz, C_in)`` with the library's
  kernel-offset order undone and its coordinate axes (``axes``) mapped onto
  ours (``docs/convert.md`` holds the layout table);
- batch norms to ``weight``/``bias``/``running_mean``/``running_var``
  (``num_batches_tracked`` is dropped);
- linear layers unchanged (``(C_out, C_in)`` like ``torch.nn.Linear``).

Without ``model`` a converter returns the flat dict of mx.arrays named
``<source module>.<our parameter>``. With ``model`` it loads the parameters
into the model's convolution / linear / batch-norm modules, matched in order
(definition order, depth first), casts them to the model's dtypes and returns
the model. Any other tensor in the source is an error, never dropped.

Files: :func:`save_converted` (what ``python -m mlx_lattice convert`` runs)
writes the converted tensors to a safetensors file together with the source's
module order (safetensors stores keys sorted, which loses it), and
:func:`load_converted` reads such a file into a model in that order, in one
call: ``convert.load_converted("out.safetensors", model)``.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import mlx.core as mx
import mlx.nn as mnn
from mlx.utils import tree_flatten

from .nn.convolution import _ConvBase, Linear
from .nn.normalization import BatchNorm

__all__ = [
    "from_spconv",
    "from_torchsparse",
    "from_minkowski",
    "load_state_dict",
    "save_converted",
    "load_converted",
    "source_coordinates",
    "SOURCES",
]

# The metadata "format" of files written by save_converted (the CLI).
CONVERTED_FORMAT = "mlx_lattice.converted/1"

SPCONV_LAYOUTS = ("KRSC", "RSCK", "RSKC")
_BN_KEYS = ("weight", "bias", "running_mean", "running_var")


# ---------------------------------------------------------------- tensors in


def _to_mx(value, name: str) -> mx.array:
    if isinstance(value, mx.array):
        return value
    if isinstance(value, np.ndarray):
        return mx.array(np.ascontiguousarray(value))
    if type(value).__module__.startswith("torch"):
        t = value.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":  # NumPy has no bfloat16
            return mx.array(t.float().numpy()).astype(mx.bfloat16)
        return mx.array(t.numpy())
    raise TypeError(f"state dict entry {name!r} must be a tensor or array, got {type(value).__name__}")


def _is_safetensors(path: str) -> bool:
    # safetensors: an 8-byte little-endian header length, then a JSON object.
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 0 < n <= os.path.getsize(path) - 8


def _natural_key(name: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def load_state_dict(path) -> dict:
    """Read a checkpoint's tensors as an ordered ``{name: mx.array}`` dict.

    safetensors files (any extension) are read by MLX without torch; their
    keys are stored sorted, so they come back in natural order (numbers
    compared as numbers: ``blocks.2`` before ``blocks.10``). Other files are
    read with ``torch.load`` (weights only), which keeps the module order; a
    checkpoint holding its state dict under ``state_dict`` / ``model`` /
    ``model_state`` / ``model_state_dict`` / ``net`` is unwrapped.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"path: no such file {path!r}")
    if _is_safetensors(path):
        tensors, metadata = mx.load(path, format="safetensors", return_metadata=True)
        if metadata.get("format") == CONVERTED_FORMAT:
            return _in_module_order(tensors, metadata, path)
        return {k: tensors[k] for k in sorted(tensors, key=_natural_key)}
    try:
        import torch
    except ImportError:
        raise ValueError(
            f"path: {path!r} is not a safetensors file; reading a torch checkpoint needs torch installed"
        ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (torch raises many kinds for a bad file)
        raise ValueError(f"path: {path!r} could not be read as a torch checkpoint: {str(e).splitlines()[0]}") from e
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state", "model_state_dict", "net"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"path: {path!r} does not hold a flat tensor state dict")
    return {k: _to_mx(v, k) for k, v in obj.items()}


# ------------------------------------------------------------ source modules


class _Unit:
    """One source module: a convolution, linear layer or batch norm."""

    def __init__(self, name, kind, tensors, cin=None, cout=None, volume=None, sizes=None, decode=None):
        self.name, self.kind, self.tensors = name, kind, tensors
        self.cin, self.cout, self.volume, self.sizes, self.decode = cin, cout, volume, sizes, decode

    def describe(self) -> str:
        if self.kind == "batchnorm":
            return f"source '{self.name}' (batch norm, {self.tensors['running_mean'].shape[0]} features)"
        if self.kind == "linear":
            return f"source '{self.name}' (linear {self.cin} -> {self.cout})"
        ks = "x".join(map(str, self.sizes)) if self.sizes else f"volume {self.volume}"
        return f"source '{self.name}' (convolution {self.cin} -> {self.cout}, kernel {ks})"


def _group(state_dict) -> list[tuple[str, dict]]:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict of tensors, got {type(state_dict).__name__}")
    groups: dict[str, dict] = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict keys must be strings, got {key!r}")
        prefix, _, leaf = key.rpartition(".")
        if leaf == "num_batches_tracked":
            continue
        groups.setdefault(prefix, {})[leaf] = _to_mx(value, key)
    return list(groups.items())


def _batchnorm_or_linear(name, t) -> _Unit | None:
    if "running_mean" in t:
        missing = [k for k in _BN_KEYS if k not in t]
        extra = sorted(set(t) - set(_BN_KEYS))
        if missing or extra:
            raise ValueError(f"source '{name}': batch norm needs {_BN_KEYS}, missing {missing}, unexpected {extra}")
        return _Unit(name, "batchnorm", t)
    w = t.get("weight")
    if w is not None and w.ndim == 2 and set(t) <= {"weight", "bias"}:
        return _Unit(name, "linear", t, cin=w.shape[1], cout=w.shape[0], volume=1, sizes=(1, 1, 1))
    return None


def _bias(name, t, allowed):
    extra = sorted(set(t) - set(allowed))
    if extra:
        raise ValueError(f"source '{name}': unexpected tensors {extra} beside the convolution kernel")
    return t.get("bias")


def _units(state_dict, conv_of) -> list[_Unit]:
    units = []
    for name, t in _group(state_dict):
        unit = conv_of(name, t) or _batchnorm_or_linear(name, t)
        if unit is None:
            raise ValueError(
                f"source '{name}' (tensors {sorted(t)} of shapes {[tuple(v.shape) for v in t.values()]}) "
                "is not a convolution, linear layer or batch norm this converter maps"
            )
        units.append(unit)
    return units


# Kernel decoders: (source kernel, source-axis sizes) -> (C_out, K0, K1, K2, C_in),
# K0..K2 along the source's coordinate columns 1..3.


def _spconv_conv(layout):
    def conv_of(name, t):
        w = t.get("weight")
        if w is None or w.ndim != 5:
            return None
        _bias(name, t, ("weight", "bias"))
        if layout == "KRSC":  # (C_out, K0, K1, K2, C_in): spconv 2.x
            canon = w
        elif layout == "RSCK":  # (K0, K1, K2, C_in, C_out): spconv 1.x, 2.x with FILTER_HWIO
            canon = w.transpose(4, 0, 1, 2, 3)
        else:  # RSKC (K0, K1, K2, C_out, C_in): early spconv 2.0
            canon = w.transpose(3, 0, 1, 2, 4)
        sizes = tuple(canon.shape[1:4])
        return _Unit(name, "conv", t, cin=canon.shape[4], cout=canon.shape[0], volume=math.prod(sizes),
                     sizes=sizes, decode=lambda s, c=canon: c)
    return conv_of


def _offset_table_conv(first_axis_fastest):
    """TorchSparse / MinkowskiEngine: ``kernel`` ``(K, C_in, C_out)``, or
    ``(C_in, C_out)`` for a single offset; ``first_axis_fastest(sizes)`` says
    whether axis 0 varies fastest along K (else axis 2)."""

    def conv_of(name, t):
        k = t.get("kernel")
        if k is None:
            return None
        _bias(name, t, ("kernel", "bias"))
        if k.ndim == 2:
            k = k[None]
        if k.ndim != 3:
            raise ValueError(f"source '{name}': kernel must be (K, C_in, C_out) or (C_in, C_out), got {tuple(k.shape)}")
        volume, cin, cout = k.shape

        def decode(sizes, k=k):
            k0, k1, k2 = sizes
            if first_axis_fastest(sizes):
                return k.reshape(k2, k1, k0, cin, cout).transpose(4, 2, 1, 0, 3)
            return k.reshape(k0, k1, k2, cin, cout).transpose(4, 0, 1, 2, 3)

        return _Unit(name, "conv", t, cin=cin, cout=cout, volume=volume, decode=decode)
    return conv_of


def _torchsparse_order(sizes):
    # TorchSparse lists offsets x-fastest when the kernel volume is odd and
    # z-fastest when it is even (for MinkowskiEngine-compatible odd kernels).
    return math.prod(sizes) % 2 == 1


def _minkowski_order(sizes):
    return True  # the kernel region iterator advances axis 0 first


# ------------------------------------------------------------------- mapping


def _axes_perm(axes) -> tuple[int, int, int]:
    """Source kernel axis holding our x, y, z (``axes`` names the source's
    coordinate columns 1..3 in our axis letters)."""
    if not isinstance(axes, str) or sorted(axes) != ["x", "y", "z"]:
        raise ValueError(f"axes must be a permutation of 'xyz' (the source's coordinate columns), got {axes!r}")
    return tuple(axes.index(c) for c in "xyz")


def _cube_sizes(unit):
    if unit.sizes is not None:
        return unit.sizes
    side = round(unit.volume ** (1 / 3))
    if side ** 3 != unit.volume:
        raise ValueError(
            f"{unit.describe()}: {unit.volume} kernel offsets is not a cube; pass a model so its kernel sizes are known"
        )
    return (side,) * 3


def _conv_weight(unit, perm, ours=None) -> mx.array:
    """The unit's kernel as ``(C_out, Kx, Ky, Kz, C_in)``; ``ours`` (our kernel
    sizes) fixes the source sizes for kernels stored as flat offset tables."""
    if ours is not None and unit.sizes is None:
        sizes = [0, 0, 0]
        for ax, src in enumerate(perm):
            sizes[src] = ours[ax]
        sizes = tuple(sizes)
    else:
        sizes = _cube_sizes(unit)
    canon = unit.decode(sizes)
    return canon.transpose(0, 1 + perm[0], 1 + perm[1], 1 + perm[2], 4)


def _flat(units, perm) -> dict:
    out = {}
    for u in units:
        p = f"{u.name}." if u.name else ""
        if u.kind == "conv":
            out[p + "weight"] = _conv_weight(u, perm)
            if "bias" in u.tensors:
                out[p + "bias"] = u.tensors["bias"]
        else:
            out.update({p + k: v for k, v in u.tensors.items()})
    return out


def _walk(module, prefix=""):
    yield prefix, module
    for name, child in tree_flatten(module.children(), is_leaf=mnn.Module.is_module):
        yield from _walk(child, f"{prefix}.{name}" if prefix else name)


def _model_units(model):
    units = []
    for path, m in _walk(model):
        if isinstance(m, _ConvBase) and m.weight.ndim == 5:
            units.append((path, "conv", m))
        elif isinstance(m, (Linear, mnn.Linear)) and not isinstance(m, mnn.QuantizedLinear):
            units.append((path, "linear", m))
        elif isinstance(m, (BatchNorm, mnn.BatchNorm)):
            units.append((path, "batchnorm", m))
    return units


def _describe_ours(path, kind, m) -> str:
    name = path or "<model>"
    if kind == "batchnorm":
        return f"model '{name}' ({type(m).__name__}, {m.num_features} features)"
    return f"model '{name}' ({type(m).__name__}, weight {tuple(m.weight.shape)})"


def _assign(u, path, kind, m, perm) -> list[tuple[str, mx.array]]:
    """Parameters of source unit ``u`` for our module ``m``, or ValueError."""
    p = f"{path}." if path else ""

    def mismatch(why):
        return ValueError(f"{u.describe()} does not match {_describe_ours(path, kind, m)}: {why}")

    if (kind == "batchnorm") != (u.kind == "batchnorm"):
        raise mismatch("a batch norm faces a convolution or linear layer")
    if kind == "batchnorm":
        n = u.tensors["running_mean"].shape[0]
        if n != m.num_features:
            raise mismatch(f"{n} features vs {m.num_features}")
        names = [k for k in _BN_KEYS if k in m]
        missing = [k for k in _BN_KEYS if k not in m]
        if missing:
            raise mismatch(f"the model's batch norm has no {missing} (build it with affine and running statistics)")
        return [(p + k, u.tensors[k].astype(m[k].dtype)) for k in names]

    w_ours = m.weight
    cout, cin = w_ours.shape[0], w_ours.shape[-1]
    ours_sizes = tuple(w_ours.shape[1:4]) if kind == "conv" else (1, 1, 1)
    if (u.cout, u.cin) != (cout, cin):
        raise mismatch(f"channels {u.cin} -> {u.cout} vs {cin} -> {cout}")
    if u.volume != math.prod(ours_sizes):
        raise mismatch(f"{u.volume} kernel offsets vs {math.prod(ours_sizes)}")
    if u.kind == "conv":
        w = _conv_weight(u, perm, ours_sizes)
        if tuple(w.shape[1:4]) != ours_sizes:
            raise mismatch(f"kernel {tuple(w.shape[1:4])} (in our axes) vs {ours_sizes}")
    else:
        w = u.tensors["weight"].reshape(cout, 1, 1, 1, cin)
    if kind == "linear":
        w = w.reshape(cout, cin)
    out = [(p + "weight", w.astype(w_ours.dtype))]
    has_bias = "bias" in m
    if ("bias" in u.tensors) != has_bias:
        raise mismatch("the source has a bias and the model none" if not has_bias else "the model has a bias and the source none")
    if has_bias:
        out.append((p + "bias", u.tensors["bias"].astype(m["bias"].dtype)))
    return out


def _load(units, model, perm):
    if not isinstance(model, mnn.Module):
        raise TypeError(f"model must be an mlx.nn.Module, got {type(model).__name__}")
    ours = _model_units(model)
    updates = []
    for u, (path, kind, m) in zip(units, ours):
        updates += _assign(u, path, kind, m, perm)
    if len(units) != len(ours):
        if len(units) > len(ours):
            extra = units[len(ours)].describe()
        else:
            extra = _describe_ours(*ours[len(units)])
        raise ValueError(
            f"the source has {len(units)} convolution/linear/batch-norm modules and the model "
            f"{len(ours)}; the first without a partner is {extra}"
        )
    model.load_weights(updates, strict=False)
    return model


def _convert(units, model, axes):
    perm = _axes_perm(axes)
    if model is None:
        return _flat(units, perm)
    return _load(units, model, perm)


def _source_units(state_dict, source, layout="KRSC"):
    if source == "spconv":
        if layout not in SPCONV_LAYOUTS:
            raise ValueError(f"layout must be one of {SPCONV_LAYOUTS}, got {layout!r}")
        return _units(state_dict, _spconv_conv(layout))
    if source == "torchsparse":
        return _units(state_dict, _offset_table_conv(_torchsparse_order))
    if source == "minkowski":
        return _units(state_dict, _offset_table_conv(_minkowski_order))
    raise ValueError(f"source must be one of {sorted(SOURCES)}, got {source!r}")


def save_converted(state_dict, path, *, source: str, axes: str = "xyz", layout: str = "KRSC") -> int:
    """Convert a ``source`` (``"spconv"``, ``"torchsparse"``, ``"minkowski"``)
    state dict and write it to the safetensors file ``path``; returns the
    number of tensors written (``python -m mlx_lattice convert`` runs this).

    The tensors are in our layout under their source names
    (``<source module>.<our parameter>``, as the converters return without a
    model); the metadata holds ``source``, ``axes`` and the source's module
    order, which :func:`load_converted` needs to pair them with a model's
    layers. ``axes`` and ``layout`` as for the converters.
    """
    units = _source_units(state_dict, source, layout)
    flat = _flat(units, _axes_perm(axes))
    metadata = {
        "format": CONVERTED_FORMAT,
        "source": source,
        "axes": axes,
        "modules": json.dumps([u.name for u in units]),
    }
    mx.save_safetensors(os.fspath(path), flat, metadata=metadata)
    return len(flat)


def _in_module_order(tensors: dict, metadata: dict, path: str) -> dict:
    try:
        modules = json.loads(metadata["modules"])
    except (KeyError, ValueError):
        raise ValueError(f"path: {path!r} has no readable module order in its metadata") from None
    by_module: dict[str, list[str]] = {}
    for key in tensors:
        by_module.setdefault(key.rpartition(".")[0], []).append(key)
    if sorted(by_module) != sorted(modules):
        raise ValueError(f"path: {path!r}: its tensors do not match the module list in its metadata")
    return {k: tensors[k] for name in modules for k in by_module[name]}


def load_converted(path, model=None):
    """Read a file written by :func:`save_converted` / ``python -m
    mlx_lattice convert`` into ``model``, in one call::

        model = convert.load_converted("out.safetensors", MinkUNet(4, 19))

    The tensors are already in our layout and axes; they are paired with the
    model's convolution / linear / batch-norm layers in the source's module
    order (kept in the file's metadata), checked and cast as the converters
    do with a model, and loaded. Returns the model; without ``model``, the
    ``{<source module>.<parameter>: mx.array}`` dict in the source's order.
    ``model.load_weights(path)`` cannot read such a file: its names are the
    source's, not the model's.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"path: no such file {path!r}")
    if not _is_safetensors(path):
        raise ValueError(f"path: {path!r} is not a safetensors file")
    tensors, metadata = mx.load(path, format="safetensors", return_metadata=True)
    if metadata.get("format") != CONVERTED_FORMAT:
        raise ValueError(
            f"path: {path!r} was not written by `python -m mlx_lattice convert` (its metadata has no "
            "module order); convert the source checkpoint with it, or call "
            "convert.from_<library>(convert.load_state_dict(<source checkpoint>), model)"
        )
    ordered = _in_module_order(tensors, metadata, path)
    if model is None:
        return ordered
    # Our layout is spconv 2.x's KRSC in our own axes.
    return _load(_units(ordered, _spconv_conv("KRSC")), model, _axes_perm("xyz"))


def from_spconv(state_dict, model=None, *, axes: str = "xyz", layout: str = "KRSC"):
    """Convert an spconv state dict.

    ``layout``: ``"KRSC"`` ``(C_out, K0, K1, K2, C_in)`` (spconv 2.x default),
    ``"RSCK"`` ``(K0, K1, K2, C_in, C_out)`` (spconv 1.x; 2.x built with
    ``FILTER_HWIO``), ``"RSKC"`` ``(K0, K1, K2, C_out, C_in)`` (early 2.0).
    ``axes``: what the source's index columns 1..3 hold, e.g. ``"zyx"`` for
    models fed ``(batch, z, y, x)`` indices (OpenPCDet, mmdetection3d).
    """
    if layout not in SPCONV_LAYOUTS:
        raise ValueError(f"layout must be one of {SPCONV_LAYOUTS}, got {layout!r}")
    return _convert(_units(state_dict, _spconv_conv(layout)), model, axes)


def from_torchsparse(state_dict, model=None, *, axes: str = "xyz"):
    """Convert a TorchSparse (1.x / 2.x) state dict: ``kernel`` ``(K, C_in,
    C_out)`` (or ``(C_in, C_out)``), offsets x-fastest for odd kernel volumes
    and z-fastest for even ones."""
    return _convert(_units(state_dict, _offset_table_conv(_torchsparse_order)), model, axes)


def from_minkowski(state_dict, model=None, *, axes: str = "xyz"):
    """Convert a MinkowskiEngine (0.5) state dict: ``kernel`` ``(K, C_in,
    C_out)`` (or ``(C_in, C_out)``), offsets x-fastest; ``MinkowskiBatchNorm``
    and ``MinkowskiLinear`` keep their inner ``bn`` / ``linear`` names."""
    return _convert(_units(state_dict, _offset_table_conv(_minkowski_order)), model, axes)


SOURCES = {"spconv": from_spconv, "torchsparse": from_torchsparse, "minkowski": from_minkowski}


def source_coordinates(coords, *, batch: str = "first", axes: str = "xyz") -> mx.array:
    """A source library's ``(N, 4)`` integer coordinates as our
    ``(batch, x, y, z)`` int32 rows.

    ``batch``: ``"first"`` (spconv, MinkowskiEngine, TorchSparse 2.1+) or
    ``"last"`` (TorchSparse up to 2.0, ``(x, y, z, batch)``); ``axes`` names
    the spatial columns in order, as for the converters.
    """
    if batch not in ("first", "last"):
        raise ValueError(f"batch must be 'first' or 'last', got {batch!r}")
    perm = _axes_perm(axes)
    c = np.asarray(coords)
    if c.ndim != 2 or c.shape[1] != 4 or not np.issubdtype(c.dtype, np.integer):
        raise ValueError(f"coords must be an (N, 4) integer array, got {c.dtype} {c.shape}")
    b, s = (c[:, 0], c[:, 1:]) if batch == "first" else (c[:, 3], c[:, :3])
    out = np.stack([b, s[:, perm[0]], s[:, perm[1]], s[:, perm[2]]], axis=1)
    return mx.array(out.astype(np.int32))
