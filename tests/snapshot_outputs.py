"""Records every map array and op output of a fixed set of calls on the
backend the default device selects, and compares two records bit for bit.

A restructuring that should change no number is checked by recording before
and after it on the same machine:

    python tests/snapshot_outputs.py record before.npz
    python tests/snapshot_outputs.py record after.npz
    python tests/snapshot_outputs.py compare before.npz after.npz

A path ending in ``.json`` holds SHA-256 digests of the arrays instead.

Each forward route of the backend that accepts a call is forced in turn
(``tuning.force``), so every route's forward, input and weight gradients and
forward-mode derivative are recorded, not only the one the predicates pick.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import neighbors, nn, ops, routes, tuning
from mlx_lattice.models import MinkUNet

DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def _np(a: mx.array) -> np.ndarray:
    """Raw bits: bf16 has no NumPy type, so every float is kept as its bits."""
    a = mx.contiguous(a)
    if a.dtype in (mx.float16, mx.bfloat16):
        return np.array(a.view(mx.uint16))
    return np.array(a)


def _scene(seed: int, n: int, extent: int, batches: int = 2):
    rng = np.random.default_rng(seed)
    pts = np.unique(
        np.concatenate([rng.integers(0, batches, (n, 1)), rng.integers(-extent, extent, (n, 3))], 1), axis=0
    ).astype(np.int32)
    return mx.array(pts)


def _maps(out: dict) -> None:
    coords = _scene(0, 1500, 12)
    x = ml.SparseTensor(coords, mx.zeros((coords.shape[0], 1)))
    m, s = x.manager, x.coordinate_set
    G = ml.KernelGeometry
    rels = {
        "fwd3s2": m.kernel_relation(s, G((3, 3, 3), (2, 2, 2), (1, 1, 1)))[0],
        "fwd2s2": m.kernel_relation(s, G((2, 2, 2), (2, 2, 2)))[0],
        "subm3": m.submanifold_kernel_relation(s, G((3, 3, 3), (1, 1, 1), (1, 1, 1))),
        "subm3d2": m.submanifold_kernel_relation(s, G((3, 3, 3), (1, 1, 1), (2, 2, 2), (2, 2, 2))),
        "gen2": m.generative_relation(s, G((2, 2, 2), (2, 2, 2)))[0],
    }
    coarse = m.kernel_relation(s, G((2, 2, 2), (2, 2, 2)))[1]
    rels["transposed"] = m.transposed_kernel_relation(coarse, G((2, 2, 2), (2, 2, 2)))[0]
    rels["transposed_new"] = m.transposed_kernel_relation(coarse, G((3, 3, 3), (2, 2, 2)))[0]
    rels["target"] = m.target_kernel_relation(s, coarse, G((3, 3, 3), (2, 2, 2), (1, 1, 1)))
    for name, r in rels.items():
        out[f"map/{name}/out_offsets"] = _np(r.out_offsets)
        out[f"map/{name}/in_idx"] = _np(r.in_idx)
        out[f"map/{name}/k_idx"] = _np(r.k_idx)
        out[f"map/{name}/out_idx"] = _np(r.out_idx)
        out[f"map/{name}/neighbor_map"] = _np(r.neighbor_map)
        for i, a in enumerate(r.input_major().__dict__.values()):
            out[f"map/{name}/input_major{i}"] = _np(a)
        for i, a in enumerate(r.kernel_major().__dict__.values()):
            out[f"map/{name}/kernel_major{i}"] = _np(a)
        if r.kernel_volume <= 64:
            plan = r.sorted_plan()
            for f in ("reorder_rows", "sorted_out_in_map", "sorted_kv_out_in_map", "tile_masks"):
                out[f"map/{name}/plan_{f}"] = _np(getattr(plan, f))
        out[f"map/{name}/stats"] = np.array([r.stats()[k] for k in ("edges", "n_in", "n_out", "max_neighbors")])


def _backend() -> str:
    try:
        from mlx_lattice import backends

        return backends.current().name
    except ImportError:  # a tree from before the backends package
        return routes.current_backend()


def _forward_routes(backend: str) -> list[str]:
    return [r["name"] for r in routes.list_routes() if r["backend"] == backend and "forward" in r["passes"]]


def _conv_calls(out: dict) -> None:
    backend = _backend()
    coords = _scene(1, 900, 9)
    rng = np.random.default_rng(2)
    cases = [
        ("subm", 3, 1, 13, 24, lambda x, w: ops.subm_conv3d(x, w)),
        ("subm_c64", 3, 1, 64, 64, lambda x, w: ops.subm_conv3d(x, w)),
        ("down", 2, 2, 16, 32, lambda x, w: ops.conv3d(x, w, stride=2)),
        ("down3", 3, 2, 8, 5, lambda x, w: ops.conv3d(x, w, stride=2, padding=1)),
        ("point", 1, 1, 32, 48, lambda x, w: ops.conv3d(x, w)),
        ("gen", 2, 2, 8, 8, lambda x, w: ops.generative_conv_transpose3d(x, w, stride=2)),
    ]
    for dtype in DTYPES:
        dn = str(dtype).split(".")[-1]
        for name, k, s, cin, cout, fn in cases:
            feats = mx.array(rng.standard_normal((coords.shape[0], cin)).astype(np.float32)).astype(dtype)
            w = mx.array((rng.standard_normal((cout, k, k, k, cin)) / np.sqrt(k**3 * cin)).astype(np.float32)).astype(dtype)
            for route in [None] + _forward_routes(backend):
                x = ml.SparseTensor(coords, feats)
                key = f"conv/{dn}/{name}/{route or 'default'}"
                try:
                    ctx = tuning.force(forward=route) if route else _null()
                    with ctx:
                        y = fn(x, w)
                        r = mx.array(rng.standard_normal(y.feats.shape).astype(np.float32)).astype(dtype)

                        def loss(f, w):
                            return (fn(ml.SparseTensor(coords, f, manager=x.manager), w).feats * r).sum()

                        gx, gw = mx.grad(loss, argnums=(0, 1))(feats, w)
                        _, jv = mx.jvp(lambda f, w: fn(ml.SparseTensor(coords, f, manager=x.manager), w).feats,
                                       (feats, w), (feats * 0.5, w * 0.25))
                        mx.eval(y.feats, gx, gw, jv[0])
                except (ValueError, RuntimeError) as e:
                    if route is None:
                        raise
                    out[key + "/refused"] = np.array([len(str(e))])
                    continue
                out[key + "/y"] = _np(y.feats)
                out[key + "/gx"] = _np(gx)
                out[key + "/gw"] = _np(gw)
                out[key + "/jvp"] = _np(jv[0])


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _network(out: dict) -> None:
    coords = _scene(3, 3000, 24)
    rng = np.random.default_rng(4)
    mx.random.seed(5)
    model = MinkUNet(4, 7, width=0.25)
    feats = mx.array(rng.standard_normal((coords.shape[0], 4)).astype(np.float32))
    labels = mx.array(rng.integers(0, 7, coords.shape[0]).astype(np.int32))

    def loss_fn(model, feats):
        logits = model(ml.SparseTensor(coords, feats)).feats
        return mx.mean(mx.logsumexp(logits, axis=1) - mx.take_along_axis(logits, labels[:, None], 1)[:, 0])

    loss, grads = nn.value_and_grad(model, loss_fn)(model, feats) if hasattr(nn, "value_and_grad") else \
        __import__("mlx.nn", fromlist=["value_and_grad"]).value_and_grad(model, loss_fn)(model, feats)
    mx.eval(loss, grads)
    out["net/loss"] = _np(loss)
    from mlx.utils import tree_flatten

    for k, v in tree_flatten(grads):
        out[f"net/grad/{k}"] = _np(v)


def _neighbors(out: dict) -> None:
    rng = np.random.default_rng(6)
    p = mx.array(rng.standard_normal((700, 3)).astype(np.float32))
    q = mx.array(rng.standard_normal((300, 3)).astype(np.float32))
    kn = neighbors.knn(q, p, 8)
    rd = neighbors.radius(q, p, 0.4, max_neighbors=16)
    for name, rel in (("knn", kn), ("radius", rd)):
        for f, a in rel._asdict().items():
            if isinstance(a, mx.array):
                out[f"nbr/{name}/{f}"] = _np(a)


def record(path: str) -> None:
    out: dict = {}
    with tuning.using(mode="off") if "mode" in tuning.Settings.__dataclass_fields__ else _null():
        _maps(out)
        _conv_calls(out)
        _network(out)
        _neighbors(out)
    if path.endswith(".json"):  # digests only: small enough to carry between machines
        digests = {k: [str(v.dtype), list(v.shape), hashlib.sha256(v.tobytes()).hexdigest()] for k, v in out.items()}
        pathlib.Path(path).write_text(json.dumps(digests, indent=0, sort_keys=True))
    else:
        np.savez(path, **out)
    print(f"{len(out)} arrays on {_backend()} -> {path}")


def _load(path: str) -> dict:
    if path.endswith(".json"):
        return json.loads(pathlib.Path(path).read_text())
    data = np.load(path)
    return {k: [str(data[k].dtype), list(data[k].shape), hashlib.sha256(data[k].tobytes()).hexdigest()]
            for k in data.files}


def compare(a_path: str, b_path: str) -> int:
    a, b = _load(a_path), _load(b_path)
    ka, kb = set(a), set(b)
    bad = [k for k in sorted(ka & kb) if a[k] != b[k]]
    for k in sorted(ka ^ kb):
        print(f"only in {'first' if k in ka else 'second'}: {k}")
    for k in bad:
        print(f"differs: {k}")
    print(f"{len(ka & kb) - len(bad)} of {len(ka | kb)} arrays bitwise identical")
    return 1 if bad or ka ^ kb else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "record":
        record(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
