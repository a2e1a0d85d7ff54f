"""Which module makes each kernel a manifest line names (``jit`` reads the
lists of compiled specialisations; the modules that own the kernels import
``jit``, so it asks through :func:`find`, which the package installs)."""

from __future__ import annotations


def find(name: str):
    """Make the kernel named ``name`` (its module's ``_kernel``), or nothing
    where no module here has it; ``jit`` then finds it by name."""
    from . import adam, jit, kernels, maps, neighbors, norm, plans  # the query and norm modules load here only

    for mod, prefix in ((maps, "mlx_lattice_map_"), (plans, "mlx_lattice_plan_"),
                        (neighbors, "mlx_lattice_neighbors_"), (norm, "mlx_lattice_"),
                        (kernels, "mlx_lattice_"), (adam, "mlx_lattice_")):
        if name.startswith(prefix):
            try:
                mod._kernel(name[len(prefix):])
            except (KeyError, TypeError):
                continue
            if name in jit._KERNELS:
                break
