"""Independent reference for sparse convolution, written from the semantic
contract alone: every op is the dense op on the voxel grid read out at its
output support. Brute force in float64 over Python dictionaries (edges) and,
as a cross-check of the edges, over dense NumPy grids. Small sizes only.
"""

from __future__ import annotations

import itertools

import numpy as np


def _t3(v):
    return (v,) * 3 if np.isscalar(v) else tuple(v)


def offsets(kernel_size):
    """Kernel offsets d in weight order (dx outer, dz inner) with their index."""
    kx, ky, kz = _t3(kernel_size)
    return list(itertools.product(range(kx), range(ky), range(kz)))


def _index(coords):
    return {tuple(int(v) for v in c): i for i, c in enumerate(np.asarray(coords))}


# ------------------------------------------------------------------ supports
def forward_support(coords, kernel_size, stride=1, padding=0, dilation=1):
    """Every q (in a bounding box) whose receptive field holds an input."""
    coords = np.asarray(coords, dtype=np.int64)
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    present = set(map(tuple, coords.tolist()))
    out = set()
    for b in sorted(set(coords[:, 0].tolist())):
        cb = coords[coords[:, 0] == b, 1:]
        lo = [(int(cb[:, a].min()) + p[a] - dl[a] * (ks[a] - 1)) // s[a] - 1 for a in range(3)]
        hi = [(int(cb[:, a].max()) + p[a]) // s[a] + 1 for a in range(3)]
        for q in itertools.product(*(range(lo[a], hi[a] + 1) for a in range(3))):
            for d in offsets(ks):
                src = (b,) + tuple(s[a] * q[a] - p[a] + dl[a] * d[a] for a in range(3))
                if src in present:
                    out.add((b,) + q)
                    break
    return np.array(sorted(out), dtype=np.int64).reshape(-1, 4)


def generative_support(coords, kernel_size, stride=1, padding=0, dilation=1):
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    out = set()
    for c in np.asarray(coords, dtype=np.int64).tolist():
        for d in offsets(ks):
            out.add((c[0],) + tuple(s[a] * c[a + 1] - p[a] + dl[a] * d[a] for a in range(3)))
    return np.array(sorted(out), dtype=np.int64).reshape(-1, 4)


# ------------------------------------------------------------------ edges
def conv_edges(in_coords, out_coords, kernel_size, stride=1, padding=0, dilation=1):
    """(out row, in row, k) with in = s*out - padding + dilation*d."""
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    idx = _index(in_coords)
    edges = []
    for o, q in enumerate(np.asarray(out_coords, dtype=np.int64).tolist()):
        for k, d in enumerate(offsets(ks)):
            src = (q[0],) + tuple(s[a] * q[a + 1] - p[a] + dl[a] * d[a] for a in range(3))
            if src in idx:
                edges.append((o, idx[src], k))
    return np.array(edges, dtype=np.int64).reshape(-1, 3)


def transposed_edges(in_coords, out_coords, kernel_size, stride=1, padding=0, dilation=1):
    """(out row, in row, k) with out = s*in - padding + dilation*d."""
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    idx = _index(out_coords)
    edges = []
    for i, c in enumerate(np.asarray(in_coords, dtype=np.int64).tolist()):
        for k, d in enumerate(offsets(ks)):
            dst = (c[0],) + tuple(s[a] * c[a + 1] - p[a] + dl[a] * d[a] for a in range(3))
            if dst in idx:
                edges.append((idx[dst], i, k))
    return np.array(edges, dtype=np.int64).reshape(-1, 3)


def subm_padding(kernel_size, dilation=1):
    return tuple(d * ((k - 1) // 2) for k, d in zip(_t3(kernel_size), _t3(dilation)))


# ------------------------------------------------------------------ values
def mapped(weight):
    """(C_out, Kx, Ky, Kz, C_in) -> per offset (K, C_out, C_in) float64."""
    w = np.asarray(weight, dtype=np.float64)
    return w.reshape(w.shape[0], -1, w.shape[-1]).transpose(1, 0, 2)


def apply(edges, feats, weight, n_out, bias=None):
    """y[o] = sum over edges W[k] x[i] (+ bias), float64."""
    x = np.asarray(feats, dtype=np.float64)
    w = mapped(weight)
    y = np.zeros((n_out, w.shape[1]))
    for o, i, k in edges:
        y[o] += w[k] @ x[i]
    if bias is not None:
        y += np.asarray(bias, dtype=np.float64)
    return y


def grads(edges, feats, weight, cotangent):
    """Gradients of sum(cotangent * y) w.r.t. feats, weight (5D) and bias."""
    x = np.asarray(feats, dtype=np.float64)
    g = np.asarray(cotangent, dtype=np.float64)
    w = mapped(weight)
    dx = np.zeros_like(x)
    dw = np.zeros_like(w)
    for o, i, k in edges:
        dx[i] += w[k].T @ g[o]
        dw[k] += np.outer(g[o], x[i])
    c_out, kx, ky, kz, c_in = np.shape(weight)
    dw5 = dw.transpose(1, 0, 2).reshape(c_out, kx, ky, kz, c_in)
    return dx, dw5, g.sum(axis=0)


# ------------------------------------------------------------------ dense check
def dense_conv(in_coords, feats, weight, out_coords, stride=1, padding=0, dilation=1):
    """The dense cross-correlation on a zero-filled grid, read at out_coords."""
    ks = tuple(np.shape(weight)[1:4])
    s, p, dl = map(_t3, (stride, padding, dilation))
    ci = np.asarray(in_coords, dtype=np.int64)
    co = np.asarray(out_coords, dtype=np.int64)
    x = np.asarray(feats, dtype=np.float64)
    w = mapped(weight)
    if len(co) == 0:
        return np.zeros((0, w.shape[1]))
    if len(ci) == 0:
        return np.zeros((len(co), w.shape[1]))
    lo = ci[:, 1:].min(0)
    shape = ci[:, 1:].max(0) - lo + 1
    nb = int(max(ci[:, 0].max(), co[:, 0].max())) + 1
    grid = np.zeros((nb, *shape, x.shape[1]))
    grid[ci[:, 0], *(ci[:, 1:] - lo).T] = x
    y = np.zeros((len(co), w.shape[1]))
    for k, d in enumerate(offsets(ks)):
        src = np.stack([s[a] * co[:, a + 1] - p[a] + dl[a] * d[a] for a in range(3)], 1) - lo
        ok = np.all((src >= 0) & (src < shape), axis=1)
        vals = np.zeros((len(co), x.shape[1]))
        vals[ok] = grid[co[ok, 0], *src[ok].T]
        y += vals @ w[k].T
    return y


def dense_conv_transpose(in_coords, feats, weight, out_coords, stride=1, padding=0, dilation=1):
    """The dense transposed convolution (scatter-add on a grid), read at out_coords."""
    ks = tuple(np.shape(weight)[1:4])
    s, p, dl = map(_t3, (stride, padding, dilation))
    ci = np.asarray(in_coords, dtype=np.int64)
    co = np.asarray(out_coords, dtype=np.int64)
    x = np.asarray(feats, dtype=np.float64)
    w = mapped(weight)
    if len(co) == 0 or len(ci) == 0:
        return np.zeros((len(co), w.shape[1]))
    lo = co[:, 1:].min(0)
    shape = co[:, 1:].max(0) - lo + 1
    nb = int(max(ci[:, 0].max(), co[:, 0].max())) + 1
    grid = np.zeros((nb, *shape, w.shape[1]))
    for k, d in enumerate(offsets(ks)):
        dst = np.stack([s[a] * ci[:, a + 1] - p[a] + dl[a] * d[a] for a in range(3)], 1) - lo
        ok = np.all((dst >= 0) & (dst < shape), axis=1)
        np.add.at(grid, (ci[ok, 0], *dst[ok].T), x[ok] @ w[k].T)
    return grid[co[:, 0], *(co[:, 1:] - lo).T]


# ------------------------------------------------------------------ data
def random_coords(rng, n, extent=6, batches=1, low=None):
    """Up to n unique (b, x, y, z) rows; low defaults to -extent//2 (negatives)."""
    low = -(extent // 2) if low is None else low
    rows = np.concatenate(
        [rng.integers(0, batches, (n, 1)), rng.integers(low, low + extent, (n, 3))], axis=1
    )
    return np.unique(rows, axis=0).astype(np.int32)


def match_rows(actual_coords, expected_coords):
    """Permutation p with actual[p[j]] == expected[j]; asserts equal sets."""
    a = _index(actual_coords)
    e = [tuple(int(v) for v in c) for c in np.asarray(expected_coords)]
    assert len(a) == len(e) and set(a) == set(e), "output supports differ"
    return np.array([a[c] for c in e], dtype=np.int64)


# ------------------------------------------------------------------ pooling
def dense_pool(in_coords, feats, out_coords, kernel_size, stride=1, padding=0, dilation=1, reduce="max",
               count_empty=False):
    """Pooling on dense grids: inactive cells are -inf for max and 0 for sums;
    averages divide by the active count (or the kernel volume), float64."""
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    ci = np.asarray(in_coords, dtype=np.int64)
    co = np.asarray(out_coords, dtype=np.int64)
    x = np.asarray(feats, dtype=np.float64)
    c = x.shape[1]
    if len(co) == 0:
        return np.zeros((0, c))
    lo = ci[:, 1:].min(0)
    shape = ci[:, 1:].max(0) - lo + 1
    nb = int(max(ci[:, 0].max(), co[:, 0].max())) + 1
    fill = -np.inf if reduce == "max" else 0.0
    grid = np.full((nb, *shape, c), fill)
    grid[ci[:, 0], *(ci[:, 1:] - lo).T] = x
    ones = np.zeros((nb, *shape))
    ones[ci[:, 0], *(ci[:, 1:] - lo).T] = 1.0
    acc = np.full((len(co), c), fill)
    count = np.zeros(len(co))
    for d in offsets(ks):
        src = np.stack([s[a] * co[:, a + 1] - p[a] + dl[a] * d[a] for a in range(3)], 1) - lo
        ok = np.all((src >= 0) & (src < shape), axis=1)
        vals = np.full((len(co), c), fill)
        vals[ok] = grid[co[ok, 0], *src[ok].T]
        acc = np.maximum(acc, vals) if reduce == "max" else acc + vals
        count[ok] += ones[co[ok, 0], *src[ok].T]
    if reduce == "avg":
        div = np.prod(ks) if count_empty else np.maximum(count, 1)
        acc = acc / (div if np.isscalar(div) else div[:, None])
    return acc


def max_pool_grad(in_coords, feats, out_coords, kernel_size, stride, padding, dilation, cotangent):
    """Input gradient of max pooling: per output and channel the cotangent goes
    to the active input at the first kernel offset (weight order) holding the max."""
    ks, s, p, dl = map(_t3, (kernel_size, stride, padding, dilation))
    idx = _index(in_coords)
    x = np.asarray(feats, dtype=np.float64)
    g = np.asarray(cotangent, dtype=np.float64)
    dx = np.zeros_like(x)
    for o, q in enumerate(np.asarray(out_coords, dtype=np.int64).tolist()):
        rows = []
        for d in offsets(ks):
            src = (q[0],) + tuple(s[a] * q[a + 1] - p[a] + dl[a] * d[a] for a in range(3))
            if src in idx:
                rows.append(idx[src])
        for ch in range(x.shape[1]):
            best = rows[0]
            for r in rows[1:]:
                if x[r, ch] > x[best, ch]:
                    best = r
            dx[best, ch] += g[o, ch]
    return dx


# ------------------------------------------------------------------ points and voxels
def voxel_of(point, voxel_size):
    return tuple(int(np.floor(float(point[a]) / float(_t3(voxel_size)[a]))) for a in range(3))


def voxelize_points(points, feats, voxel_size, batch=None, reduce="mean"):
    """Brute force: dict of voxel -> point list; rows sorted; returns
    (coords (M, 4), feats (M, C), point_to_voxel (N,), winners (M, C) or None).
    winners: for 'max', the first point index holding each maximum."""
    pts = np.asarray(points, dtype=np.float64)
    f = np.asarray(feats, dtype=np.float64)
    b = np.zeros(len(pts), np.int64) if batch is None else np.asarray(batch, np.int64)
    groups = {}
    for i in range(len(pts)):
        groups.setdefault((int(b[i]),) + voxel_of(pts[i], voxel_size), []).append(i)
    keys = sorted(groups)
    row = {k: j for j, k in enumerate(keys)}
    out = np.zeros((len(keys), f.shape[1]))
    winners = np.zeros((len(keys), f.shape[1]), np.int64) if reduce == "max" else None
    for j, k in enumerate(keys):
        members = groups[k]
        if reduce == "sum":
            out[j] = f[members].sum(0)
        elif reduce == "mean":
            out[j] = f[members].mean(0)
        else:
            for ch in range(f.shape[1]):
                best = members[0]
                for i in members[1:]:
                    if f[i, ch] > f[best, ch]:
                        best = i
                winners[j, ch] = best
                out[j, ch] = f[best, ch]
    p2v = np.array([row[(int(b[i]),) + voxel_of(pts[i], voxel_size)] for i in range(len(pts))], np.int64)
    return np.array(keys, np.int64).reshape(-1, 4), out, p2v, winners


def devoxelize_weights(coords, stride, points, voxel_size, batch=None, mode="nearest"):
    """(N, M) interpolation matrix: value at points = W @ voxel features."""
    idx = _index(coords)
    pts = np.asarray(points, dtype=np.float64)
    b = np.zeros(len(pts), np.int64) if batch is None else np.asarray(batch, np.int64)
    cell = [float(_t3(voxel_size)[a]) * _t3(stride)[a] for a in range(3)]
    w = np.zeros((len(pts), len(idx)))
    for i, pt in enumerate(pts):
        if mode == "nearest":
            key = (int(b[i]),) + tuple(int(np.floor(pt[a] / cell[a])) for a in range(3))
            if key in idx:
                w[i, idx[key]] = 1.0
            continue
        u = [pt[a] / cell[a] - 0.5 for a in range(3)]
        lo = [int(np.floor(v)) for v in u]
        for corner in itertools.product((0, 1), repeat=3):
            key = (int(b[i]),) + tuple(lo[a] + corner[a] for a in range(3))
            weight = 1.0
            for a in range(3):
                t = u[a] - lo[a]
                weight *= t if corner[a] else 1.0 - t
            if key in idx:
                w[i, idx[key]] += weight
        total = w[i].sum()
        if total > 0:
            w[i] /= total
    return w


# ------------------------------------------------------------------ conversions
def dense_grid(coords, feats, shape, origin=(0, 0, 0)):
    """(B, X, Y, Z, C) float64 grid with each voxel's features at coords - origin."""
    c = np.asarray(coords, dtype=np.int64)
    f = np.asarray(feats, dtype=np.float64)
    grid = np.zeros((*shape, f.shape[1]))
    for r in range(len(c)):
        grid[(int(c[r, 0]),) + tuple(int(c[r, a + 1] - origin[a]) for a in range(3))] = f[r]
    return grid


def sparse_sum(coords_a, feats_a, coords_b, feats_b, mode="union"):
    """Dict of voxel -> a + b (missing = 0) over the union or intersection."""
    a = {tuple(map(int, k)): np.asarray(v, np.float64) for k, v in zip(np.asarray(coords_a), np.asarray(feats_a))}
    b = {tuple(map(int, k)): np.asarray(v, np.float64) for k, v in zip(np.asarray(coords_b), np.asarray(feats_b))}
    keys = set(a) | set(b) if mode == "union" else set(a) & set(b)
    zero = np.zeros(np.asarray(feats_a).shape[1])
    return {k: a.get(k, zero) + b.get(k, zero) for k in keys}


# ------------------------------------------------------------------ grouped
def grouped(dense_fn, in_coords, feats, weight, out_coords, groups, **geometry):
    """A grouped convolution as `groups` separate dense ones: group j maps
    input channels [j*A/G, (j+1)*A/G) through weight rows [j*B/G, (j+1)*B/G)."""
    x = np.asarray(feats, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    ag, bg = x.shape[1] // groups, w.shape[0] // groups
    parts = [
        dense_fn(in_coords, x[:, j * ag:(j + 1) * ag], w[j * bg:(j + 1) * bg], out_coords, **geometry)
        for j in range(groups)
    ]
    return np.concatenate(parts, axis=1)


def expand_grouped(weight, groups):
    """The full (C_out, Kx, Ky, Kz, C_in) weight equal to a grouped one: zero
    outside each group's block."""
    w = np.asarray(weight, dtype=np.float64)
    c_out, kx, ky, kz, ag = w.shape
    bg = c_out // groups
    full = np.zeros((c_out, kx, ky, kz, ag * groups))
    for j in range(groups):
        full[j * bg:(j + 1) * bg, ..., j * ag:(j + 1) * ag] = w[j * bg:(j + 1) * bg]
    return full


def compress_grouped(full, groups):
    """The grouped blocks of a full (C_out, ..., C_in) array (inverse of expand_grouped)."""
    c_out, c_in = full.shape[0], full.shape[-1]
    bg, ag = c_out // groups, c_in // groups
    return np.concatenate(
        [full[j * bg:(j + 1) * bg, ..., j * ag:(j + 1) * ag] for j in range(groups)], axis=0
    )


def numeric_grad(f, args, i, h=1e-6):
    """Central differences of the scalar f(*args) with respect to args[i]."""
    g = np.zeros_like(args[i])
    for idx in np.ndindex(*args[i].shape):
        a = [np.array(v, copy=True) for v in args]
        a[i][idx] += h
        up = f(*a)
        a[i][idx] -= 2 * h
        g[idx] = (up - f(*a)) / (2 * h)
    return g
