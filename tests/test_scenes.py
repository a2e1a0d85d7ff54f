"""Tests for the synthetic scenes and point-cloud loaders (NumPy only)."""

import time

import numpy as np
import pytest

from mlx_lattice import scenes


@pytest.fixture(scope="module")
def sweep0():
    return scenes.lidar_sweep(seed=0)


# --------------------------------------------------------------------------
# LiDAR sweep
# --------------------------------------------------------------------------


def test_lidar_shapes_and_dtypes(sweep0):
    pts, inten = sweep0
    assert pts.dtype == np.float32 and pts.ndim == 2 and pts.shape[1] == 3
    assert inten.dtype == np.float32 and inten.shape == (len(pts),)
    assert 100_000 <= len(pts) <= 131_072
    assert np.isfinite(pts).all()
    assert inten.min() >= 0.0 and inten.max() <= 1.0
    assert inten.std() > 0.02  # materials and incidence angle vary


def test_lidar_geometry(sweep0):
    pts, _ = sweep0
    rng_ = np.linalg.norm(pts, axis=1)
    assert rng_.max() <= 70.0 + 0.2
    assert rng_.min() > 1.0
    # road surface about 1.8 m below the sensor dominates the near field
    near = np.hypot(pts[:, 0], pts[:, 1]) < 8.0
    z_near = pts[near, 2]
    assert np.mean(np.abs(z_near + 1.8) < 0.3) > 0.5
    # nothing far above the tallest building
    assert pts[:, 2].max() < 25.0
    # the sweep covers every direction
    az = np.arctan2(pts[:, 1], pts[:, 0])
    hist, _ = np.histogram(az, bins=36, range=(-np.pi, np.pi))
    assert hist.min() > 0


def test_lidar_deterministic(sweep0):
    pts, inten = sweep0
    pts2, inten2 = scenes.lidar_sweep(seed=0)
    np.testing.assert_array_equal(pts, pts2)
    np.testing.assert_array_equal(inten, inten2)
    pts3, _ = scenes.lidar_sweep(seed=1)
    assert pts3.shape != pts.shape or not np.array_equal(pts3, pts)


@pytest.mark.parametrize("seed", [0, 1])
def test_lidar_voxel_statistics(seed, sweep0):
    pts, _ = sweep0 if seed == 0 else scenes.lidar_sweep(seed=seed)
    coords = scenes.voxelize_points(pts, 0.1)
    assert 45_000 <= len(coords) <= 170_000
    assert 2.0 <= scenes.neighbour_stats(coords) <= 7.0
    # finer voxels: more of them and fewer neighbours each
    fine = scenes.voxelize_points(pts, 0.05)
    assert len(fine) > len(coords)
    assert scenes.neighbour_stats(fine) < scenes.neighbour_stats(coords)


def test_lidar_options():
    pts, inten = scenes.lidar_sweep(seed=3, beams=16, azimuth_steps=256, max_range=30.0)
    assert 0 < len(pts) <= 16 * 256
    assert np.linalg.norm(pts, axis=1).max() <= 30.2
    el = scenes.hdl64_elevations(64)
    assert el.shape == (64,)
    assert el[0] == pytest.approx(2.0) and el[-1] == pytest.approx(-24.8)
    assert np.all(np.diff(el) < 0)


def test_lidar_speed():
    t0 = time.perf_counter()
    scenes.lidar_sweep(seed=5)
    assert time.perf_counter() - t0 < 3.0


# --------------------------------------------------------------------------
# Voxel helpers
# --------------------------------------------------------------------------


def test_voxelize_points_matches_reference():
    rng = np.random.default_rng(0)
    pts = rng.normal(scale=3.0, size=(5000, 4)).astype(np.float32)
    coords = scenes.voxelize_points(pts, 0.5, batch=2)
    assert coords.dtype == np.int32 and coords.shape[1] == 4
    ref = np.unique(np.floor(pts[:, :3].astype(np.float64) / 0.5).astype(np.int64), axis=0)
    np.testing.assert_array_equal(coords[:, 1:], ref)
    assert np.all(coords[:, 0] == 2)
    assert coords[:, 1:].min() < 0  # negative coordinates are kept


def test_voxelize_points_empty_and_errors():
    assert scenes.voxelize_points(np.zeros((0, 3)), 0.1).shape == (0, 4)
    with pytest.raises(ValueError):
        scenes.voxelize_points(np.zeros((4, 2)), 0.1)
    with pytest.raises(ValueError):
        scenes.voxelize_points(np.zeros((4, 3)), 0.0)


def test_neighbour_stats_known_sets():
    assert scenes.neighbour_stats(np.array([[0, 5, 5, 5]])) == 0.0
    cube = np.stack(np.meshgrid(*[np.arange(3)] * 3, indexing="ij"), -1).reshape(-1, 3)
    counts = scenes.neighbour_counts(cube)
    centre = np.flatnonzero((cube == 1).all(axis=1))[0]
    assert counts[centre] == 26
    corner = np.flatnonzero((cube == 0).all(axis=1))[0]
    assert counts[corner] == 7
    # ordered adjacent pairs in a 3x3x3 block: (2 + 3 + 2)^3 offsets-positions minus self
    assert counts.sum() == 7**3 - 27
    line = np.array([[0, i, 0, 0] for i in range(10)])
    assert scenes.neighbour_stats(line) == pytest.approx(1.8)
    # different batches are not neighbours
    two = np.array([[0, 0, 0, 0], [1, 0, 0, 1]])
    assert scenes.neighbour_stats(two) == 0.0
    # diagonal contact counts
    diag = np.array([[0, 0, 0, 0], [0, 1, 1, 1]])
    assert scenes.neighbour_stats(diag) == 1.0


def test_neighbour_counts_brute_force():
    coords = scenes.uniform_random(400, 9, seed=4)
    counts = scenes.neighbour_counts(coords)
    xyz = coords[:, 1:].astype(np.int64)
    diff = np.abs(xyz[:, None, :] - xyz[None, :, :]).max(axis=2)
    ref = (diff == 1).sum(axis=1)
    np.testing.assert_array_equal(counts, ref)


def test_uniform_random():
    c = scenes.uniform_random(5000, 64, seed=1)
    assert c.shape == (5000, 4) and c.dtype == np.int32
    assert c[:, 1:].min() >= 0 and c[:, 1:].max() < 64
    assert len(np.unique(c, axis=0)) == 5000
    np.testing.assert_array_equal(c, np.unique(c, axis=0))  # sorted
    np.testing.assert_array_equal(c, scenes.uniform_random(5000, 64, seed=1))
    assert not np.array_equal(c, scenes.uniform_random(5000, 64, seed=2))
    full = scenes.uniform_random(27, 3)
    assert len(full) == 27
    with pytest.raises(ValueError):
        scenes.uniform_random(28, 3)


# --------------------------------------------------------------------------
# Meshes
# --------------------------------------------------------------------------


def test_mesh_surface_points_area_weighted():
    # two triangles in z = 0 and z = 1; the second has 3x the area
    v = np.array(
        [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [3, 0, 1], [0, 1, 1]], dtype=np.float64
    )
    f = np.array([[0, 1, 2], [3, 4, 5]])
    p = scenes.mesh_surface_points(v, f, 40_000, seed=0)
    assert p.shape == (40_000, 3) and p.dtype == np.float32
    top = p[:, 2] > 0.5
    assert top.mean() == pytest.approx(0.75, abs=0.01)
    low = p[~top]
    assert np.all(low[:, 0] >= -1e-6) and np.all(low[:, 1] >= -1e-6)
    assert np.all(low[:, 0] + low[:, 1] <= 1 + 1e-5)
    # uniform inside the triangle: centroid of the samples ~ triangle centroid
    np.testing.assert_allclose(low[:, :2].mean(axis=0), [1 / 3, 1 / 3], atol=0.01)
    np.testing.assert_array_equal(p, scenes.mesh_surface_points(v, f, 40_000, seed=0))


def _edge_use_counts(faces):
    e = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    return np.unique(e, axis=0, return_counts=True)[1]


def test_procedural_closed_mesh_is_closed():
    v, f = scenes.procedural_closed_mesh(subdiv=3)
    assert f.shape == (20 * 4**3, 3)
    assert np.all(_edge_use_counts(f) == 2)  # every edge has two faces
    assert len(v) - len(_edge_use_counts(f)) + len(f) == 2  # Euler: sphere
    assert np.isfinite(v).all()


def _outside_reachable(occ):
    """6-connected flood fill of empty space from the border of a padded grid."""
    occ = np.pad(occ, 1)
    reach = np.zeros_like(occ)
    reach[0, :, :] = reach[-1, :, :] = True
    reach[:, 0, :] = reach[:, -1, :] = True
    reach[:, :, 0] = reach[:, :, -1] = True
    reach &= ~occ
    while True:
        grow = reach.copy()
        grow[1:] |= reach[:-1]
        grow[:-1] |= reach[1:]
        grow[:, 1:] |= reach[:, :-1]
        grow[:, :-1] |= reach[:, 1:]
        grow[:, :, 1:] |= reach[:, :, :-1]
        grow[:, :, :-1] |= reach[:, :, 1:]
        grow &= ~occ
        if np.array_equal(grow, reach):
            return reach[1:-1, 1:-1, 1:-1]
        reach = grow


def test_surface_voxels_procedural_mesh():
    v, f = scenes.procedural_closed_mesh(subdiv=4)
    res = 48
    c = scenes.surface_voxels(v, f, resolution=res)
    assert c.dtype == np.int32 and c.shape[1] == 4
    np.testing.assert_array_equal(c, np.unique(c, axis=0))
    assert c[:, 1:].min() == 0 and c[:, 1:].max() == res - 1
    assert 11.0 <= scenes.neighbour_stats(c) <= 15.0
    # watertight: the empty space inside is not reachable from outside
    occ = np.zeros((res,) * 3, dtype=bool)
    occ[c[:, 1], c[:, 2], c[:, 3]] = True
    outside = _outside_reachable(occ)
    inside = ~occ & ~outside
    assert inside.sum() > 0.2 * len(c)
    lo = v.min(axis=0)
    scale = res / (v.max(axis=0) - lo).max()
    centre = np.floor((0.0 - lo) * scale).astype(int)
    assert inside[tuple(centre)]
    np.testing.assert_array_equal(c, scenes.surface_voxels(v, f, resolution=res))


# --------------------------------------------------------------------------
# PLY and files
# --------------------------------------------------------------------------

_QUAD_V = np.array(
    [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 1.0]]
)


def test_ply_ascii_with_extra_properties(tmp_path):
    path = tmp_path / "mesh_ascii.ply"
    lines = [
        "ply",
        "format ascii 1.0",
        "comment written by a test",
        "element vertex 5",
        "property float nx",
        "property float x",
        "property float y",
        "property float z",
        "property uchar red",
        "element face 2",
        "property uchar flags",
        "property list uchar int vertex_indices",
        "end_header",
    ]
    for i, p in enumerate(_QUAD_V):
        lines.append(f"0.5 {p[0]} {p[1]} {p[2]} {i * 40}")
    lines += ["7 4 0 1 2 3", "1 3 0 1 4"]
    path.write_text("\n".join(lines) + "\n")
    v, f = scenes.load_ply(path)
    np.testing.assert_allclose(v, _QUAD_V)
    np.testing.assert_array_equal(f, [[0, 1, 2], [0, 2, 3], [0, 1, 4]])


def test_ply_binary_double_uint_and_trailing_element(tmp_path):
    path = tmp_path / "mesh_bin.ply"
    header = "\n".join(
        [
            "ply",
            "format binary_little_endian 1.0",
            "element vertex 5",
            "property double x",
            "property double y",
            "property double z",
            "property uchar red",
            "property uchar green",
            "property float quality",
            "element face 3",
            "property list int uint vertex_indices",
            "property short tag",
            "element edge 1",
            "property int vertex1",
            "property int vertex2",
            "end_header",
        ]
    ) + "\n"
    vert = np.zeros(5, dtype=[("x", "<f8"), ("y", "<f8"), ("z", "<f8"), ("r", "u1"), ("g", "u1"), ("q", "<f4")])
    vert["x"], vert["y"], vert["z"] = _QUAD_V.T
    vert["r"], vert["g"], vert["q"] = 200, 13, 0.25
    body = vert.tobytes()
    # mixed polygon sizes force the row-by-row decoder
    for poly, tag in (([0, 1, 2, 3], 1), ([0, 1, 4], 2), ([1, 2, 4], 3)):
        body += np.int32(len(poly)).tobytes() + np.asarray(poly, "<u4").tobytes() + np.int16(tag).tobytes()
    body += np.asarray([0, 4], "<i4").tobytes()
    path.write_bytes(header.encode("ascii") + body)
    v, f = scenes.load_ply(path)
    np.testing.assert_array_equal(v, _QUAD_V)
    np.testing.assert_array_equal(f, [[0, 1, 2], [0, 2, 3], [0, 1, 4], [1, 2, 4]])


def test_ply_binary_triangles_fast_path(tmp_path):
    v0, f0 = scenes.procedural_closed_mesh(subdiv=2)
    for binary in (True, False):
        path = tmp_path / f"blob_{binary}.ply"
        scenes.save_ply(path, v0, f0, binary=binary)
        v, f = scenes.load_ply(path)
        np.testing.assert_allclose(v, v0.astype(np.float32), rtol=1e-6)
        np.testing.assert_array_equal(f, f0)


def test_ply_big_endian_points_only(tmp_path):
    path = tmp_path / "pts_be.ply"
    pts = np.random.default_rng(2).normal(size=(50, 3)).astype(">f4")
    header = "ply\nformat binary_big_endian 1.0\nelement vertex 50\n"
    header += "property float x\nproperty float y\nproperty float z\nend_header\n"
    path.write_bytes(header.encode("ascii") + pts.tobytes())
    v, f = scenes.load_ply(path)
    assert f is None
    np.testing.assert_array_equal(v, pts.astype(np.float64))


def test_ply_rejects_garbage(tmp_path):
    path = tmp_path / "bad.ply"
    path.write_bytes(b"not a ply\n")
    with pytest.raises(ValueError):
        scenes.load_ply(path)


def test_load_points(tmp_path):
    arr = np.random.default_rng(0).normal(size=(100, 5))
    np.save(tmp_path / "cloud.npy", arr)
    p = scenes.load_points(tmp_path / "cloud.npy")
    assert p.dtype == np.float32 and p.shape == (100, 3)
    np.testing.assert_allclose(p, arr[:, :3], rtol=1e-6)

    v, f = scenes.procedural_closed_mesh(subdiv=2)
    scenes.save_ply(tmp_path / "mesh.ply", v, f)
    p = scenes.load_points(tmp_path / "mesh.ply", n_points=3000)
    assert p.shape == (3000, 3) and p.dtype == np.float32
    r = np.linalg.norm(p / np.array([1.25, 1.0, 0.85]), axis=1)
    assert r.min() > 0.3 and r.max() < 2.0

    scenes.save_ply(tmp_path / "pts.ply", arr[:, :3])
    p = scenes.load_points(tmp_path / "pts.ply")
    np.testing.assert_allclose(p, arr[:, :3], rtol=1e-6)

    kitti = np.random.default_rng(1).normal(size=(10, 4)).astype("<f4")
    kitti.tofile(tmp_path / "000000.bin")
    np.testing.assert_array_equal(scenes.load_points(tmp_path / "000000.bin"), kitti[:, :3])

    with pytest.raises(ValueError):
        scenes.load_points(tmp_path / "cloud.xyz")
