"""Synthetic and file-based point clouds for demos, tests and benchmarks.

Everything here depends on NumPy only.  The generators produce the kinds of
inputs sparse 3D convolution is used on in practice:

* :func:`lidar_sweep` -- one revolution of a simulated 64-beam rotating LiDAR
  in a procedural street.  Rays are intersected analytically with the scene
  primitives, so the output has the ring structure, range-dependent density,
  occlusion shadows and mixed surface orientations of a real driving scan.
* :func:`surface_voxels` -- a closed triangle mesh voxelized as a thin shell
  (the typical ShapeNet / ScanNet style input).
* :func:`uniform_random` -- unstructured unique voxels, a worst case for
  neighbourhood reuse.

Helpers convert points to integer voxel coordinates
(:func:`voxelize_points`), measure how connected a voxel set is
(:func:`neighbour_stats`) and read point clouds or meshes from disk
(:func:`load_points`, :func:`load_ply`).

Coordinates are returned as ``(N, 4)`` int32 arrays with rows
``(batch, x, y, z)``, unique and sorted lexicographically.
"""

from __future__ import annotations

import os
import sys

import numpy as np

__all__ = [
    "lidar_sweep",
    "hdl64_elevations",
    "voxelize_points",
    "neighbour_counts",
    "neighbour_stats",
    "mesh_surface_points",
    "procedural_closed_mesh",
    "surface_voxels",
    "uniform_random",
    "load_ply",
    "save_ply",
    "load_points",
]

SENSOR_HEIGHT = 1.8

# --------------------------------------------------------------------------
# Ray caster
# --------------------------------------------------------------------------


class _RayCaster:
    """Nearest-hit bookkeeping for a grid of rays sharing one origin.

    Rays are laid out as ``(beams, azimuth_steps)``.  Every primitive is only
    tested against the azimuth columns its footprint can cover, which keeps the
    cost close to proportional to the number of rays that actually hit it.
    """

    def __init__(self, origin, elevation, azimuth_steps):
        self.o = np.asarray(origin, dtype=np.float64)
        self.n_az = int(azimuth_steps)
        self.dphi = 2.0 * np.pi / self.n_az
        az = np.arange(self.n_az) * self.dphi
        ce = np.cos(elevation)[:, None]
        b = len(elevation)
        self.d = np.stack(
            [
                ce * np.cos(az)[None, :],
                ce * np.sin(az)[None, :],
                np.repeat(np.sin(elevation)[:, None], self.n_az, axis=1),
            ]
        )  # (3, beams, azimuth)
        self.t = np.full((b, self.n_az), np.inf)
        self.cos = np.zeros((b, self.n_az))
        self.prim = np.full((b, self.n_az), -1, dtype=np.int32)
        self._next_id = 0
        self.reflectivity: list[float] = []
        self.porous: list[bool] = []

    # -- bookkeeping -------------------------------------------------------

    def _register(self, reflectivity, porous):
        pid = self._next_id
        self._next_id += 1
        self.reflectivity.append(float(reflectivity))
        self.porous.append(bool(porous))
        return pid

    def _columns(self, phi_lo, phi_hi):
        """Azimuth column indices covering the angle interval [lo, hi]."""
        if phi_hi - phi_lo >= 2.0 * np.pi - 2.0 * self.dphi:
            return slice(None)
        j0 = int(np.floor(phi_lo / self.dphi))
        j1 = int(np.ceil(phi_hi / self.dphi))
        if j1 - j0 + 1 >= self.n_az:
            return slice(None)
        j0m = j0 % self.n_az
        if j0m + (j1 - j0) < self.n_az:
            return slice(j0m, j0m + (j1 - j0) + 1)
        return np.arange(j0, j1 + 1) % self.n_az

    def _columns_circle(self, cx, cy, radius):
        rx, ry = cx - self.o[0], cy - self.o[1]
        dist = np.hypot(rx, ry)
        if dist <= radius * 1.01 + 1e-9:
            return slice(None)
        half = np.arcsin(min(1.0, radius / dist))
        phi = np.arctan2(ry, rx)
        return self._columns(phi - half, phi + half)

    def _columns_polygon(self, xs, ys):
        """Columns covering a convex footprint given by its corners."""
        rx, ry = np.asarray(xs) - self.o[0], np.asarray(ys) - self.o[1]
        cx, cy = rx.mean(), ry.mean()
        # origin inside (or on) the convex polygon -> every column
        ex, ey = np.roll(rx, -1) - rx, np.roll(ry, -1) - ry
        cross = ex * (-ry) - ey * (-rx)
        if np.all(cross >= -1e-9) or np.all(cross <= 1e-9):
            return slice(None)
        ref = np.arctan2(cy, cx)
        rel = np.angle(np.exp(1j * (np.arctan2(ry, rx) - ref)))
        return self._columns(ref + rel.min(), ref + rel.max())

    def _commit(self, cols, t, cosine, pid):
        cur = self.t[:, cols]
        better = t < cur
        if not better.any():
            return
        self.t[:, cols] = np.where(better, t, cur)
        self.cos[:, cols] = np.where(better, cosine, self.cos[:, cols])
        self.prim[:, cols] = np.where(better, pid, self.prim[:, cols])

    # -- primitives --------------------------------------------------------

    def plane(self, normal, offset, reflectivity, y_range=(-np.inf, np.inf)):
        """Plane ``normal . p = offset`` restricted to ``y_range``."""
        pid = self._register(reflectivity, False)
        n = np.asarray(normal, dtype=np.float64)
        n = n / np.linalg.norm(n)
        nd = n[0] * self.d[0] + n[1] * self.d[1] + n[2] * self.d[2]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (offset - n @ self.o) / nd
        y = self.o[1] + t * self.d[1]
        ok = (t > 1e-6) & (y >= y_range[0]) & (y < y_range[1])
        self._commit(slice(None), np.where(ok, t, np.inf), np.abs(nd), pid)
        return pid

    def box(self, center, size, yaw=0.0, reflectivity=0.3, porous=False):
        """Box with a vertical axis, rotated by ``yaw`` about z."""
        pid = self._register(reflectivity, porous)
        cx, cy, cz = center
        hx, hy, hz = 0.5 * np.asarray(size, dtype=np.float64)
        c, s = np.cos(yaw), np.sin(yaw)
        corners = np.array([[-hx, -hy], [hx, -hy], [hx, hy], [-hx, hy]])
        xs = cx + c * corners[:, 0] - s * corners[:, 1]
        ys = cy + s * corners[:, 0] + c * corners[:, 1]
        cols = self._columns_polygon(xs, ys)
        dx, dy, dz = self.d[0][:, cols], self.d[1][:, cols], self.d[2][:, cols]
        # ray in the box frame
        ox, oy, oz = self.o[0] - cx, self.o[1] - cy, self.o[2] - cz
        lox, loy = c * ox + s * oy, -s * ox + c * oy
        ldx, ldy = c * dx + s * dy, -s * dx + c * dy
        tn = np.full(dx.shape, -np.inf)
        tf = np.full(dx.shape, np.inf)
        axis = np.zeros(dx.shape, dtype=np.int8)
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, (o, d, h) in enumerate(((lox, ldx, hx), (loy, ldy, hy), (oz, dz, hz))):
                inv = 1.0 / d
                t1 = (-h - o) * inv
                t2 = (h - o) * inv
                lo = np.minimum(t1, t2)
                hi = np.maximum(t1, t2)
                upd = lo > tn
                tn = np.where(upd, lo, tn)
                axis = np.where(upd, k, axis).astype(np.int8)
                tf = np.minimum(tf, hi)
        hit = (tn <= tf) & (tn > 1e-6)
        t = np.where(hit, tn, np.inf)
        cosine = np.abs(np.choose(axis, (ldx, ldy, dz)))
        self._commit(cols, t, cosine, pid)
        return pid

    def cylinder(self, cx, cy, radius, z0, z1, reflectivity=0.3, porous=False):
        """Capped vertical cylinder."""
        pid = self._register(reflectivity, porous)
        cols = self._columns_circle(cx, cy, radius)
        dx, dy, dz = self.d[0][:, cols], self.d[1][:, cols], self.d[2][:, cols]
        ox, oy, oz = self.o[0] - cx, self.o[1] - cy, self.o[2]
        a = dx * dx + dy * dy
        b = ox * dx + oy * dy
        cc = ox * ox + oy * oy - radius * radius
        disc = b * b - a * cc
        with np.errstate(divide="ignore", invalid="ignore"):
            ts = (-b - np.sqrt(disc)) / a
            z = oz + ts * dz
            side = (disc >= 0) & (ts > 1e-6) & (z >= z0) & (z <= z1)
            t = np.where(side, ts, np.inf)
            cos_side = np.abs((ox + ts * dx) * dx + (oy + ts * dy) * dy) / radius
            cosine = np.where(side, cos_side, 0.0)
            for zc in (z0, z1):
                tc = (zc - oz) / dz
                px, py = ox + tc * dx, oy + tc * dy
                cap = (tc > 1e-6) & (px * px + py * py <= radius * radius) & (tc < t)
                t = np.where(cap, tc, t)
                cosine = np.where(cap, np.abs(dz), cosine)
        self._commit(cols, t, cosine, pid)
        return pid

    def ellipsoid(self, center, radii, reflectivity=0.3, porous=False):
        """Axis-aligned ellipsoid."""
        pid = self._register(reflectivity, porous)
        cx, cy, cz = center
        rx, ry, rz = radii
        cols = self._columns_circle(cx, cy, max(rx, ry))
        dx, dy, dz = self.d[0][:, cols], self.d[1][:, cols], self.d[2][:, cols]
        ox, oy, oz = (self.o[0] - cx) / rx, (self.o[1] - cy) / ry, (self.o[2] - cz) / rz
        sx, sy, sz = dx / rx, dy / ry, dz / rz
        a = sx * sx + sy * sy + sz * sz
        b = ox * sx + oy * sy + oz * sz
        cc = ox * ox + oy * oy + oz * oz - 1.0
        disc = b * b - a * cc
        with np.errstate(invalid="ignore"):
            t = (-b - np.sqrt(disc)) / a
        hit = (disc >= 0) & (t > 1e-6)
        t = np.where(hit, t, np.inf)
        tt = np.where(hit, t, 0.0)
        # gradient of the implicit function at the hit point
        nx, ny, nz = (ox + tt * sx) / rx, (oy + tt * sy) / ry, (oz + tt * sz) / rz
        norm = np.sqrt(nx * nx + ny * ny + nz * nz) + 1e-12
        cosine = np.abs(nx * dx + ny * dy + nz * dz) / norm
        self._commit(cols, t, cosine, pid)
        return pid


def hdl64_elevations(beams=64):
    """Beam elevation angles in degrees, top to bottom, HDL-64E style.

    The upper half of the beams covers +2 .. -8.33 degrees (finer spacing),
    the lower half -8.83 .. -24.8 degrees.
    """
    beams = int(beams)
    if beams < 1:
        raise ValueError("beams must be >= 1")
    if beams < 4:
        return np.linspace(2.0, -24.8, beams)
    upper = beams // 2
    return np.concatenate(
        [np.linspace(2.0, -8.33, upper), np.linspace(-8.83, -24.8, beams - upper)]
    )


# --------------------------------------------------------------------------
# Procedural street
# --------------------------------------------------------------------------


def _street_scene(caster: _RayCaster, rng: np.random.Generator):
    """Populate ``caster`` with a random street; returns lane-marking info."""
    extent = 150.0  # half length of the street along x
    w_left = rng.uniform(7.0, 10.0)  # road edge at +y
    w_right = rng.uniform(5.5, 7.5)  # road edge at -y (sensor drives at y = 0)
    camber = rng.uniform(0.01, 0.025)  # the road falls off towards both curbs
    curb = rng.uniform(0.12, 0.18)
    cross_x = rng.choice([-1.0, 1.0]) * rng.uniform(18.0, 45.0)
    cross_w = rng.uniform(10.0, 16.0)
    cross_lo, cross_hi = cross_x - cross_w / 2, cross_x + cross_w / 2

    # crowned road surface: two gently tilted half planes meeting at y = 0
    road = [
        caster.plane((0.0, camber, 1.0), 0.0, 0.10, (0.0, w_left)),
        caster.plane((0.0, -camber, 1.0), 0.0, 0.10, (-w_right, 0.0)),
    ]
    # open ground far behind the buildings and down the cross street
    caster.plane((0.0, 0.0, 1.0), -camber * min(w_left, w_right), 0.15)

    def skip_cross(x0, x1, margin):
        return x1 > cross_lo - margin and x0 < cross_hi + margin

    for side, w in ((1.0, w_left), (-1.0, w_right)):
        sidewalk = rng.uniform(3.0, 5.0)
        level = curb - camber * w  # height of the sidewalk surface
        # an "open" side has a square, park or parking lot in front of
        # set-back buildings instead of a continuous street wall
        open_side = rng.random() < 0.4
        setback = rng.uniform(12.0, 25.0) if open_side else 0.0
        yard = 75.0
        y_mid = side * (w + yard / 2)
        # raised sidewalk + lots behind it, interrupted by the cross street
        for x0, x1 in ((-extent, cross_lo), (cross_hi, extent)):
            caster.box(
                ((x0 + x1) / 2, y_mid, (level - 1.0) / 2),
                (x1 - x0, yard, level + 1.0),
                reflectivity=0.22,
            )

        # building facades with gaps
        x = -extent + rng.uniform(0.0, 10.0)
        while x < extent:
            if rng.random() < (0.45 if open_side else 0.25):
                x += rng.uniform(3.0, 12.0)  # a gap between buildings
                if rng.random() < 0.5:  # a wall or hedge fills some gaps
                    length = rng.uniform(2.0, 8.0)
                    height = rng.uniform(0.6, 2.0)
                    y = side * (w + sidewalk + setback + rng.uniform(0.2, 1.0))
                    if not skip_cross(x, x + length, sidewalk):
                        hedge = rng.random() < 0.5
                        caster.box(
                            (x + length / 2, y, level + height / 2),
                            (length, rng.uniform(0.3, 0.9), height),
                            reflectivity=0.35 if hedge else 0.4,
                            porous=hedge,
                        )
                continue
            width = rng.uniform(7.0, 28.0)
            x0, x1 = x, x + width
            x = x1 + rng.uniform(0.0, 0.6)
            if skip_cross(x0, x1, sidewalk):
                continue
            depth = rng.uniform(8.0, 20.0)
            height = rng.uniform(5.0, 24.0)
            front = w + sidewalk + setback + rng.uniform(0.0, 8.0 if open_side else 2.0)
            caster.box(
                ((x0 + x1) / 2, side * (front + depth / 2), (height + level - 0.5) / 2),
                (width, depth, height - level + 0.5),
                reflectivity=rng.uniform(0.2, 0.5),
            )
            # some ground floors carry an awning or a shop front
            if rng.random() < 0.3:
                caster.box(
                    ((x0 + x1) / 2, side * (front - 0.6), rng.uniform(2.6, 3.4)),
                    (width * rng.uniform(0.3, 0.8), 1.2, 0.15),
                    reflectivity=rng.uniform(0.2, 0.6),
                )

        if open_side:  # scattered trees and bushes, a few parked cars
            for _ in range(rng.integers(8, 20)):
                x = rng.uniform(-60.0, 60.0)
                y = side * (w + sidewalk + rng.uniform(2.0, setback - 1.0))
                if skip_cross(x, x, 4.0):
                    continue
                if rng.random() < 0.5:
                    trunk_h = rng.uniform(1.5, 3.0)
                    rz = rng.uniform(1.2, 2.5)
                    caster.cylinder(x, y, rng.uniform(0.1, 0.22), level, level + trunk_h, reflectivity=0.25)
                    caster.ellipsoid(
                        (x, y, level + trunk_h + 0.7 * rz),
                        (rng.uniform(1.0, 2.6), rng.uniform(1.0, 2.6), rz),
                        reflectivity=0.3,
                        porous=True,
                    )
                elif rng.random() < 0.6:
                    rb = rng.uniform(0.4, 1.2)
                    caster.ellipsoid((x, y, level + 0.5 * rb), (rb * 1.3, rb, rb), reflectivity=0.3, porous=True)
                else:
                    _car(caster, rng, x, y, level, rng.uniform(3.9, 4.9), rng.uniform(-0.2, 0.2) + np.pi / 2)

        # street lights
        x = -extent + rng.uniform(0.0, 20.0)
        y_pole = side * (w + 0.45)
        while x < extent:
            if not skip_cross(x, x, 1.0):
                r = rng.uniform(0.08, 0.14)
                h = rng.uniform(6.5, 9.0)
                caster.cylinder(x, y_pole, r, level, h, reflectivity=0.45)
                arm = rng.uniform(1.2, 2.5)
                caster.box((x, y_pole - side * arm / 2, h - 0.1), (0.12, arm, 0.12), reflectivity=0.45)
            x += rng.uniform(22.0, 35.0)

        # trees
        x = -extent + rng.uniform(0.0, 8.0)
        y_tree = side * (w + sidewalk * rng.uniform(0.55, 0.75))
        while x < extent:
            if rng.random() < 0.6 and not skip_cross(x, x, 3.0):
                trunk_h = rng.uniform(1.8, 3.2)
                caster.cylinder(x, y_tree, rng.uniform(0.12, 0.25), level, level + trunk_h, reflectivity=0.25)
                rxy = rng.uniform(1.2, 2.8)
                rz = rng.uniform(1.3, 2.6)
                caster.ellipsoid(
                    (x + rng.normal(0, 0.2), y_tree + rng.normal(0, 0.2), level + trunk_h + 0.7 * rz),
                    (rxy * rng.uniform(0.85, 1.15), rxy * rng.uniform(0.85, 1.15), rz),
                    reflectivity=0.3,
                    porous=True,
                )
            x += rng.uniform(7.0, 14.0)

        # parked cars along the curb
        x = -extent + rng.uniform(0.0, 5.0)
        while x < extent:
            length = rng.uniform(3.9, 4.9)
            if rng.random() < 0.65 and not skip_cross(x, x + length, 2.0):
                y = side * (w - rng.uniform(1.0, 1.25))
                _car(caster, rng, x + length / 2, y, -camber * abs(y), length, rng.normal(0.0, 0.03))
            x += length + rng.uniform(0.8, 4.0)

        # pedestrians on the sidewalk
        for _ in range(rng.integers(2, 6)):
            px = rng.uniform(-45.0, 45.0)
            py = side * (w + rng.uniform(0.6, sidewalk - 0.3))
            r = rng.uniform(0.18, 0.28)
            caster.cylinder(px, py, r, level, level + rng.uniform(1.55, 1.9), reflectivity=0.2)

    # traffic in the lanes (the sensor car drives at y = 0, facing +x)
    lanes = [y for y in (-3.5, 0.0, 3.5, 7.0) if -w_right + 1.2 < y < w_left - 1.2]
    for _ in range(rng.integers(2, 6)):
        y = lanes[rng.integers(len(lanes))]
        x = rng.uniform(8.0, 60.0) * rng.choice([-1.0, 1.0])
        length = rng.uniform(4.0, 5.0)
        if rng.random() < 0.2:  # a van or truck
            caster.box(
                (x, y, 0.35 + 1.3 - camber * abs(y)),
                (rng.uniform(5.5, 9.0), rng.uniform(2.1, 2.5), 2.6),
                yaw=rng.normal(0, 0.02),
                reflectivity=rng.uniform(0.2, 0.7),
            )
        else:
            y += rng.normal(0, 0.2)
            _car(caster, rng, x, y, -camber * abs(y), length, rng.normal(0.0, 0.02))

    return road, (w_left, w_right)


def _car(caster, rng, x, y, z, length, yaw):
    width = rng.uniform(1.7, 1.95)
    clearance = rng.uniform(0.2, 0.3)
    body_h = rng.uniform(0.6, 0.8)
    refl = rng.uniform(0.1, 0.8)
    caster.box((x, y, z + clearance + body_h / 2), (length, width, body_h), yaw=yaw, reflectivity=refl)
    cab_l = length * rng.uniform(0.45, 0.6)
    cab_h = rng.uniform(0.5, 0.7)
    shift = -0.08 * length
    caster.box(
        (x + np.cos(yaw) * shift, y + np.sin(yaw) * shift, z + clearance + body_h + cab_h / 2),
        (cab_l, width * 0.9, cab_h),
        yaw=yaw,
        reflectivity=refl * 0.6,
    )


def lidar_sweep(seed=0, beams=64, azimuth_steps=2048, max_range=70.0):
    """Simulate one revolution of a rotating LiDAR in a procedural street.

    The sensor is mounted ``1.8`` m above the crown of the road and points
    are returned in its frame (x forward along the street, y left, z up), so
    the road surface lies near ``z = -1.8``.  Beam elevations follow
    :func:`hdl64_elevations` (about +2 to -24.8 degrees).  Each ray returns
    its nearest intersection with the scene; rays without a hit closer than
    ``max_range`` are dropped.  Ranges carry 2 cm Gaussian noise, plus some
    penetration into foliage and hedges.

    The street (road with camber and painted lines, raised sidewalks, a cross
    street, building blocks with gaps, walls and hedges, street lights,
    trees, parked and moving vehicles, pedestrians) is drawn from ``seed``.

    Returns
    -------
    points : (P, 3) float32, metres, sensor frame.
    intensity : (P,) float32 in [0, 1], from surface reflectivity, incidence
        angle and range.
    """
    rng = np.random.default_rng(seed)
    elevation = np.deg2rad(hdl64_elevations(beams))
    caster = _RayCaster((0.0, 0.0, SENSOR_HEIGHT), elevation, azimuth_steps)
    road, (w_left, w_right) = _street_scene(caster, rng)

    # azimuth-major order, the way a spinning sensor emits its packets
    t = caster.t.T.ravel()
    keep = np.flatnonzero(t < max_range)
    t = t[keep]
    prim = caster.prim.T.ravel()[keep]
    cosine = caster.cos.T.ravel()[keep]
    d = caster.d.transpose(0, 2, 1).reshape(3, -1)[:, keep]

    refl = np.asarray(caster.reflectivity)[prim]
    porous = np.asarray(caster.porous)[prim]
    r = t + rng.normal(0.0, 0.02, size=t.shape)
    r = r + porous * rng.exponential(0.12, size=t.shape)
    pts = caster.o[:, None] + r[None, :] * d

    # painted lane markings on the road surface
    on_road = np.isin(prim, road)
    if on_road.any():
        px, py = pts[0, on_road], pts[1, on_road]
        lines = [y for y in (-1.75, 1.75, 5.25) if -w_right + 1.0 < y < w_left - 1.0]
        dashed = np.zeros(px.shape, dtype=bool)
        for y in lines:
            dashed |= (np.abs(py - y) < 0.08) & (np.mod(px, 9.0) < 3.0)
        edges = (np.abs(py - (w_left - 0.3)) < 0.08) | (np.abs(py + (w_right - 0.3)) < 0.08)
        paint = refl[on_road]
        paint[dashed | edges] = 0.75
        refl[on_road] = paint

    inten = refl * (0.25 + 0.75 * cosine) * np.exp(-r / 150.0)
    inten = np.clip(inten + rng.normal(0.0, 0.01, size=t.shape), 0.0, 1.0)
    pts -= caster.o[:, None]
    return pts.T.astype(np.float32), inten.astype(np.float32)


# --------------------------------------------------------------------------
# Voxel helpers
# --------------------------------------------------------------------------

_MAX_KEY = np.iinfo(np.int64).max


def _radix(lo, hi):
    """Mixed-radix bases for values in [lo, hi] per column, or None on overflow."""
    spans = [int(h) - int(l) + 1 for l, h in zip(lo, hi)]
    total = 1
    for s in spans:
        total *= s
    if total > _MAX_KEY:
        return None
    return spans


def _pack(values, lo, spans):
    key = np.zeros(len(values), dtype=np.int64)
    for k, s in enumerate(spans):
        key = key * s + (values[:, k].astype(np.int64) - int(lo[k]))
    return key


def _unpack(key, lo, spans):
    out = np.empty((len(key), len(spans)), dtype=np.int64)
    rest = key.copy()
    for k in range(len(spans) - 1, -1, -1):
        rest, out[:, k] = np.divmod(rest, spans[k])
        out[:, k] += int(lo[k])
    return out


def _unique_rows(q):
    """Unique rows of an int64 array, sorted lexicographically."""
    if len(q) == 0:
        return q.reshape(0, q.shape[1])
    lo, hi = q.min(axis=0), q.max(axis=0)
    spans = _radix(lo, hi)
    if spans is None:
        return np.unique(q, axis=0)
    return _unpack(np.unique(_pack(q, lo, spans)), lo, spans)


def _with_batch(q, batch):
    out = np.empty((len(q), 4), dtype=np.int32)
    out[:, 0] = batch
    out[:, 1:] = q
    return out


def voxelize_points(points, voxel_size, batch=0):
    """Unique voxels ``floor(points / voxel_size)`` as (N, 4) int32 rows.

    Rows are ``(batch, x, y, z)``, sorted lexicographically.  Only the first
    three columns of ``points`` are used.
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] < 3:
        raise ValueError("points must have shape (N, 3+)")
    if voxel_size <= 0:
        raise ValueError("voxel_size must be positive")
    q = np.floor(pts[:, :3] / voxel_size)
    if q.size and (q.min() < np.iinfo(np.int32).min or q.max() > np.iinfo(np.int32).max):
        raise ValueError("voxel coordinates overflow int32; use a larger voxel_size")
    return _with_batch(_unique_rows(q.astype(np.int64)), batch)


_OFFSETS26 = np.array(
    [(i, j, k) for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1) if (i, j, k) != (0, 0, 0)],
    dtype=np.int64,
)


def neighbour_counts(coords):
    """Per voxel, how many of its 26 neighbours (same batch) are occupied.

    ``coords`` is (N, 4) ``(batch, x, y, z)`` or (N, 3) ``(x, y, z)``; rows
    are assumed unique.
    """
    c = np.asarray(coords, dtype=np.int64)
    if c.ndim != 2 or c.shape[1] not in (3, 4):
        raise ValueError("coords must have shape (N, 3) or (N, 4)")
    n = len(c)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    if c.shape[1] == 3:
        c = np.concatenate([np.zeros((n, 1), dtype=np.int64), c], axis=1)
    lo = c.min(axis=0)
    hi = c.max(axis=0)
    lo[1:] -= 1  # room for the -1 / +1 offsets
    hi[1:] += 1
    spans = _radix(lo, hi)
    counts = np.zeros(n, dtype=np.int32)
    if spans is None:  # astronomically sparse coordinates: hash rows instead
        table = {tuple(r) for r in c.tolist()}
        for off in _OFFSETS26:
            shifted = c.copy()
            shifted[:, 1:] += off
            counts += np.fromiter((tuple(r) in table for r in shifted.tolist()), bool, n)
        return counts
    key = _pack(c, lo, spans)
    order = np.sort(key)
    strides = np.array([spans[2] * spans[3], spans[3], 1], dtype=np.int64)
    for off in _OFFSETS26:
        q = key + int(off @ strides)
        idx = np.searchsorted(order, q)
        np.minimum(idx, n - 1, out=idx)
        counts += order[idx] == q
    return counts


def neighbour_stats(coords):
    """Mean number of occupied neighbours (out of 26) per voxel."""
    counts = neighbour_counts(coords)
    return float(counts.mean()) if len(counts) else 0.0


def uniform_random(n, extent, seed=0, batch=0):
    """``n`` distinct random voxels in the cube ``[0, extent)^3``, sorted."""
    n, extent = int(n), int(extent)
    total = extent**3
    if n < 0 or n > total:
        raise ValueError(f"cannot draw {n} distinct voxels from a cube of {total}")
    rng = np.random.default_rng(seed)
    lin = np.sort(rng.choice(total, size=n, replace=False).astype(np.int64))
    x, rest = np.divmod(lin, extent * extent)
    y, z = np.divmod(rest, extent)
    return _with_batch(np.stack([x, y, z], axis=1), batch)


# --------------------------------------------------------------------------
# Meshes
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# PLY I/O
# --------------------------------------------------------------------------

_PLY_TYPES = {
    "char": "i1", "int8": "i1",
    "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2",
    "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4",
    "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4",
    "double": "f8", "float64": "f8",
}


def _ply_type(name):
    try:
        return _PLY_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown PLY property type {name!r}") from None


def _parse_ply_header(fh):
    first = fh.readline().strip()
    if first != b"ply":
        raise ValueError("not a PLY file")
    fmt = None
    elements = []  # [name, count, [(prop, type) or (prop, (count_type, item_type))]]
    while True:
        line = fh.readline()
        if not line:
            raise ValueError("PLY header has no end_header")
        parts = line.decode("ascii", errors="replace").split()
        if not parts or parts[0] in ("comment", "obj_info"):
            continue
        if parts[0] == "end_header":
            break
        if parts[0] == "format":
            fmt = parts[1]
        elif parts[0] == "element":
            elements.append([parts[1], int(parts[2]), []])
        elif parts[0] == "property":
            if not elements:
                raise ValueError("PLY property before any element")
            if parts[1] == "list":
                elements[-1][2].append((parts[4], (_ply_type(parts[2]), _ply_type(parts[3]))))
            else:
                elements[-1][2].append((parts[2], _ply_type(parts[1])))
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise ValueError(f"unsupported PLY format {fmt!r}")
    return fmt, elements


def _read_binary_element(buf, pos, count, props, endian):
    """Decode one element block; returns (dict of columns, new position)."""
    if all(not isinstance(t, tuple) for _, t in props):
        dt = np.dtype([(name, endian + t) for name, t in props])
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos)
        return {name: arr[name] for name, _ in props}, pos + count * dt.itemsize
    # Fast path: a single list whose length is the same on every row
    # (e.g. an all-triangle face element), possibly with scalars around it.
    if count > 0:
        guess = _fixed_list_dtype(buf, pos, props, endian)
        if guess is not None:
            dt, list_name, n_items = guess
            if pos + count * dt.itemsize <= len(buf):
                arr = np.frombuffer(buf, dtype=dt, count=count, offset=pos)
                if np.all(arr["__n"] == n_items):
                    cols = {name: arr[name] for name, t in props if not isinstance(t, tuple)}
                    cols[list_name] = [np.asarray(arr[list_name]).reshape(count, n_items)]
                    return cols, pos + count * dt.itemsize
    # General path: walk the rows one by one.
    cols = {name: [] for name, _ in props}
    for _ in range(count):
        for name, t in props:
            if isinstance(t, tuple):
                ct, it = (np.dtype(endian + x) for x in t)
                n = int(np.frombuffer(buf, dtype=ct, count=1, offset=pos)[0])
                pos += ct.itemsize
                cols[name].append(np.frombuffer(buf, dtype=it, count=n, offset=pos))
                pos += n * it.itemsize
            else:
                dt = np.dtype(endian + t)
                cols[name].append(np.frombuffer(buf, dtype=dt, count=1, offset=pos)[0])
                pos += dt.itemsize
    out = {}
    for name, t in props:
        out[name] = cols[name] if isinstance(t, tuple) else np.asarray(cols[name])
    return out, pos


def _fixed_list_dtype(buf, pos, props, endian):
    lists = [(name, t) for name, t in props if isinstance(t, tuple)]
    if len(lists) != 1:
        return None
    fields, offset = [], pos
    list_name, n_items = None, 0
    for name, t in props:
        if isinstance(t, tuple):
            ct, it = endian + t[0], endian + t[1]
            n_items = int(np.frombuffer(buf, dtype=ct, count=1, offset=offset)[0])
            fields += [("__n", ct), (name, it, (n_items,))]
            list_name = name
            offset += np.dtype(ct).itemsize + n_items * np.dtype(it).itemsize
        else:
            fields.append((name, endian + t))
            offset += np.dtype(t).itemsize
    return np.dtype(fields), list_name, n_items


def _read_ascii_element(lines, count, props):
    rows = [next(lines).split() for _ in range(count)]
    has_list = any(isinstance(t, tuple) for _, t in props)
    if not has_list:
        if count == 0:
            return {name: np.zeros(0, dtype=t) for name, t in props}
        arr = np.array(rows, dtype=np.float64)
        return {name: arr[:, k].astype(t) for k, (name, t) in enumerate(props)}
    lists = [k for k, (_, t) in enumerate(props) if isinstance(t, tuple)]
    if count and len(lists) == 1 and len({len(r) for r in rows}) == 1:
        # every row has the same length: decode the whole block at once
        arr = np.array(rows, dtype=np.float64)
        k = lists[0]
        n_items = int(arr[0, k])
        if np.all(arr[:, k] == n_items) and arr.shape[1] == len(props) + n_items:
            out, col = {}, 0
            for name, t in props:
                if isinstance(t, tuple):
                    out[name] = [arr[:, col + 1 : col + 1 + n_items].astype(t[1])]
                    col += 1 + n_items
                else:
                    out[name] = arr[:, col].astype(t)
                    col += 1
            return out
    cols = {name: [] for name, _ in props}
    for row in rows:
        k = 0
        for name, t in props:
            if isinstance(t, tuple):
                n = int(row[k])
                cols[name].append(np.array(row[k + 1 : k + 1 + n], dtype=np.float64).astype(t[1]))
                k += 1 + n
            else:
                cols[name].append(float(row[k]))
                k += 1
    return {name: (cols[name] if isinstance(t, tuple) else np.asarray(cols[name], dtype=t)) for name, t in props}


def _faces_from_lists(polys):
    """Triangulate a list of index arrays (or one (F, k) array) as fans."""
    if len(polys) == 1 and isinstance(polys[0], np.ndarray) and polys[0].ndim == 2:
        block = polys[0].astype(np.int64)
        k = block.shape[1]
        if k < 3:
            return np.zeros((0, 3), dtype=np.int64)
        return np.concatenate([block[:, [0, i, i + 1]] for i in range(1, k - 1)])
    tris = []
    for p in polys:
        p = np.asarray(p, dtype=np.int64)
        for i in range(1, len(p) - 1):
            tris.append((p[0], p[i], p[i + 1]))
    return np.asarray(tris, dtype=np.int64).reshape(-1, 3)


def load_ply(path):
    """Read a PLY file (ascii, binary little or big endian).

    Returns ``(vertices (V, 3) float64, faces (F, 3) int64 or None)``.
    Extra vertex properties (normals, colours, ...) and other elements are
    skipped; polygons with more than three corners are fan-triangulated.
    """
    with open(path, "rb") as fh:
        fmt, elements = _parse_ply_header(fh)
        body = fh.read()
    data = {}
    if fmt == "ascii":
        lines = iter(ln for ln in body.decode("ascii", errors="replace").splitlines() if ln.strip())
        for name, count, props in elements:
            data[name] = _read_ascii_element(lines, count, props)
    else:
        endian = "<" if fmt == "binary_little_endian" else ">"
        pos = 0
        for name, count, props in elements:
            data[name], pos = _read_binary_element(body, pos, count, props, endian)
    if "vertex" not in data:
        raise ValueError("PLY file has no vertex element")
    vert = data["vertex"]
    try:
        vertices = np.stack([np.asarray(vert[k], dtype=np.float64) for k in ("x", "y", "z")], axis=1)
    except KeyError:
        raise ValueError("PLY vertex element lacks x, y, z") from None
    faces = None
    face_el = data.get("face")
    if face_el is not None:
        face_props = next(props for name, _, props in elements if name == "face")
        list_names = [n for n, t in face_props if isinstance(t, tuple)]
        pick = next((n for n in ("vertex_indices", "vertex_index") if n in list_names), None)
        pick = pick or (list_names[0] if list_names else None)
        if pick is not None:
            faces = _faces_from_lists(face_el[pick])
            if len(faces) == 0:
                faces = None
            elif faces.min() < 0 or faces.max() >= len(vertices):
                raise ValueError("PLY face index out of range")
    return vertices, faces


def save_ply(path, vertices, faces=None, binary=True):
    """Write vertices (float32) and optional triangles (uchar count, int index)."""
    v = np.asarray(vertices, dtype=np.float32)[:, :3]
    f = None if faces is None else np.asarray(faces, dtype=np.int32)
    fmt = "binary_little_endian" if binary else "ascii"
    header = ["ply", f"format {fmt} 1.0", f"element vertex {len(v)}",
              "property float x", "property float y", "property float z"]
    if f is not None:
        header += [f"element face {len(f)}", "property list uchar int vertex_indices"]
    header.append("end_header")
    with open(path, "wb") as fh:
        fh.write(("\n".join(header) + "\n").encode("ascii"))
        if binary:
            fh.write(v.astype("<f4").tobytes())
            if f is not None:
                rec = np.zeros(len(f), dtype=[("n", "u1"), ("i", "<i4", (f.shape[1],))])
                rec["n"] = f.shape[1]
                rec["i"] = f
                fh.write(rec.tobytes())
        else:
            lines = [" ".join(repr(float(x)) for x in row) for row in v]
            if f is not None:
                lines += [f"{len(row)} " + " ".join(str(int(i)) for i in row) for row in f]
            fh.write(("\n".join(lines) + "\n").encode("ascii"))


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def load_points(path, n_points=200_000, seed=0):
    """Load a point cloud as (N, 3) float32.

    * ``.npy``: an (N, 3+) array; extra columns are dropped.
    * ``.ply``: the vertices, or -- when the file has faces -- ``n_points``
      area-weighted samples of the surface.
    * ``.bin``: KITTI Velodyne scans (float32 x, y, z, reflectance).
    """
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext == ".npy":
        arr = np.load(path)
        if arr.ndim != 2 or arr.shape[1] < 3:
            raise ValueError(f"expected an (N, 3+) array in {path}, got {arr.shape}")
        return np.ascontiguousarray(arr[:, :3], dtype=np.float32)
    if ext == ".ply":
        vertices, faces = load_ply(path)
        if faces is not None:
            return mesh_surface_points(vertices, faces, n_points, seed=seed)
        return vertices.astype(np.float32)
    if ext == ".bin":
        arr = np.fromfile(path, dtype="<f4")
        if arr.size % 4:
            raise ValueError(f"{path} is not a float32 x4 point file")
        return np.ascontiguousarray(arr.reshape(-1, 4)[:, :3])
    raise ValueError(f"unsupported point file type {ext!r} (use .npy, .ply or .bin)")


if __name__ == "__main__":  # quick statistics: python -m mlx_lattice.scenes [seed]
    import time

    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    t0 = time.perf_counter()
    pts, inten = lidar_sweep(seed)
    dt = time.perf_counter() - t0
    print(f"lidar_sweep(seed={seed}): {len(pts)} points in {dt:.2f} s")
    for vs in (0.05, 0.1, 0.2):
        c = voxelize_points(pts, vs)
        print(f"  voxel {vs:.2f} m: {len(c)} voxels, {neighbour_stats(c):.2f} neighbours / 26")
