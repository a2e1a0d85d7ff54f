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
    "map_neighbor_map", "map_edge_map", "map_column_count", "map_column_fill",
    "map_fill_minus_one", "map_input_edge_map", "map_input_count", "map_input_fill",
)
NONE = np.iinfo(np.int32).max


def run_step(program: dict, inputs: list, out: np.ndarray, schedule: str, seed: int) -> np.ndarray:
    """Every step of `program` on int32 inputs; returns the output buffer."""
    assert all(d == "int32" for d, _ in program["temps"])
    temps = [garbage(n) for _, n in program["temps"]]
    for step in program["steps"]:
        buffers, names, params, pidx = [], [], None, None
        for i, (kind, payload, name) in enumerate(step["buffers"]):
            names.append(name)
            if kind == "input":
                buffers.append(inputs[payload])
            elif kind == "output":
                buffers.append(out)
            elif kind == "temp":
                buffers.append(temps[payload])
            else:
                assert kind == "bytes", kind
                params, pidx = bytes(payload), i
                buffers.append(None)
        kernel = step["kernel"]
        result = metal_harness.run_kernel(
            metal_harness.defined_kernels()[kernel], kernel, buffers, params,
            groups=step["groups"], threads=step["threads"], params_index=pidx,
            names=names, schedule=schedule, seed=seed,
        )
        for i, (kind, payload, _) in enumerate(step["buffers"]):
            if kind == "output":
                out = result[i]
            elif kind == "temp":
                temps[payload] = result[i]
    return out


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
    (offsets, perm, out, k)) of the Metal view programs over the relation
    arrays `rel`."""
    off, i, k = rel
    e, kv = len(i), int(np.prod(spec[0]))
    prog = lambda step: _ext.metal_map_program(step, n_in, n_out, *spec, False, e)
    ins = [off, garbage(0) if e == 0 else i, garbage(0) if e == 0 else k]
    nmap = run_step(prog("neighbor_map"), ins, garbage(n_out * kv), "random", 1)[: n_out * kv]
    view = run_step(prog("kernel_major"), ins, garbage(kv + 1 + 3 * e), "random", 2)
    km = (view[: kv + 1],) + tuple(view[kv + 1 + j * e : kv + 1 + (j + 1) * e] for j in range(3))
    view = run_step(prog("input_major"), ins, garbage(n_in + 1 + 3 * e), "reverse", 3)
    im = (view[: n_in + 1],) + tuple(view[n_in + 1 + j * e : n_in + 1 + (j + 1) * e] for j in range(3))
    return nmap.reshape(n_out, kv), km, im


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
    nmap, km, im = metal_views(got, n_in, n_out, spec)
    out = np.repeat(np.arange(n_out), np.diff(off))
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
    with pytest.raises(ValueError, match="edge count"):
        _ext.metal_map_program("fill", 4, 4, *spec, False, 2**31)


def test_kernels_defined():
    defined = metal_harness.defined_kernels()
    for k in KERNELS:
        assert str(defined[k]).endswith("map_build.metal")
