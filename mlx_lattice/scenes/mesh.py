"""Triangle meshes: surface sampling, a procedural closed mesh and mesh
surfaces voxelized as thin shells (the typical ShapeNet / ScanNet style
input).
"""

from __future__ import annotations

import numpy as np

from .voxels import _pack, _unpack, _with_batch

__all__ = ["mesh_surface_points", "procedural_closed_mesh", "surface_voxels"]


def _triangles(vertices, faces):
    v = np.asarray(vertices, dtype=np.float64)[:, :3]
    f = np.asarray(faces, dtype=np.int64)
    if f.ndim != 2 or f.shape[1] != 3:
        raise ValueError("faces must have shape (F, 3)")
    return v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]


def mesh_surface_points(vertices, faces, n_points, seed=0):
    """Sample ``n_points`` uniformly (by area) on a triangle mesh, float32."""
    a, b, c = _triangles(vertices, faces)
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    total = area.sum()
    if not total > 0:
        raise ValueError("mesh has zero surface area")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(area)
    tri = np.searchsorted(cdf, rng.random(n_points) * total, side="right")
    np.minimum(tri, len(area) - 1, out=tri)
    # uniform barycentric coordinates via the square-root warp
    r1 = np.sqrt(rng.random(n_points))[:, None]
    r2 = rng.random(n_points)[:, None]
    p = (1.0 - r1) * a[tri] + r1 * (1.0 - r2) * b[tri] + r1 * r2 * c[tri]
    return p.astype(np.float32)


def _icosahedron():
    g = (1.0 + 5.0**0.5) / 2.0
    v = np.array(
        [[-1, g, 0], [1, g, 0], [-1, -g, 0], [1, -g, 0],
         [0, -1, g], [0, 1, g], [0, -1, -g], [0, 1, -g],
         [g, 0, -1], [g, 0, 1], [-g, 0, -1], [-g, 0, 1]],
        dtype=np.float64,
    )
    f = np.array(
        [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
         [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
         [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
         [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]],
        dtype=np.int64,
    )
    return v / np.linalg.norm(v, axis=1, keepdims=True), f


def _subdivide(v, f):
    """Split every triangle into four, sharing edge midpoints."""
    edges = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
    edges.sort(axis=1)
    uniq, inv = np.unique(edges, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    mid = v[uniq[:, 0]] + v[uniq[:, 1]]
    mid /= np.linalg.norm(mid, axis=1, keepdims=True)
    m = len(v) + inv.reshape(3, -1).T  # midpoint ids of edges (01, 12, 20)
    a, b, c = f[:, 0], f[:, 1], f[:, 2]
    m01, m12, m20 = m[:, 0], m[:, 1], m[:, 2]
    nf = np.concatenate(
        [
            np.stack([a, m01, m20], 1),
            np.stack([b, m12, m01], 1),
            np.stack([c, m20, m12], 1),
            np.stack([m01, m12, m20], 1),
        ]
    )
    return np.concatenate([v, mid]), nf


def procedural_closed_mesh(subdiv=5, seed=0, bumps=6):
    """A closed, bumpy blob: an icosphere pushed out by smooth radial bumps.

    Returns ``(vertices (V, 3) float64, faces (F, 3) int64)`` with
    ``F = 20 * 4**subdiv``; the surface is a topological sphere.
    """
    v, f = _icosahedron()
    for _ in range(int(subdiv)):
        v, f = _subdivide(v, f)
    rng = np.random.default_rng(seed)
    dirs = rng.normal(size=(bumps, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    amp = rng.uniform(-0.2, 0.35, size=bumps)
    width = rng.uniform(0.25, 0.6, size=bumps)
    cosang = v @ dirs.T  # (V, bumps)
    radius = 1.0 + (amp * np.exp((cosang - 1.0) / (width**2))).sum(axis=1)
    radius = np.maximum(radius, 0.4)
    # a gentle anisotropic stretch so the shape is not a round ball
    stretch = np.array([1.25, 1.0, 0.85])
    return v * radius[:, None] * stretch, f


def _lattice(n):
    """Barycentric weights of the (n+1)(n+2)/2 lattice points of a triangle."""
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = i + j <= n
    i, j = i[keep], j[keep]
    return np.stack([n - i - j, i, j], axis=1) / float(n)


def surface_voxels(vertices, faces, resolution=256, seed=0, batch=0, spacing=0.3):
    """Voxelize a mesh surface as a closed shell of voxels.

    The mesh is scaled so its longest bounding-box side spans ``resolution``
    voxels (coordinates in ``[0, resolution)``).  Each triangle is covered by
    a barycentric lattice whose step is at most ``spacing`` voxels, so
    neighbouring samples never skip a voxel and the shell has no holes; a
    layer of random area-weighted samples (``seed``) fills in corner-touching
    voxels.
    """
    v = np.asarray(vertices, dtype=np.float64)[:, :3]
    f = np.asarray(faces, dtype=np.int64)
    lo = v.min(axis=0)
    ext = float((v.max(axis=0) - lo).max())
    if not ext > 0:
        raise ValueError("mesh has zero extent")
    scale = resolution * (1.0 - 1e-9) / ext
    vs = (v - lo) * scale
    a, b, c = vs[f[:, 0]], vs[f[:, 1]], vs[f[:, 2]]
    longest = np.sqrt(
        np.maximum.reduce(
            [((b - a) ** 2).sum(1), ((c - b) ** 2).sum(1), ((a - c) ** 2).sum(1)]
        )
    )
    steps = np.maximum(1, np.ceil(longest / spacing)).astype(np.int64)
    keys = []
    hi = np.full(3, resolution - 1, dtype=np.int64)
    spans = [resolution] * 3
    zero = np.zeros(3, dtype=np.int64)

    def add(points):
        q = np.clip(np.floor(points).astype(np.int64), 0, hi)
        keys.append(np.unique(_pack(q, zero, spans)))

    for n in np.unique(steps):
        sel = steps == n
        w = _lattice(int(n))  # (K, 3)
        tri = np.stack([a[sel], b[sel], c[sel]], axis=1)  # (F, 3, 3)
        # process in chunks to bound memory on large meshes
        chunk = max(1, 2_000_000 // len(w))
        for s in range(0, len(tri), chunk):
            pts = np.einsum("kv,fvd->fkd", w, tri[s : s + chunk]).reshape(-1, 3)
            add(pts)
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1).sum()
    n_extra = int(min(4.0 * area, 20_000_000))
    if n_extra:
        add(mesh_surface_points(vs, f, n_extra, seed=seed).astype(np.float64))
    key = np.unique(np.concatenate(keys))
    return _with_batch(_unpack(key, zero, spans), batch)
