"""CSR views of a relation for the CUDA routes."""

from __future__ import annotations

from . import plans


class View:
    """A CSR view of a relation for CUDA products: rows, gathered rows and the
    sorted plan, plus the view with roles exchanged (for input gradients).
    For a relation built on CUDA all of them are built there too."""

    def __init__(self, relation, flipped=None):
        self.rel = relation  # mlx_lattice.relation.Relation (may be a swapped one)
        self._flipped = flipped
        self._chunks = {}

    @property
    def rows(self) -> int:
        return self.rel.n_out

    @property
    def kind(self) -> str:
        return self.rel.kind

    @property
    def edges(self) -> int:
        return self.rel.edges

    @property
    def symmetric(self) -> bool:
        """Input gradients may run on this view with mirrored offsets
        (``Relation.symmetric``) rather than on the flipped view."""
        return self.rel.symmetric

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
        """((slots, 3) [k, e0, e1] over the kernel-major edges, first chunk per
        k, the kernel-major view), per chunk size: built on the GPU
        (cuda/plans.py)."""
        if size not in self._chunks:
            def build():
                km = self.rel.kernel_major()
                chunks, first = plans.wgrad_chunks(km.offsets, self.rel.edges, self.rel.kernel_volume, size)
                return chunks, first, km
            # A relation built on CUDA keeps them with its derived arrays
            # (shared by the relations with the same arrays under other labels).
            views = self.rel._views
            self._chunks[size] = views._once(("wgrad_chunks", size), build)
        return self._chunks[size]


def view_of(relation) -> View:
    """The relation's CUDA view, kept on the relation so that the swapped
    relation and sorted plans are built once per relation, not per call."""
    v = getattr(relation, "_cuda_view", None)
    if v is None:
        v = View(relation)
        relation._cuda_view = v
    return v
