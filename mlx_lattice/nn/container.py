"""``Sequential``: ``mlx.nn.Sequential`` that names the layer at fault when an
``mlx.nn`` array layer is handed a SparseTensor."""

from __future__ import annotations

import mlx.nn as mnn

from ..tensor import SparseTensor


def array_layer_hint(layer) -> str | None:
    """What to use instead of ``layer`` on a SparseTensor, when ``layer`` is
    an ``mlx.nn`` layer (which takes arrays only); else None."""
    cls = type(layer)
    if not cls.__module__.startswith("mlx.nn") or isinstance(layer, (mnn.Sequential, mnn.Identity)):
        return None
    from .. import nn  # the package imports this module first: its layers exist only by now

    ours = getattr(nn, cls.__name__, None)
    if isinstance(ours, type) and issubclass(ours, mnn.Module) and not ours.__module__.startswith("mlx.nn"):
        return (
            f"mlx_lattice.nn.{cls.__name__} (same arguments), or nn.FeatureMap(layer) to apply the array "
            "layer to the features"
        )
    return "nn.FeatureMap(layer), which applies an array layer to the features"


class Sequential(mnn.Sequential):
    """``mlx.nn.Sequential`` (the same ``layers`` parameter tree, so weights
    load unchanged) that calls its layers in order. When an ``mlx.nn`` layer
    (``mlx.nn.ReLU``, ``mlx.nn.Linear``, ...) fails on a SparseTensor it
    raises a ``TypeError`` naming the layer and what to use instead, rather
    than MLX's error about arrays."""

    def __call__(self, x):
        for i, m in enumerate(self.layers):
            try:
                x = m(x)
            except (TypeError, ValueError, AttributeError, RuntimeError) as e:
                hint = array_layer_hint(m) if isinstance(x, SparseTensor) else None
                if hint is None:
                    raise
                raise TypeError(
                    f"layers[{i}] ({type(m).__name__}) is an mlx.nn layer: it takes mx.arrays, and got a "
                    f"SparseTensor; use {hint}"
                ) from e
        return x
