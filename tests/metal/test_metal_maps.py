"""metal/map_build.metal against the CPU builder and brute-force edges.

The three programs of one map (src/metal/map_build.cpp, read through
_ext.metal_map_program: table, count, fill) run step by step through the
CPU harness, with the edge count read back between count and fill as the
host does. The relation must equal the CPU builder's arrays element for
element (out_offsets, in_idx, k_idx) and the brute-force edges of
tests/oracle.py in canonical (output row, offset) order, for every
relation kind, under every thread schedule.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_lattice import _ext

import metal_harness
import metal_programs
import oracle

pytestmark = metal_programs.MARKS
if metal_programs.BACKEND == "metal":
    pytestmark = pytestmark + [pytest.mark.skip(reason="map programs run through the CPU harness only")]

KERNELS = (
    "map_table_clear", "map_table_insert", "map_count", "map_scan", "map_fill",
    "map_neighbor_map", "map_out_idx", "map_edge_map", "map_column_count", "map_column_fill",
    "map_fill_minus_one", "map_input_edge_map", "map_input_count", "map_input_fill",
    "map_support_keys", "map_sort_pass", "map_sort_block", "map_support_flags", "map_support_fill",
    "map_plan_keys", "map_plan_rows", "map_plan_tiles",
)
NONE = np.iinfo(np.int32).max


def run_step(program: dict, inputs: list, out: np.ndarray, schedule: str, seed: int) -> np.ndarray:
    """Every step of `program` on int32 inputs; returns the output buffer."""
    assert all(d == "int32" for d, _ in program["temps"])
    temps = [garbage(n) for _, n in program["temps"]]
    return metal_programs.run_steps(program, inputs, out, temps, schedule, seed)


def garbage(n: int) -> np.ndarray:
    """A fresh buffer: Metal leaves new buffers uninitialised."""
    return np.full(max(n, 1), -7, np.int32)


def table_mask(program: dict) -> int:
    """MapParams.mask (table slots - 1) from the table program's params."""
    return int(np.frombuffer(program["steps"][0]["buffers"][-1][1], np.int32)[2])


def metal_relation(in_coords, out_coords, spec, transposed, schedule="forward", seed=0):
    """(out_offsets, in_idx, k_idx) of the Metal programs."""
    in_c = np.ascontiguousarray(in_coords, np.int32).reshape(-1, 4)
    out_c = np.ascontiguousarray(out_coords, np.int32).reshape(-1, 4)
    n_in, n_out = len(in_c), len(out_c)
    ins = [garbage(0) if n_in == 0 else in_c, None, garbage(0) if n_out == 0 else out_c]
    prog = lambda step, edges=0: _ext.metal_map_program(step, n_in, n_out, *spec, transposed, edges)
    mask = table_mask(prog("table"))
    table = run_step(prog("table"), [ins[0]], garbage(mask + 3), schedule, seed)
    assert table[mask + 1] == NONE and table[mask + 2] == NONE, "duplicate or out-of-range input"
    ins[1] = table
    offsets = run_step(prog("count"), ins, garbage(n_out + 1), schedule, seed)[: n_out + 1]
    e = int(offsets[n_out])  # the host's one read-back
    edges = run_step(prog("fill", e), ins + [offsets], garbage(2 * e), schedule, seed)
    return offsets, edges[:e], edges[e : 2 * e]


def metal_views(rel, n_in, n_out, spec):
    """(neighbour map, kernel-major (offsets, perm, in, out), input-major
    (offsets, perm, out, k), out_idx) of the Metal view programs over the
    relation arrays `rel`."""
    off, i, k = rel
    e, kv = len(i), int(np.prod(spec[0]))
    prog = lambda step: _ext.metal_map_program(step, n_in, n_out, *spec, False, e)
    ins = [off, garbage(0) if e == 0 else i, garbage(0) if e == 0 else k]
    nmap = run_step(prog("neighbor_map"), ins, garbage(n_out * kv), "random", 1)[: n_out * kv]
    view = run_step(prog("kernel_major"), ins, garbage(kv + 1 + 3 * e), "random", 2)
    km = (view[: kv + 1],) + tuple(view[kv + 1 + j * e : kv + 1 + (j + 1) * e] for j in range(3))
    view = run_step(prog("input_major"), ins, garbage(n_in + 1 + 3 * e), "reverse", 3)
    im = (view[: n_in + 1],) + tuple(view[n_in + 1 + j * e : n_in + 1 + (j + 1) * e] for j in range(3))
    out_idx = run_step(prog("out_idx"), ins[:1], garbage(e), "reverse", 4)[:e]
    return nmap.reshape(n_out, kv), km, im, out_idx


def table_flags(in_coords, schedule="forward"):
    """The table's two flag words (duplicate row, out-of-range row)."""
    in_c = np.ascontiguousarray(in_coords, np.int32).reshape(-1, 4)
    prog = _ext.metal_map_program("table", len(in_c), 0, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), False)
    mask = table_mask(prog)
    table = run_step(prog, [in_c], garbage(mask + 3), schedule, 0)
    return int(table[mask + 1]), int(table[mask + 2])


def cpu_relation(in_coords, out_coords, spec, transposed, kind):
    t = _ext.CoordTable(mx.array(np.ascontiguousarray(in_coords, np.int32).reshape(-1, 4)))
    out = t.coords if kind == "submanifold" else mx.array(np.ascontiguousarray(out_coords, np.int32).reshape(-1, 4))
    rel = _ext.build_relation(t, out, *spec, transposed, kind)
    return (np.array(rel.out_offsets), np.array(rel.in_idx), np.array(rel.k_idx)), rel


def oracle_csr(in_coords, out_coords, spec, transposed):
    """Brute-force edges, in (output row, offset) order, as CSR arrays."""
    size, stride, pad, dil = spec
    if transposed:
        e = oracle.transposed_edges(in_coords, out_coords, size, stride, pad, dil)
    else:
        e = oracle.conv_edges(in_coords, out_coords, size, stride, pad, dil)
    e = e[np.lexsort((e[:, 2], e[:, 0]))]
    off = np.concatenate([[0], np.cumsum(np.bincount(e[:, 0], minlength=len(out_coords)))])
    return off, e[:, 1], e[:, 2]


def check(in_coords, out_coords, spec, transposed, kind, schedule="forward", seed=0):
    got = metal_relation(in_coords, out_coords, spec, transposed, schedule, seed)
    want, rel = cpu_relation(in_coords, out_coords, spec, transposed, kind)
    ref = oracle_csr(in_coords, out_coords, spec, transposed)
    for name, g, w, r in zip(("out_offsets", "in_idx", "k_idx"), got, want, ref):
        np.testing.assert_array_equal(g, w, err_msg=f"{kind} {name}: Metal vs CPU builder")
        np.testing.assert_array_equal(g, r, err_msg=f"{kind} {name}: Metal vs brute force")
    check_views(got, len(in_coords), len(out_coords), spec, rel)
    return got


def check_views(got, n_in, n_out, spec, rel):
    """The Metal views of `got` against the CPU relation's and brute force."""
    off, i, k = got
    kv = int(np.prod(spec[0]))
    nmap, km, im, out_idx = metal_views(got, n_in, n_out, spec)
    out = np.repeat(np.arange(n_out), np.diff(off))
    np.testing.assert_array_equal(out_idx, np.array(rel.out_idx), err_msg="out_idx: Metal vs CPU")
    np.testing.assert_array_equal(out_idx, out, err_msg="out_idx: Metal vs brute force")
    ref_nmap = np.full((n_out, kv), -1, np.int32)
    ref_nmap[out, k] = i
    np.testing.assert_array_equal(nmap, np.array(rel.neighbor_map).reshape(n_out, kv))
    np.testing.assert_array_equal(nmap, ref_nmap)
    order = np.lexsort((out, k))  # by offset, then output row: a stable sort by offset
    ref_km = (np.concatenate([[0], np.cumsum(np.bincount(k, minlength=kv))]), order, i[order], out[order])
    for name, g, w, r in zip(("offsets", "perm", "in_idx", "out_idx"), km, rel.kernel_major(), ref_km):
        np.testing.assert_array_equal(g, np.array(w), err_msg=f"kernel-major {name}: Metal vs CPU")
        np.testing.assert_array_equal(g, r, err_msg=f"kernel-major {name}: Metal vs brute force")
    order = np.lexsort((out, k, i))  # by (in, k, out)
    ref_im = (np.concatenate([[0], np.cumsum(np.bincount(i, minlength=n_in))]), order, out[order], k[order])
    for name, g, w, r in zip(("offsets", "perm", "out_idx", "k_idx"), im, rel.input_major(), ref_im):
        np.testing.assert_array_equal(g, np.array(w), err_msg=f"input-major {name}: Metal vs CPU")
        np.testing.assert_array_equal(g, r, err_msg=f"input-major {name}: Metal vs brute force")


def t3(v):
    return (v,) * 3 if isinstance(v, int) else tuple(v)


def fine_coarse(rng, n, stride, batches):
    fine = oracle.random_coords(rng, n, 9, batches)
    t = _ext.CoordTable(mx.array(fine))
    coarse = np.array(_ext.forward_support(t, t3(stride), t3(stride), (0, 0, 0), (1, 1, 1)))
    return fine, coarse


SCHEDULES = ("forward", "reverse", "random")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ks,dil", [(3, 1), (3, 2), (5, 1), (1, 1), ((3, 1, 3), (1, 1, 2))])
def test_submanifold(schedule, ks, dil):
    rng = np.random.default_rng(1)
    coords = oracle.random_coords(rng, 300, 7, batches=2)
    ks, dil = t3(ks), t3(dil)
    spec = (ks, (1, 1, 1), oracle.subm_padding(ks, dil), dil)
    got = check(coords, coords, spec, False, "submanifold", schedule, seed=3)
    # every row reaches itself; kernels wider than 1 reach neighbours too
    assert got[1].size == len(coords) if ks == (1, 1, 1) else got[1].size > len(coords)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ks,stride,pad,dil", [(3, 2, 1, 1), (2, 2, 0, 1), (3, (2, 1, 3), (0, 1, 2), (1, 2, 1))])
def test_forward(schedule, ks, stride, pad, dil):
    rng = np.random.default_rng(2)
    coords = oracle.random_coords(rng, 250, 8, batches=3)
    spec = (t3(ks), t3(stride), t3(pad), t3(dil))
    t = _ext.CoordTable(mx.array(coords))
    out = np.array(_ext.forward_support(t, *spec))
    check(coords, out, spec, False, "forward", schedule, seed=5)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_target(schedule):
    rng = np.random.default_rng(3)
    coords = oracle.random_coords(rng, 200, 7, batches=2)
    targets = oracle.random_coords(rng, 120, 9, batches=3)  # batch 2 has no inputs
    far = np.array([[0, 65535, -65536, 7], [1, 1000, 1000, 1000]], np.int32)
    targets = np.concatenate([targets, far])
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    check(coords, targets, spec, False, "target", schedule, seed=7)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("stride", [2, (2, 1, 3)])
def test_transposed(schedule, stride):
    rng = np.random.default_rng(4)
    fine, coarse = fine_coarse(rng, 250, stride, batches=2)
    spec = ((3, 3, 3), t3(stride), (1, 1, 1), (1, 1, 1))
    check(coarse, fine, spec, True, "transposed", schedule, seed=9)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_generative(schedule):
    rng = np.random.default_rng(5)
    coords = oracle.random_coords(rng, 60, 5, batches=2)
    spec = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    t = _ext.CoordTable(mx.array(coords))
    out = np.array(_ext.generative_support(t, *spec))
    got = check(coords, out, spec, True, "generative", schedule, seed=11)
    assert got[1].size == 8 * len(coords)


def test_empty():
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    none = np.zeros((0, 4), np.int32)
    some = oracle.random_coords(np.random.default_rng(6), 20, 4)
    for a, b in ((none, none), (none, some), (some, none)):
        off, i, k = check(a, b, spec, False, "target")
        assert i.size == 0 and k.size == 0 and off.shape == (len(b) + 1,)


def test_many_rows_scan():
    """More output rows than scan threads: chunks of several rows each."""
    rng = np.random.default_rng(7)
    coords = oracle.random_coords(rng, 3200, 20, batches=1)
    assert len(coords) > 2048
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    check(coords, coords, spec, False, "submanifold", "random", seed=13)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_table_flags(schedule):
    coords = np.array([[0, 1, 2, 3], [1, 1, 2, 3], [0, 4, 4, 4], [0, 1, 2, 3], [0, 4, 4, 4]], np.int32)
    assert table_flags(coords, schedule) == (3, NONE)
    bad = np.array([[0, 0, 0, 0], [4096, 0, 0, 0], [0, 0, 65536, 0], [-1, 0, 0, 0]], np.int32)
    assert table_flags(bad, schedule) == (NONE, 1)
    assert table_flags(bad[:1], schedule) == (NONE, NONE)


# ------------------------------------------------------------ output supports

def sort_params(program: dict) -> tuple:
    """(count, padded, k, j, base) of a step's MapSortParams (the "sort"
    bytes, after the 18 words of MapParams)."""
    raw = next(p for kind, p, name in program["steps"][0]["buffers"] if name == "sort")
    return tuple(int(v) for v in np.frombuffer(raw, np.int32)[18:])


def sort_elements(words):
    """(keys uint64, values) of sort elements: key high, key low, value."""
    w = words.reshape(-1, 3)
    keys = w[:, :2].view(np.uint32).astype(np.uint64)
    return keys[:, 0] << np.uint64(32) | keys[:, 1], w[:, 2]


def metal_support(in_coords, spec, generative, schedule="forward", seed=0):
    """(coords, error row) of the support programs, the row count and error
    word read back between them as the host does."""
    in_c = np.ascontiguousarray(in_coords, np.int32).reshape(-1, 4)
    n = len(in_c)
    step = "generative_support" if generative else "forward_support"
    prog = _ext.metal_map_program(step, n, 0, *spec, False)
    count, padded, _, _, _ = sort_params(prog)
    assert count == n * int(np.prod(spec[0])) and padded > count and padded & (padded - 1) == 0
    words = run_step(prog, [garbage(0) if n == 0 else in_c], garbage(count + 2 + 3 * padded), schedule, seed)
    rows, error = int(words[count]), int(words[count + 1])  # the host's one read-back
    keys, _ = sort_elements(words[count + 2 :])
    assert np.all(keys[:-1] <= keys[1:]), "candidate keys not sorted"
    if error != NONE:
        return None, error
    fill = _ext.metal_map_program("support_fill", n, 0, *spec, False, rows)
    out = run_step(fill, [words], garbage(4 * rows), schedule, seed)
    return out[: 4 * rows].reshape(rows, 4), error


def check_support(coords, spec, generative, schedule="forward", seed=0):
    got, error = metal_support(coords, spec, generative, schedule, seed)
    assert error == NONE
    t = _ext.CoordTable(mx.array(coords))
    cpu = _ext.generative_support if generative else _ext.forward_support
    np.testing.assert_array_equal(got, np.array(cpu(t, *spec)).reshape(-1, 4), err_msg="Metal vs CPU builder")
    ref = (oracle.generative_support if generative else oracle.forward_support)(coords, *spec)
    np.testing.assert_array_equal(got, ref, err_msg="Metal vs brute force")
    return got


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(
    "ks,stride,pad,dil",
    [(3, 2, 1, 1), (2, 2, 0, 1), (3, (2, 1, 3), (0, 1, 2), (1, 2, 1)), (1, 1, 0, 1), ((1, 3, 2), 3, 0, 1)],
)
def test_forward_support(schedule, ks, stride, pad, dil):
    rng = np.random.default_rng(21)
    coords = oracle.random_coords(rng, 120, 8, batches=3)
    spec = (t3(ks), t3(stride), t3(pad), t3(dil))
    got = check_support(coords, spec, False, schedule, seed=23)
    assert len(got) > 0


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ks,stride,pad,dil", [(2, 2, 0, 1), (3, 1, 1, 1), ((2, 1, 3), (2, 1, 1), (0, 0, 1), (1, 1, 2))])
def test_generative_support(schedule, ks, stride, pad, dil):
    rng = np.random.default_rng(22)
    coords = oracle.random_coords(rng, 70, 5, batches=2, low=-3)
    spec = (t3(ks), t3(stride), t3(pad), t3(dil))
    check_support(coords, spec, True, schedule, seed=29)


def test_support_many_candidates():
    """Past one sort block: passes over the whole buffer between the
    per-block passes, and a scan with several rows per thread."""
    rng = np.random.default_rng(24)
    coords = oracle.random_coords(rng, 400, 12, batches=2)
    spec = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    prog = _ext.metal_map_program("forward_support", len(coords), 0, *spec, False)
    assert sort_params(prog)[1] >= 8 * 1024
    assert "map_sort_pass" in [s["kernel"] for s in prog["steps"]]
    check_support(coords, spec, False, "random", seed=31)
    check_support(coords, ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)), True, "reverse", seed=37)


def test_support_empty():
    spec = ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    none = np.zeros((0, 4), np.int32)
    for generative in (False, True):
        got = check_support(none, spec, generative)
        assert got.shape == (0, 4)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_support_out_of_range(schedule):
    """The error word is the smallest input row reaching outside the range,
    as the CPU builder reports."""
    coords = np.array([[0, 0, 0, 0], [1, 40000, 0, 0], [0, 1, 1, 1], [0, 0, -40000, 5]], np.int32)
    spec = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    assert metal_support(coords, spec, True, schedule, seed=41) == (None, 1)
    with pytest.raises(ValueError, match=r"\(1, 40000, 0, 0\) leaves the supported range"):
        _ext.generative_support(_ext.CoordTable(mx.array(coords)), *spec)
    edge = np.array([[0, 0, 0, 0], [0, -65536, 0, 0]], np.int32)  # forward (c + p - d) / s: -65537 / 1
    fspec = ((3, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
    assert metal_support(edge, fspec, False, schedule, seed=43) == (None, 1)
    assert metal_support(edge[:1], fspec, False, schedule)[1] == NONE


# ------------------------------------------------------------ sorted plan

def metal_plan(nmap, kv, schedule="forward", seed=0):
    """(reorder_rows, out_in_map, kv_out_in_map, tile_masks) of the plan
    program over a neighbour map (n_out, K)."""
    n = len(nmap)
    spec = ((kv, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))
    prog = _ext.metal_map_program("sorted_plan", 0, n, *spec, False)
    tiles = -(-n // 64)
    src = garbage(0) if n == 0 else np.ascontiguousarray(nmap, np.int32).reshape(-1)
    plan = run_step(prog, [src], garbage(n + 2 * n * kv + 2 * tiles), schedule, seed)
    masks, rows = plan[: 2 * tiles], plan[2 * tiles :]  # tile masks first (8-byte aligned)
    return (
        rows[:n], rows[n : n + n * kv].reshape(n, kv), rows[n + n * kv : n + 2 * n * kv].reshape(kv, n),
        masks.view(np.uint64),
    )


def check_plan(rel, kv, schedule, seed):
    n = rel.n_out
    nmap = np.array(rel.neighbor_map).reshape(n, kv)
    got = metal_plan(nmap, kv, schedule, seed)
    # brute force: a stable sort by bitmask, then the tile ORs
    masks = np.zeros(n, np.uint64)
    for k in range(kv):
        masks |= (nmap[:, k] >= 0).astype(np.uint64) << np.uint64(k)
    order = np.argsort(masks, kind="stable")
    tiles = np.array([np.bitwise_or.reduce(masks[order[t : t + 64]]) for t in range(0, n, 64)], np.uint64)
    ref = (order, nmap[order], nmap[order].T, tiles)
    for name, g, w, r in zip(("reorder_rows", "out_in_map", "kv_out_in_map", "tile_masks"), got, rel.sorted_plan(), ref):
        np.testing.assert_array_equal(g, np.array(w).reshape(g.shape), err_msg=f"plan {name}: Metal vs CPU")
        np.testing.assert_array_equal(g, r.reshape(g.shape), err_msg=f"plan {name}: Metal vs brute force")
    return got


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("ks,stride,kind", [(3, 1, "submanifold"), (2, 2, "forward"), (4, 1, "submanifold"), ((1, 3, 1), 1, "submanifold")])
def test_sorted_plan(schedule, ks, stride, kind):
    rng = np.random.default_rng(51)
    coords = oracle.random_coords(rng, 300, 7, batches=2)
    ks, st = t3(ks), t3(stride)
    pad = oracle.subm_padding(ks, (1, 1, 1)) if kind == "submanifold" else (0, 0, 0)
    spec = (ks, st, pad, (1, 1, 1))
    t = _ext.CoordTable(mx.array(coords))
    out = t.coords if kind == "submanifold" else _ext.forward_support(t, *spec)
    rel = _ext.build_relation(t, out, *spec, False, kind)
    check_plan(rel, int(np.prod(ks)), schedule, seed=53)


def test_sorted_plan_many_rows():
    """Past one sort block (passes over the whole buffer), masks of all 64
    bits (a full 4x4x4 neighbourhood sorts with the padding's key)."""
    coords = np.array([[0, x, y, z] for x in range(12) for y in range(12) for z in range(12)], np.int32)
    spec = ((4, 4, 4), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    t = _ext.CoordTable(mx.array(coords))
    rel = _ext.build_relation(t, t.coords, *spec, False, "submanifold")
    got = check_plan(rel, 64, "random", seed=57)
    assert len(coords) > 1024 and np.any(got[3] == np.iinfo(np.uint64).max)


def test_sorted_plan_empty():
    got = metal_plan(np.zeros((0, 27), np.int32), 27)
    assert all(a.size == 0 for a in got)


def test_program_arguments():
    spec = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError, match="map step must be"):
        _ext.metal_map_program("sort", 4, 4, *spec, False)
    with pytest.raises(ValueError, match="kernel size must lie in"):
        _ext.metal_map_program("count", 4, 4, (0, 3, 3), *spec[1:], False)
    with pytest.raises(ValueError, match="row counts"):
        _ext.metal_map_program("count", -1, 4, *spec, False)
    with pytest.raises(ValueError, match="rows \\* kernel volume must be below 2\\^31"):
        _ext.metal_map_program("count", 2**30, 4, *spec, False)
    with pytest.raises(ValueError, match=r"output support .*at most 2\^30 - 1 elements to sort"):
        _ext.metal_map_program("forward_support", 2**23, 0, (6, 6, 6), *spec[1:], False)
    with pytest.raises(ValueError, match="sorted plan needs a kernel volume of at most 64"):
        _ext.metal_map_program("sorted_plan", 4, 4, (5, 5, 5), *spec[1:], False)
    with pytest.raises(ValueError, match="edge count"):
        _ext.metal_map_program("fill", 4, 4, *spec, False, 2**31)


def test_kernels_defined():
    defined = metal_harness.defined_kernels()
    for k in KERNELS:
        assert str(defined[k]).endswith("map_build.metal")
