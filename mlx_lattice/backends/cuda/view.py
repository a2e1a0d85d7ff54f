"""CSR views of a relation for the CUDA routes."""

from __future__ import annotations

from ..base import ProductView
from . import plans


class View(ProductView):
    """A CSR view of a relation for CUDA products: rows, gathered rows and the
    sorted plan, plus the view with roles exchanged (for input gradients).
    For a relation built on CUDA all of them are built there too.

    A view holds nothing but its relation: the derived arrays (the swapped
    relation's included) are kept by the relation's views object
    (cuda/plans.py), so no reference cycle keeps a sample's maps alive
    after its tensors are gone (a cycle waits for the garbage collector,
    and the GPU memory with it)."""

    __slots__ = ("rel",)

    def __init__(self, relation):
        self.rel = relation  # mlx_lattice.relation.Relation (may be a swapped one)

    @property
    def relation(self):
        return self.rel

    @property
    def rows(self) -> int:
        return self.rel.n_out

    def flipped(self) -> "View":
        return View(self.rel.swapped(self.rel.kind, self.rel.geometry))

    def csr(self):
        return self.rel.out_offsets, self.rel.in_idx, self.rel.k_idx

    def plan(self):
        return self.rel.sorted_plan()

    def wgrad_chunks(self, size=256):
        """((slots, 3) [k, e0, e1] over the kernel-major edges, first chunk per
        k, the kernel-major view), per chunk size: built on the GPU
        (cuda/plans.py), kept with the relation's derived arrays (shared by
        the relations with the same arrays under other labels)."""
        rel = self.rel

        def build():
            km = rel.kernel_major()
            chunks, first = plans.wgrad_chunks(km.offsets, rel.edges, rel.kernel_volume, size)
            return chunks, first, km
        return rel._views._once(("wgrad_chunks", size), build)


def view_of(relation) -> View:
    """The relation's CUDA view (the relation's views object keeps what the
    view derives, so a view is made per call)."""
    return View(relation)
