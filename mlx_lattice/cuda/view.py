"""CSR views of a relation for the CUDA routes."""

from __future__ import annotations

import numpy as np
import mlx.core as mx


class View:
    """A CSR view of a relation for CUDA products: rows, gathered rows and the
    sorted plan, plus the view with roles exchanged (for input gradients)."""

    def __init__(self, relation, flipped=None):
        self.rel = relation  # mlx_lattice.relation.Relation (may be a swapped one)
        self._flipped = flipped
        self._chunks = None

    @property
    def rows(self) -> int:
        return self.rel.n_out

    def flipped(self) -> "View":
        if self._flipped is None:
            swapped = self.rel.swapped(self.rel.kind, self.rel.geometry)
            self._flipped = View(swapped, flipped=self)
            swapped._cuda_view = self._flipped
        return self._flipped

    def csr(self):
        return self.rel.out_offsets, self.rel.in_idx, self.rel.k_idx

    def plan(self):
        return self.rel.sorted_plan()

    def wgrad_chunks(self, size=256):
        """(n_chunks, 3) [k, e0, e1] over the kernel-major edges, and first chunk per k."""
        if self._chunks is None:
            km = self.rel.kernel_major()
            off = np.array(km.offsets)
            rows, first = [], [0]
            for k in range(len(off) - 1):
                for e in range(int(off[k]), int(off[k + 1]), size):
                    rows.append((k, e, min(e + size, int(off[k + 1]))))
                first.append(len(rows))
            chunks = np.array(rows, dtype=np.int32).reshape(-1, 3)
            self._chunks = (mx.array(chunks), mx.array(np.array(first, dtype=np.int32)), km)
        return self._chunks


def view_of(relation) -> View:
    """The relation's CUDA view, kept on the relation so that the swapped
    relation and sorted plans are built once per relation, not per call."""
    v = getattr(relation, "_cuda_view", None)
    if v is None:
        v = View(relation)
        relation._cuda_view = v
    return v
