"""Apply array functions to a SparseTensor's features."""

from __future__ import annotations

from ..tensor import SparseTensor


def on_features(x, fn):
    """``fn`` on ``x.feats`` (same coordinates) for a SparseTensor, else ``fn(x)``."""
    if isinstance(x, SparseTensor):
        return x.replace(fn(x.feats))
    return fn(x)
