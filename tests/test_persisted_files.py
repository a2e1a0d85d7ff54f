"""Fault injection for every file the package persists: the route tuning
cache (mlx_lattice/tuning_cache.py), the CUDA kernel cache's cubins and
kernel lists (mlx_lattice/backends/cuda/jit.py, nvrtc_worker.py) and the
route log (MLX_LATTICE_ROUTE_LOG), and what reads them back (the tuner,
`tune --show`, `routes --mac --log`). Malformed values of every field,
other versions, unknown routes, concurrent writers with readers, read-only
directories: never a crash, never an ineligible route, a warning naming
the file and the entry, and `tune` / `cuda-prebuild` rewrite or drop what
they cannot use and say so."""

import copy
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import __main__ as cli
from mlx_lattice import diagnostics, mac_plan, ops, routes, tuning, tuning_cache
from mlx_lattice.backends.cuda import jit
from mlx_lattice.bench import tuner as tune_cmd
from mlx_lattice.tuning_cache import TuningCache

import oracle

ROOT = Path(__file__).resolve().parents[1]
CUBIN = (ROOT / "tests" / "persisted" / "add_one_sm90.cubin").read_bytes()
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(autouse=True)
def cache_file(tmp_path, monkeypatch, on_cpu):
    """A fresh tuner per test, its cache in tmp_path; everything put back.
    On the CPU backend, whatever the suite's device: the entries name its
    routes."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", str(path))
    state = tuning._state
    saved = (tuning.settings(), dict(state.forced), state.timer)
    tuning.reset()
    tuning_cache._warned.clear()
    jit._said.clear()
    yield path
    tuning.reset()
    state.settings, state.forced, state.timer = saved


def fast_gather(label, fn):
    return {"cpu.gather_gemm": 0.5e-3, "cpu.row_gather": 1e-3}.get(label.split("[")[0], 1.0)


def strided(rng, n=300, c=16):
    """A stride-2 conv whose forward and input-gradient products may take
    cpu.row_gather (the static order) or cpu.gather_gemm."""
    coords = oracle.random_coords(rng, n, 8, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), c)).astype(np.float32))
    w = mx.array((rng.standard_normal((c, 2, 2, 2, c)) * 0.1).astype(np.float32))
    return lambda: ops.conv3d(x, w, stride=2)


def forward_record(call, mode):
    with tuning.using(mode=mode, timer=fast_gather), diagnostics.record() as log:
        mx.eval(call().feats)
    [rec] = [r for r in log if r["op"] != "map"]
    return rec


def tuned_cache(rng, cache_file):
    """The call, and the cache holding its forward and input-gradient keys
    (both cpu.gather_gemm, measured faster)."""
    call = strided(rng)
    forward_record(call, "tune")
    data = json.loads(cache_file.read_text())
    [fkey] = [k for k, e in data["entries"].items() if e["shape"]["pass"] == "forward"]
    tuning.reset()
    return call, data, fkey


def said(record) -> list[str]:
    return [str(w.message) for w in record]


# ------------------------------------------------------------------ the tuning cache: malformed fields
BAD_FIELDS = [
    ("entry", None), ("entry", "cpu.gather_gemm"), ("entry", 3), ("entry", []),
    ("route", None), ("route", 3), ("route", ""), ("route", ["cpu.gather_gemm"]),
    ("variant", "bn=32"), ("variant", [1]), ("variant", {"bn": [32]}), ("variant", {"bn": 1.5}),
    ("variant", {"bn": None}), ("variant", {"bn": True}),
    ("static", 3), ("note", ["x"]), ("measured", 20240101),
    ("timings_ms", "fast"), ("timings_ms", [0.5, 1.0]), ("timings_ms", 0.5),
    ("timings_ms", {"cpu.gather_gemm": "0.5"}), ("timings_ms", {"cpu.gather_gemm": None}),
    ("timings_ms", {"cpu.gather_gemm": -1}), ("timings_ms", {"cpu.gather_gemm": float("nan")}),
    ("timings_ms", {"cpu.gather_gemm": float("inf")}), ("timings_ms", {"cpu.gather_gemm": True}),
    ("shape", ["forward"]), ("shape", "forward"), ("shape", 3), ("dropped", "none"),
]


@pytest.mark.parametrize("field, value", BAD_FIELDS, ids=lambda v: repr(v)[:24])
def test_a_malformed_entry_is_said_skipped_and_replaced(rng, cache_file, capsys, field, value):
    call, data, fkey = tuned_cache(rng, cache_file)
    if field == "entry":
        data["entries"][fkey] = value
    else:
        data["entries"][fkey][field] = value
    cache_file.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    # mode cached: the static order, a warning naming the file and the key,
    # and the record says why (not "no entry")
    with pytest.warns(RuntimeWarning) as w:
        rec = forward_record(call, "cached")
    assert rec["route"] == "cpu.row_gather" and rec["choice"] == "static"
    assert rec["tune_note"].startswith("the tuning cache's entry cannot be used")
    assert any(str(cache_file) in m and repr(fkey) in m for m in said(w))
    # the other entry still serves
    assert tuning_cache.TuningCache(cache_file).read().entries.keys() == set(data["entries"]) - {fkey}
    # tune --show: no crash, the entry listed as unusable; --json stays JSON
    assert cli.main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert f"{cache_file}: 1 entries" in out and "1 entries cannot be used" in out and fkey in out
    assert cli.main(["tune", "--show", "--json"]) == 0
    shown = capsys.readouterr()
    assert len(json.loads(shown.out)) == 1 and fkey in shown.err
    # mode tune measures the product again and replaces the entry
    tuning.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = forward_record(call, "tune")
    assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "tuner"
    got = TuningCache(cache_file).read()
    assert got.problems == {} and got.entries[fkey]["route"] == "cpu.gather_gemm"
    assert set(got.entries[fkey]["timings_ms"]) == {"cpu.gather_gemm", "cpu.row_gather"}


def test_entry_problem_accepts_what_the_tuner_writes(rng, cache_file, capsys):
    call, data, fkey = tuned_cache(rng, cache_file)
    assert all(tuning_cache.entry_problem(e) is None for e in data["entries"].values())
    entry = data["entries"][fkey]
    assert tuning_cache.entry_problem({"route": "cuda.sorted_mma", "variant": {"bn": 32, "ak": 64}}) is None
    # fields that may be null or absent, and fields of a later release: the
    # entry serves, and nothing is said
    data["entries"][fkey] = {**entry, "timings_ms": None, "shape": None, "note": None, "future_field": [1]}
    del data["entries"][fkey]["static"]
    cache_file.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec = forward_record(call, "cached")
        assert rec["route"] == "cpu.gather_gemm" and rec["choice"] == "cache" and rec["timings_ms"] is None
        assert "chosen from the route tuning cache" in diagnostics.RouteLog([rec]).why()
        assert cli.main(["tune", "--show"]) == 0
    assert f"{cache_file}: 2 entries" in capsys.readouterr().out


def test_show_never_crashes_on_what_is_there(cache_file, capsys):
    cache_file.mkdir()  # a directory where the file should be
    assert cli.main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    assert f"{cache_file}: 0 entries" in out and "unreadable" in out
    assert cli.main(["tune", "--show", "--json"]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out) == [] and "unreadable" in io.err


# ------------------------------------------------------------------ unknown and ineligible routes
@pytest.mark.parametrize("route, variant, why", [
    ("cpu.removed_route", {}, "'cpu.removed_route', which is no registered route"),
    ("cpu.pointwise", {}, "cpu.pointwise, not one of this product's eligible routes"),
    ("metal.csr_mma", {}, "metal.csr_mma, not one of this product's eligible routes"),
    ("cpu.gather_gemm", {"bn": 32}, "cpu.gather_gemm[bn=32], not one of this product's eligible routes"),
])
def test_an_entry_naming_an_ineligible_route_is_never_taken_and_is_replaced(rng, cache_file, route,
                                                                            variant, why):
    call, data, fkey = tuned_cache(rng, cache_file)
    data["entries"][fkey].update(route=route, variant=variant)
    cache_file.write_text(json.dumps(data))
    for _ in range(2):  # said once per process
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            rec = forward_record(call, "cached")
        assert rec["route"] == "cpu.row_gather" and rec["choice"] == "static"
        assert why in rec["tune_note"] and "no entry" not in rec["tune_note"]
    # the first of the two said it, naming the file and the key
    tuning.reset()
    tuning_cache._warned.clear()
    with pytest.warns(RuntimeWarning, match=re.escape(f"route tuning cache {cache_file}: entry {fkey!r}: it names")):
        forward_record(call, "cached")
    # mode tune: measured again, the entry replaced, and a later process
    # reads the new choice from the cache
    tuning.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert forward_record(call, "tune")["choice"] == "tuner"
    entry = TuningCache(cache_file).read().entries[fkey]
    assert entry["route"] == "cpu.gather_gemm" and entry["variant"] == {}
    tuning.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec = forward_record(call, "cached")
    assert rec["choice"] == "cache" and rec["route"] == "cpu.gather_gemm"


def test_a_valid_entry_written_meanwhile_is_not_replaced(rng, cache_file):
    # The file's entry for a key stays where it names a candidate: only an
    # unusable one is replaced.
    c = TuningCache(cache_file)
    cands = {"cpu.row_gather", "cpu.gather_gemm"}
    keep = lambda k, e: e["route"] in cands  # noqa: E731
    c.merge({"k": {"route": "cpu.row_gather"}})
    assert c.merge({"k": {"route": "cpu.gather_gemm"}}, keep=keep)["k"]["route"] == "cpu.row_gather"
    c.merge({"j": {"route": "cpu.pointwise"}})
    assert c.merge({"j": {"route": "cpu.gather_gemm"}}, keep=keep)["j"]["route"] == "cpu.gather_gemm"


def test_stale_entries_are_judged_by_their_key(rng, cache_file):
    call, data, fkey = tuned_cache(rng, cache_file)
    entry = data["entries"][fkey]
    assert tuning.stale_entry(fkey, entry) is None
    assert "no registered route" in tuning.stale_entry(fkey, {**entry, "route": "cpu.gone"})
    assert "not one of the key's eligible routes" in tuning.stale_entry(fkey, {**entry, "route": "cpu.pointwise"})
    gone = fkey.replace("cpu.gather_gemm,cpu.row_gather", "cpu.gone,cpu.row_gather")
    assert "not registered (cpu.gone)" in tuning.stale_entry(gone, {**entry, "route": "cpu.row_gather"})
    # variants' labels hold commas of their own
    key = fkey.replace("cpu.gather_gemm,cpu.row_gather", "cpu.gather_gemm,cpu.gather_gemm[a=1,b=2],cpu.row_gather")
    assert tuning.stale_entry(key, {**entry, "variant": {"a": 1, "b": 2}}) is None
    # another release's or format's keys are not judged: another install reads them
    other = fkey.replace(f"mlx_lattice {ml.__version__}", "mlx_lattice 0.0.1")
    assert tuning.stale_entry(other, {**entry, "route": "cpu.gone"}) is None
    assert tuning.stale_entry("v0 | anything", {"route": "x"}) is None


def test_another_releases_entries_are_kept_but_never_used(rng, cache_file, monkeypatch):
    call, data, fkey = tuned_cache(rng, cache_file)
    monkeypatch.setattr(ml, "__version__", "99.0")
    rec = forward_record(call, "cached")
    assert rec["route"] == "cpu.row_gather" and rec["tune_note"] == "no entry in the tuning cache"
    assert tuning.repair_cache()["dropped"] == {}
    assert set(TuningCache(cache_file).read().entries) == set(data["entries"])


# ------------------------------------------------------------------ versions and foreign files
def _cache_text(version, entries=None):
    return json.dumps({"format": tuning_cache.FORMAT, "version": version, "entries": entries or {}})


@pytest.mark.parametrize("text, state", [
    ("", "missing"), ("  \n", "missing"), ("{not json", "foreign"), ('{"entries": {}}', "foreign"),
    ("[1, 2]", "foreign"), ('{"format": "something else"}', "foreign"), ("\x00\x01binary", "foreign"),
    (_cache_text(0), "older"), (_cache_text("1"), "older"), (_cache_text(None), "older"),
    (_cache_text(2), "newer"), (_cache_text(1.5), "newer"),
    (json.dumps({"format": tuning_cache.FORMAT, "version": 1, "entries": []}), "older"),
    (_cache_text(1, {"k": {"route": "cpu.row_gather"}}), "ok"),
])
def test_files_of_another_kind_or_version(rng, cache_file, capsys, text, state):
    cache_file.write_text(text)
    got = TuningCache(cache_file).read()
    assert got.state == state
    call = strided(rng)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert forward_record(call, "cached")["route"] == "cpu.row_gather"
    if state in ("foreign", "older", "newer"):
        assert any(str(cache_file) in m and got.reason in m for m in said(w))
    # mode tune: a missing, empty, current or older cache is (re)written;
    # someone else's file or a newer release's cache is left as it is
    tuning.reset()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert forward_record(call, "tune")["route"] == "cpu.gather_gemm"
    after = TuningCache(cache_file).read()
    if state in ("missing", "ok", "older"):
        assert after.state == "ok" and len(after.entries) >= 2
    else:
        assert cache_file.read_text() == text
        assert any("cannot write the cache" in m and "not written over" in m for m in said(w))
    # tune --show says what the file is, and never crashes
    cache_file.write_text(text)
    assert cli.main(["tune", "--show"]) == 0
    out = capsys.readouterr().out
    if state not in ("missing", "ok"):
        assert got.reason in out
    # the tune command's repair replaces it, and says so
    fixed = tuning.repair_cache()
    assert (fixed["replaced"] is not None) == (state not in ("missing", "ok"))
    assert TuningCache(cache_file).read().state == "ok" or state == "missing"


def test_tune_command_drops_what_it_cannot_use_and_says_so(rng, cache_file, capsys, monkeypatch):
    call, data, fkey = tuned_cache(rng, cache_file)
    entries = data["entries"]
    stale = fkey.replace("cpu.gather_gemm,cpu.row_gather", "cpu.gone,cpu.row_gather")
    other_release = fkey.replace(f"mlx_lattice {ml.__version__}", "mlx_lattice 0.0.1")
    entries.update({"malformed": {"route": 3}, stale: {"route": "cpu.row_gather"},
                    other_release: {"route": "cpu.gone"}})
    entries[fkey]["route"] = "cpu.pointwise"
    cache_file.write_text(json.dumps(data))
    ran = []
    monkeypatch.setattr(tune_cmd, "_coords", lambda args: (np.zeros((4, 4), np.int32), "stub"))
    monkeypatch.setattr(tune_cmd, "tune_model", lambda *a, **kw: ran.append(kw) or ([], 0.0, 0.0))
    assert cli.main(["tune"]) == 0
    out = capsys.readouterr().out
    assert ran and f"{cache_file}: dropped 3 entries this release cannot use:" in out
    for key in ("malformed", stale, fkey):
        assert f"  {key}: " in out
    assert "'route' is 3" in out and "not registered (cpu.gone)" in out and "cpu.pointwise, not one of" in out
    kept = TuningCache(cache_file).read()
    assert kept.problems == {} and set(kept.entries) == set(entries) - {"malformed", stale, fkey}
    # a file that is not a cache: replaced, and said
    cache_file.write_text("{torn")
    assert cli.main(["tune"]) == 0
    assert f"{cache_file}: replaced by an empty cache (foreign: not valid JSON" in capsys.readouterr().out
    # --json keeps stdout JSON: what the command says goes to stderr
    cache_file.write_text(_cache_text(1, {"malformed": []}))
    assert cli.main(["tune", "--json"]) == 0
    io = capsys.readouterr()
    assert json.loads(io.out) == [] and "dropped 1 entries" in io.err and "tuning a MinkUNet" in io.err
    # bad arguments: said, nothing run
    ran.clear()
    for argv, msg in ((["--budget", "nan"], "--budget must be"), (["--steps", "0"], "--steps must be"),
                      (["--max-candidates", "1"], "--max-candidates must be"), (["--width", "0"], "--width")):
        assert cli.main(["tune", *argv]) == 2
        assert msg in capsys.readouterr().err
    assert not ran


def test_clear_replaces_whatever_is_there(cache_file, capsys):
    for text in ("{torn", _cache_text(7), _cache_text(1, {"a": {"route": "cpu.row_gather"}, "b": 3})):
        cache_file.write_text(text)
        assert cli.main(["tune", "--clear"]) == 0
        assert TuningCache(cache_file).read() == tuning_cache.Contents({}, {}, "ok")
    assert "removed 1 entries" in capsys.readouterr().out


# ------------------------------------------------------------------ writing: whole, or not at all
def test_a_failed_write_leaves_the_old_file_and_no_temporary(cache_file, monkeypatch):
    c = TuningCache(cache_file)
    c.merge({"a": {"route": "cpu.row_gather"}})
    before = cache_file.read_bytes()

    real_fsync = os.fsync

    def full_disk(fd):  # the temporary file written, then the disk fills
        real_fsync(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        c.merge({"b": {"route": "cpu.row_gather"}})
    assert cache_file.read_bytes() == before
    assert sorted(p.name for p in cache_file.parent.iterdir()) == ["tuning.json", "tuning.json.lock"]


def test_writes_keep_the_files_mode(cache_file):
    c = TuningCache(cache_file)
    c.merge({"a": {"route": "cpu.row_gather"}})
    assert stat.S_IMODE(cache_file.stat().st_mode) == 0o644  # readable by the machine's other users
    cache_file.chmod(0o660)
    c.merge({"b": {"route": "cpu.row_gather"}})
    assert stat.S_IMODE(cache_file.stat().st_mode) == 0o660


READER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from mlx_lattice.tuning_cache import TuningCache
    c, reads, seen = TuningCache(sys.argv[1]), 0, 0
    Path(sys.argv[1] + ".ready").touch()  # the writers start once this reads
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and seen < int(sys.argv[2]):
        got = c.read()
        # a torn file would read as "foreign" (not JSON) or lose entries
        assert got.state in ("ok", "missing") and not got.problems, got
        assert len(got.entries) >= seen, (len(got.entries), seen)
        seen = len(got.entries)
        reads += 1
    print(json.dumps({"reads": reads, "seen": seen}))
""")

WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mlx_lattice.tuning_cache import TuningCache
    c, me = TuningCache(sys.argv[1]), int(sys.argv[2])
    deadline = time.monotonic() + 120
    while not Path(sys.argv[1] + ".ready").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(20):
        # long entries: each rewrite of the file takes many write calls
        c.merge({f"p{me}-{i}": {"route": "cpu.row_gather", "note": "x" * 3000, "timings_ms": {"a": i}}})
""")


def test_concurrent_writers_and_readers_never_see_a_torn_file(cache_file):
    n = 3 * 20
    reader = subprocess.Popen([sys.executable, "-c", READER, str(cache_file), str(n)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(cache_file), str(i)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV) for i in range(3)]
    for p in writers + [reader]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    seen = json.loads(out)
    assert seen["seen"] == n and seen["reads"] > 1
    got = TuningCache(cache_file).read()
    assert got.state == "ok" and len(got.entries) == n
    assert not list(cache_file.parent.glob("*.tmp"))


# ------------------------------------------------------------------ read-only directories
def _unprivileged():
    """A command prefix under which file permissions hold (root ignores
    them), or None where none can be had."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


READ_ONLY = textwrap.dedent("""
    import json, sys, warnings
    from pathlib import Path
    import numpy as np, mlx.core as mx
    import mlx_lattice as ml
    from mlx_lattice import __main__ as cli, diagnostics, ops, tuning
    from mlx_lattice.backends.cuda import jit
    import oracle
    mx.set_default_device(mx.cpu)  # the cache's entries name the CPU's routes
    d = Path(sys.argv[1])
    try:
        (d / "probe").write_text("")
        print(json.dumps({"writable": True}))
        sys.exit(0)
    except OSError:
        pass
    rng = np.random.default_rng(0)  # the data the cache was tuned on
    coords = oracle.random_coords(rng, 300, 8, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 16)).astype(np.float32))
    w = mx.array((rng.standard_normal((16, 2, 2, 2, 16)) * 0.1).astype(np.float32))
    out = {"writable": False}
    timer = lambda label, fn: 0.5e-3 if label.startswith("cpu.gather_gemm") else 1e-3
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for name, mode in (("fresh", "tune"), ("tuning.json", "cached"), ("tuning.json", "tune")):
            tuning.reset()
            with tuning.using(mode=mode, timer=timer, cache_path=str(d / name)), diagnostics.record() as log:
                mx.eval(ops.conv3d(x, w, stride=2).feats)
            out[name + " " + mode] = [r["route"] for r in log if r["op"] == "conv3d"] + [
                r["choice"] for r in log if r["op"] == "conv3d"]
        # the CUDA kernel cache: compiled, used, not kept, said
        k = jit.kernel("mlx_lattice_readonly_probe", ["x"], ["y"], "y[0] = x[0];")
        jit._nvrtc = lambda: type("C", (), {"arch": "sm_90", "version": "13.0", "path": None,
                                            "compile": lambda self, t, n: Path(sys.argv[2]).read_bytes()})()
        jit.compile_workers = lambda: 0
        import os
        os.environ["MLX_LATTICE_CUDA_CACHE"] = str(d / "cuda")
        built = k._build((((mx.float32, 1),), (mx.float32,), ()), [jit._Standin(mx.float32, 1)], [mx.float32], [])
        out["cuda"] = [built[0].startswith("mlx_lattice_readonly_probe_"), len(built[1])]
    out["said"] = [str(w.message) for w in said]
    out["clear"] = cli.main(["tune", "--clear", "--cache", str(d / "tuning.json")])
    out["tune"] = cli.main(["tune", "--cache", str(d / "tuning.json")])
    print(json.dumps(out))
""")


def test_read_only_directories():
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to hold")
    d = Path(tempfile.mkdtemp(prefix="mlx_lattice_ro_"))
    try:
        d.chmod(0o755)
        call = strided(np.random.default_rng(0))
        with tuning.using(cache_path=str(d / "tuning.json")):
            forward_record(call, "tune")  # a cache to read, written while the directory was writable
        d.chmod(0o555)
        cubin = d / "fixture.cubin"
        d.chmod(0o755)
        cubin.write_bytes(CUBIN)
        d.chmod(0o555)
        out = subprocess.run(prefix + [sys.executable, "-c", READ_ONLY, str(d), str(cubin)], capture_output=True,
                             text=True, env={**ENV, "HOME": str(d)}, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.splitlines()[-1])
        if got["writable"]:
            pytest.skip("the directory stayed writable")
        # nothing crashed; the choices hold for the process, and it says why
        assert got["fresh tune"] == ["cpu.gather_gemm", "tuner"]
        assert got["tuning.json cached"] == ["cpu.gather_gemm", "cache"]
        assert got["tuning.json tune"] == ["cpu.gather_gemm", "cache"]
        assert any("cannot write the cache" in m and str(d / "fresh") in m for m in got["said"])
        assert got["cuda"] == [True, len(CUBIN)]
        assert any("could not keep a compiled CUDA kernel" in m for m in got["said"])
        # the commands that must write fail with a clear message
        assert got["clear"] == 1 and got["tune"] == 1
        assert f"tune: cannot clear {d / 'tuning.json'}" in out.stderr
        assert f"tune: cannot write the tuning cache {d / 'tuning.json'}" in out.stderr
    finally:
        d.chmod(0o755)
        shutil.rmtree(d)


# ------------------------------------------------------------------ the CUDA kernel cache: cubins
def test_cubin_check_accepts_a_whole_cubin_and_refuses_damaged_ones():
    assert jit.cubin_problem(CUBIN) is None
    # cut short anywhere: refused (the header tables and the last section
    # sit at the end of the file)
    for n in list(range(0, 80, 7)) + list(range(80, len(CUBIN), 97)) + [len(CUBIN) - 1]:
        assert jit.cubin_problem(CUBIN[:n]) is not None, n
    assert "not an ELF file" in jit.cubin_problem(b"garbage" * 100)
    x86 = bytearray(CUBIN)
    x86[18:20] = (62).to_bytes(2, "little")
    assert "machine 62, not CUDA" in jit.cubin_problem(bytes(x86))
    elf32 = bytearray(CUBIN)
    elf32[4] = 1
    assert "64-bit" in jit.cubin_problem(bytes(elf32))
    # a section reaching past the end
    shoff = int.from_bytes(CUBIN[40:48], "little")
    grown = bytearray(CUBIN)
    entry = shoff + 64 * 1
    grown[entry + 32:entry + 40] = (1 << 20).to_bytes(8, "little")
    assert "section 1 ends at byte" in jit.cubin_problem(bytes(grown))


class FakeCompiler:
    """Stands in for NVRTC: returns the fixture cubin, counting calls."""

    arch, version, path, options = "sm_90", "13.0", None, ["--gpu-architecture=sm_90"]

    def __init__(self):
        self.calls = 0

    def compile(self, text, name):
        self.calls += 1
        return CUBIN


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    comp = FakeCompiler()
    monkeypatch.setattr(jit, "_nvrtc", lambda: comp)
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", str(tmp_path / "cuda"))
    monkeypatch.setenv("MLX_LATTICE_CUDA_COMPILE_WORKERS", "0")

    def build(value=1):
        k = jit.kernel("mlx_lattice_persist_probe", ["x"], ["y"], "y[0] = x[0] * (T)A;")
        key = (((mx.float32, 1),), (mx.float32,), (("T", mx.float32), ("A", value)))
        return k._build(key, [jit._Standin(mx.float32, 1)], [mx.float32], list(key[2]))

    yield SimpleNamespace(comp=comp, dir=tmp_path / "cuda" / "sm_90", build=build)
    # the probe kernel leaves the registry (the package's own kernels stay:
    # their modules make each once per process)
    jit._KERNELS.pop("mlx_lattice_persist_probe", None)


def test_cubins_are_kept_whole_and_read_back(kernel_cache):
    name, cubin = kernel_cache.build()
    assert cubin == CUBIN and kernel_cache.comp.calls == 1
    [path] = kernel_cache.dir.glob("*.cubin")
    assert path.read_bytes() == CUBIN and path.stem == name
    assert sorted(p.name for p in kernel_cache.dir.iterdir()) == sorted(
        [path.name, "manifest.jsonl", "manifest.jsonl.lock"])
    [line] = (kernel_cache.dir / "manifest.jsonl").read_text().splitlines()
    assert jit._read_line(line)[0].name == "mlx_lattice_persist_probe"
    # a later process: read from disk, nothing compiled
    assert kernel_cache.build() == (name, CUBIN) and kernel_cache.comp.calls == 1


@pytest.mark.parametrize("damage", ["empty", "half", "last byte", "garbage", "directory"])
def test_a_damaged_cubin_is_said_compiled_again_and_replaced(kernel_cache, damage):
    name, _ = kernel_cache.build()
    path = kernel_cache.dir / f"{name}.cubin"
    path.unlink()
    if damage == "directory":
        path.mkdir()
    else:
        path.write_bytes({"empty": b"", "half": CUBIN[: len(CUBIN) // 2], "last byte": CUBIN[:-1],
                          "garbage": os.urandom(len(CUBIN))}[damage])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = kernel_cache.build()
    assert any(m.startswith(f"mlx_lattice: the cached CUDA kernel {path} is") for m in said(w))
    if damage == "directory":  # it cannot be replaced: said, and compiled per process
        assert any("could not keep a compiled CUDA kernel" in m for m in said(w))
    assert got == (name, CUBIN) and kernel_cache.comp.calls == 2  # never the damaged bytes
    if damage != "directory":
        assert path.read_bytes() == CUBIN
    assert not list(kernel_cache.dir.glob("*.tmp"))


def test_a_failed_cubin_write_leaves_no_temporary(kernel_cache, monkeypatch):
    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jit.os, "replace", full)
    with pytest.warns(RuntimeWarning, match="could not keep a compiled CUDA kernel"):
        name, cubin = kernel_cache.build()
    assert cubin == CUBIN
    assert [p.name for p in kernel_cache.dir.iterdir()] == []


def test_the_pool_queues_a_damaged_cubin_again(kernel_cache):
    name, _ = kernel_cache.build()
    k = jit._KERNELS["mlx_lattice_persist_probe"]
    key = (((mx.float32, 1),), (mx.float32,), (("T", mx.float32), ("A", 1)))
    pool = object.__new__(jit._Pool)
    pool.comp, pool.directory = kernel_cache.comp, kernel_cache.dir.parent
    pool.done, pool.jobs = {}, SimpleNamespace(put=lambda job: None)
    assert pool._queue(k, key) is False  # whole: nothing to compile
    (kernel_cache.dir / f"{name}.cubin").write_bytes(CUBIN[:100])
    with pytest.warns(RuntimeWarning, match="cut short"):
        assert pool._queue(k, key) is True


# ------------------------------------------------------------------ the CUDA kernel cache: kernel lists
def test_kernel_list_lines_that_cannot_be_used_are_said_and_tidied(kernel_cache):
    kernel_cache.build(1)
    kernel_cache.build(2)
    listed = kernel_cache.dir / "manifest.jsonl"
    good = listed.read_text().splitlines()
    bad = ['{"kernel": "mlx_lattice_persist_pro', "not json at all",
           '{"kernel": "mlx_lattice_gone_kernel", "inputs": [], "outputs": [], "template": []}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": ["float99"], '
           '"template": []}', "[]", '{"kernel": 3}', "null",
           # each field of a line in turn
           '{"kernel": "mlx_lattice_persist_probe", "inputs": "float32", "outputs": ["float32"], "template": []}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", "one"]], "outputs": ["float32"], '
           '"template": []}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1], ["float32", 1]], '
           '"outputs": ["float32"], "template": []}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": 3, "template": []}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": ["float32"], '
           '"template": [["T", [1]]]}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": ["float32"], '
           '"template": [["T", "float99"]]}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": ["float32"], '
           '"template": "T"}',
           '{"kernel": "mlx_lattice_persist_probe", "inputs": [["float32", 1]], "outputs": ["float32"]}']
    listed.write_text("\n".join([good[0], *bad, good[0], "", good[1]]) + "\n")
    with pytest.warns(RuntimeWarning) as w:
        entries = jit.manifest([listed])
    assert len(entries) == 2
    [msg] = [m for m in said(w) if "kernel list" in m]
    assert str(listed) in msg and f"{len(bad)} lines cannot be used" in msg and "line 2: not JSON" in msg
    assert "cuda-prebuild rewrites" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jit.manifest([listed])  # said once per process
        assert jit.manifest([jit._SHIPPED])  # the package's own list: nothing to say
    assert jit.tidy_manifest(kernel_cache.dir) == len(bad) + 1  # and one repeat
    assert listed.read_text().splitlines() == good
    assert jit.tidy_manifest(kernel_cache.dir) == 0 and jit.tidy_manifest(kernel_cache.dir.parent / "none") == 0


APPENDER = textwrap.dedent("""
    import sys
    import mlx.core as mx
    from mlx_lattice.backends.cuda import jit
    cubin = open(sys.argv[2], "rb").read()
    comp = type("C", (), {"arch": "sm_90", "version": "13.0", "path": None, "compile": lambda s, t, n: cubin})()
    jit._nvrtc = lambda: comp
    me = int(sys.argv[3])
    # long template names: each list line is past 8 KiB, more than one
    # buffered write would take
    k = jit.kernel("mlx_lattice_persist_probe", ["x"], ["y"], "y[0] = x[0];")
    for i in range(15):
        template = [("T", mx.float32), ("N" + "x" * 9000, me * 1000 + i)]
        key = (((mx.float32, 1),), (mx.float32,), tuple(template))
        assert k._build(key, [jit._Standin(mx.float32, 1)], [mx.float32], template)[1] == cubin
""")

CUBIN_READER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from mlx_lattice.backends.cuda import jit
    d, seen, deadline = Path(sys.argv[1]), 0, time.monotonic() + 120
    while time.monotonic() < deadline and seen < int(sys.argv[2]):
        files = list(d.glob("*.cubin")) if d.is_dir() else []
        for f in files:
            data = f.read_bytes()
            assert jit.cubin_problem(data) is None, (f, len(data))
        seen = len(files)
""")


def test_concurrent_kernel_cache_writers(kernel_cache, tmp_path):
    fixture = tmp_path / "fixture.cubin"
    fixture.write_bytes(CUBIN)
    env = {**ENV, "MLX_LATTICE_CUDA_CACHE": str(tmp_path / "cuda"), "MLX_LATTICE_CUDA_COMPILE_WORKERS": "0"}
    n = 3 * 15
    readers = [subprocess.Popen([sys.executable, "-c", CUBIN_READER, str(kernel_cache.dir), str(n)], env=env,
                                stderr=subprocess.PIPE, text=True)]
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), str(fixture), str(i)], env=env,
                                stderr=subprocess.PIPE, text=True) for i in range(3)]
    for p in writers + readers:
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 0, err[-3000:]
    assert len(list(kernel_cache.dir.glob("*.cubin"))) == n
    assert not list(kernel_cache.dir.glob("*.tmp"))
    lines = (kernel_cache.dir / "manifest.jsonl").read_text().splitlines()
    jit.kernel("mlx_lattice_persist_probe", ["x"], ["y"], "y[0] = x[0];")  # as the writers made it
    assert len(lines) == n and all(not isinstance(jit._read_line(line), str) for line in lines)


def test_compiler_process_leaves_no_temporary_when_the_rename_fails(tmp_path, monkeypatch):
    from mlx_lattice.backends.cuda import nvrtc_worker

    monkeypatch.setattr(nvrtc_worker, "compile_one", lambda lib, options, name, source: (CUBIN, None))
    monkeypatch.setattr(nvrtc_worker.ctypes, "CDLL", lambda path: object())
    target = tmp_path / "k.cubin"
    target.mkdir()  # a directory where the cubin goes: the rename fails
    good = tmp_path / "sm_90" / "j.cubin"
    reqs = [{"lib": "x", "options": [], "name": n, "source": "", "path": str(p)} for n, p in (("k", target),
                                                                                           ("j", good))]
    replies = []
    monkeypatch.setattr(nvrtc_worker.sys, "stdin", [json.dumps(r) + "\n" for r in reqs])
    monkeypatch.setattr(nvrtc_worker.sys, "stdout", SimpleNamespace(write=replies.append, flush=lambda: None))
    assert nvrtc_worker.main() == 0
    first, second = (json.loads(r) for r in replies)
    assert first["error"] and second["error"] is None
    assert good.read_bytes() == CUBIN
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["j.cubin"]


# ------------------------------------------------------------------ the route log
LOGGER = textwrap.dedent("""
    import numpy as np, mlx.core as mx
    import mlx_lattice as ml
    from mlx_lattice import diagnostics
    for i in range(40):
        # a long record: one line past the 8 KiB a buffered file writes at once
        diagnostics.emit({"op": "conv3d", "i": i, "pad": "x" * 20000})
""")


def test_route_log_lines_of_concurrent_processes_never_interleave(tmp_path):
    log = tmp_path / "routes.jsonl"
    env = {**ENV, "MLX_LATTICE_ROUTE_LOG": str(log)}
    procs = [subprocess.Popen([sys.executable, "-c", LOGGER], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 0, err[-3000:]
    lines = log.read_text().splitlines()
    assert len(lines) == 4 * 40
    assert sorted(json.loads(line)["i"] for line in lines) == sorted(list(range(40)) * 4)


def test_route_log_read_back_skips_what_it_cannot_plan(rng, tmp_path, capsys):
    call = strided(rng)
    with diagnostics.record() as log:
        mx.eval(call().feats)
    good = [json.dumps(r) for r in log if r["op"] != "map"]
    rec = json.loads(good[0])
    bad = ['{"op": "conv3d", "c_in": 16', "null", json.dumps({**rec, "c_in": "16"}),
           json.dumps({k: v for k, v in rec.items() if k != "edges"}), json.dumps({**rec, "kernel_size": [2, 2]}),
           json.dumps({**rec, "quantized": "no"}), json.dumps({**rec, "direction": "sideways"}),
           json.dumps({**rec, "k": -8})]
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(good + bad) + "\n")
    with pytest.warns(RuntimeWarning) as w:
        records = mac_plan.load(path)
    assert records == [json.loads(g) for g in good]
    msgs = [m for m in said(w) if str(path) in m]
    assert len(msgs) == len(bad)
    assert f"route log {path}: line {len(good) + 1} is not JSON" in msgs[0]
    assert "c_in is '16', not a count" in " ".join(msgs) and "missing edges" in " ".join(msgs)
    # the command: a plan of what could be read, as JSON where asked
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli.main(["routes", "--mac", "m4", "--log", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calls"] == len(good)
    with pytest.raises(SystemExit):
        cli.main(["routes", "--mac", "m4", "--log", str(tmp_path / "missing.jsonl")])
    assert "cannot read --log" in capsys.readouterr().err


def test_prebuild_tidies_the_caches_kernel_list_and_says_so(kernel_cache, monkeypatch, capsys):
    kernel_cache.build(1)
    listed = kernel_cache.dir / "manifest.jsonl"
    good = listed.read_text()
    listed.write_text(good + "not json\n" + good)

    class Pool:  # the compiler processes, standing in: every listed kernel already there
        def __init__(self, comp, directory, workers, entries):
            self.done = {}

        def offer(self, dtype):
            pass

        def close(self):
            pass

    comp = FakeCompiler()
    comp.path = "libnvrtc.so"
    monkeypatch.setattr(jit, "_Nvrtc", lambda arch=None: comp)
    monkeypatch.setattr(jit, "_Pool", Pool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tidied first: nothing left to warn about
        r = jit.prebuild([mx.float32], arch="sm_90", workers=1)
    assert r["list_lines_dropped"] == 2 and listed.read_text() == good
    listed.write_text(good + "[]\n")
    assert cli.main(["cuda-prebuild", "--arch", "sm_90", "--dtypes", "float32"]) == 0
    assert "the cache's kernel list lost 1 lines this package cannot use" in capsys.readouterr().out
