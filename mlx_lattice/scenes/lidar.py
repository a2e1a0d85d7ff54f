"""One revolution of a simulated 64-beam rotating LiDAR in a procedural
street (:func:`lidar_sweep`). Rays are intersected analytically with the
scene primitives, so the output has the ring structure, range-dependent
density, occlusion shadows and mixed surface orientations of a real driving
scan.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SENSOR_HEIGHT", "hdl64_elevations", "lidar_sweep"]

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
