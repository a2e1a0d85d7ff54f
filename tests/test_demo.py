"""The demo command end to end at a tiny size, and the PNG writer."""

import argparse
import zlib

import numpy as np
import pytest

from mlx_lattice import demo, scenes
from mlx_lattice._png import decode_png, encode_png


def test_png_round_trip(rng):
    img = rng.integers(0, 256, (7, 13, 3)).astype(np.uint8)
    data = encode_png(img)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(decode_png(data), img)
    # the image data is a plain zlib stream of filter-0 rows
    start = data.index(b"IDAT") + 4
    n = int.from_bytes(data[start - 8:start - 4], "big")
    raw = zlib.decompress(data[start:start + n])
    assert len(raw) == 7 * (1 + 13 * 3)
    with pytest.raises(ValueError):
        encode_png(np.zeros((4, 4), np.uint8))


def args(tmp_path, **kw):
    base = dict(path=None, voxel_size=0.4, seed=0, dtype="float32", width=0.25, steps=1,
                train_steps=2, lr=2e-3, png=str(tmp_path / "demo.png"), route_log=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_demo_sweep(tmp_path, capsys):
    assert demo.run(args(tmp_path, route_log=str(tmp_path / "routes.json"))) == 0
    out = capsys.readouterr().out
    for text in ("time per stage", "routes taken", "map reuse", "training curve", "picture:"):
        assert text in out
    img = decode_png((tmp_path / "demo.png").read_bytes())
    assert img.ndim == 3 and img.shape[2] == 3 and (img != 18).any()
    assert (tmp_path / "routes.json").stat().st_size > 0


def test_demo_float16_trains_on_float32_master_weights(tmp_path, capsys):
    assert demo.run(args(tmp_path, dtype="float16", train_steps=3)) == 0
    out = capsys.readouterr().out
    curve = out.split("training curve (step: loss): ")[1].splitlines()[0]
    losses = [float(item.split(": ")[1]) for item in curve.split(", ")]
    assert len(losses) >= 2 and np.isfinite(losses).all()


def test_demo_point_file(tmp_path, capsys):
    v, f = scenes.procedural_closed_mesh(subdiv=3)
    mesh = tmp_path / "blob.ply"
    scenes.save_ply(str(mesh), v, f)
    assert demo.run(args(tmp_path, path=str(mesh), voxel_size=None, train_steps=1)) == 0
    out = capsys.readouterr().out
    assert "blob.ply" in out and "low" in out
    assert decode_png((tmp_path / "demo.png").read_bytes()).shape[2] == 3
