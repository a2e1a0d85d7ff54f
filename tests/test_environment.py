"""Every environment variable the package reads: a good value takes effect,
and a bad or odd one gives a clear error or its documented behaviour,
never a crash at import or a silent misreading (docs/tuning.md,
"Environment variables"). The variables read at import are tested in fresh
processes; the others where they are read."""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import mlx.core as mx

import mlx_lattice as ml
from mlx_lattice import diagnostics, ops, tuning, tuning_cache
from mlx_lattice.backends.cuda import jit

import oracle

ROOT = Path(__file__).resolve().parents[1]

# Every variable this package reads, and the test below that covers it.
COVERED = {
    "MLX_LATTICE_ROUTE_FORWARD": "test_forced_route_variables_at_import",
    "MLX_LATTICE_ROUTE_DGRAD": "test_forced_route_variables_at_import",
    "MLX_LATTICE_ROUTE_WGRAD": "test_forced_route_variables_at_import",
    "MLX_LATTICE_TUNE": "test_tuning_mode_variable",
    "MLX_LATTICE_TUNE_BUDGET": "test_tuning_budget_variable",
    "MLX_LATTICE_TUNE_CACHE": "test_tuning_cache_path_variables",
    "XDG_CACHE_HOME": "test_tuning_cache_path_variables",
    "MLX_LATTICE_ROUTE_LOG": "test_route_log_variable",
    "MLX_LATTICE_NUM_THREADS": "test_thread_count_variable",
    "MLX_LATTICE_CPU_ISA": "test_extension_variables",
    "MLX_LATTICE_MALLOC_TUNING": "test_extension_variables",
    "GLIBC_TUNABLES": "test_extension_variables",
    "MALLOC_TOP_PAD_": "test_extension_variables",
    "MLX_LATTICE_CUDA_CACHE": "test_cuda_cache_variables",
    "MLX_LATTICE_CUDA_COMPILE_WORKERS": "test_cuda_cache_variables",
    "CUDA_HOME": "test_cuda_cache_variables",
    "CUDA_PATH": "test_cuda_cache_variables",
}


def test_every_variable_read_is_covered():
    # The names the sources read (os.environ / getenv / the ENV_ constants
    # that name them): a new variable must come with its test here.
    found = set()
    read = re.compile(r'(?:environ\.get|environ\[|getenv|encodekey)\(\s*"([A-Z][A-Z0-9_]+)"')
    named = re.compile(r'\bENV_[A-Z_]+ = "([A-Z][A-Z0-9_]+)"')
    for path in list((ROOT / "mlx_lattice").rglob("*.py")) + list((ROOT / "src").rglob("*.cpp")):
        if "bench" in path.parts:  # the benchmarks set variables for their child processes
            continue
        text = path.read_text()
        found |= set(read.findall(text)) | set(named.findall(text))
        if "MLX_LATTICE_ROUTE_{" in text:
            found |= {f"MLX_LATTICE_ROUTE_{p.upper()}" for p in tuning.PASSES}
    assert found and found <= set(COVERED), sorted(found - set(COVERED))
    names = {n for n in dir(sys.modules[__name__]) if n.startswith("test_")}
    assert set(COVERED.values()) <= names


def _python(code: str, **env):
    """Run code in a fresh interpreter with `env` on top of this one's
    (None: the variable unset)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MLX_LATTICE_")}
    full["PYTHONPATH"] = str(ROOT / "tests") + os.pathsep + os.environ.get("PYTHONPATH", "")
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=full, capture_output=True,
                          text=True, timeout=300)


# ------------------------------------------------------------------ forced routes
FORCED_RUN = """
import json, warnings
import numpy as np, mlx.core as mx
import mlx_lattice as ml
from mlx_lattice import diagnostics, ops, tuning
import oracle
rng = np.random.default_rng(3)
coords = oracle.random_coords(rng, 200, 8, 1)
x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 16)).astype(np.float32))
w = mx.array((rng.standard_normal((16, 2, 2, 2, 16)) * 0.1).astype(np.float32))
with diagnostics.record() as log:
    mx.eval(mx.grad(lambda f, w: ops.conv3d(x.replace(f), w, stride=2).feats.sum(), argnums=(0, 1))(x.feats, w))
print(json.dumps({"forced": {k: list(v) for k, v in tuning._state.forced.items()},
                  "routes": {r["direction"]: [r["route"], r["choice"]] for r in log if r["op"] != "map"}}))
"""


def test_forced_route_variables_at_import():
    # Each variable alone, with a valid route: the import works and the
    # route runs for that pass (the import once failed with a NameError).
    for var, route, direction in (("MLX_LATTICE_ROUTE_FORWARD", "cpu.gather_gemm", "forward"),
                                  ("MLX_LATTICE_ROUTE_DGRAD", "cpu.gather_gemm", "dgrad"),
                                  ("MLX_LATTICE_ROUTE_WGRAD", "cpu.wgrad_gemm", "wgrad")):
        out = _python(FORCED_RUN, MLX_LATTICE_TUNE="off", **{var: f" metal.wgrad_direct, {route} "
                                                             if direction == "wgrad" else route})
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.splitlines()[-1])
        assert direction in got["forced"] and route in got["forced"][direction]
        assert got["routes"][direction] == [route, "forced"], got
        assert "RuntimeWarning" not in out.stderr
    # bad values: the import works, each variable is refused whole with a
    # warning naming it and its value, and the static order runs
    bad = {"MLX_LATTICE_ROUTE_FORWARD": "cpu.no_such_route", "MLX_LATTICE_ROUTE_DGRAD": "cpu.wgrad_gemm",
           "MLX_LATTICE_ROUTE_WGRAD": "cpu.wgrad_gemm,,bogus"}
    out = _python(FORCED_RUN, MLX_LATTICE_TUNE="off", **bad)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["forced"] == {} and all(choice == "static" for _, choice in got["routes"].values())
    for var, value in bad.items():
        assert f"{var}={value!r}" in out.stderr
    assert "no route named 'cpu.no_such_route'" in out.stderr
    assert "serves wgrad, not dgrad" in out.stderr and "no route named 'bogus'" in out.stderr
    # only commas and blanks: as unset
    out = _python(FORCED_RUN, MLX_LATTICE_TUNE="off", MLX_LATTICE_ROUTE_FORWARD=" , ,")
    assert out.returncode == 0 and json.loads(out.stdout.splitlines()[-1])["forced"] == {}
    assert "RuntimeWarning" not in out.stderr


# ------------------------------------------------------------------ tuning settings
@pytest.mark.parametrize("value, mode, warns", [
    ("tune", "tune", False), (" OFF ", "off", False), ("Cached", "cached", False), ("", "cached", False),
    ("always", "cached", True), ("1", "cached", True)])
def test_tuning_mode_variable(monkeypatch, value, mode, warns):
    monkeypatch.setenv("MLX_LATTICE_TUNE", value)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert tuning._env_settings().mode == mode
    named = [w for w in said if f"MLX_LATTICE_TUNE={value.strip().lower()!r}" in str(w.message)]
    assert bool(named) == warns and len(said) == len(named)


@pytest.mark.parametrize("value, budget, warns", [
    ("2.5", 2.5, False), (" 0 ", 0.0, False), ("inf", float("inf"), False), ("", 10.0, False),
    ("nan", 10.0, True), ("-1", 10.0, True), ("ten", 10.0, True), ("1e", 10.0, True)])
def test_tuning_budget_variable(monkeypatch, value, budget, warns):
    monkeypatch.setenv("MLX_LATTICE_TUNE_BUDGET", value)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert tuning._env_settings().budget_s == budget
    assert bool([w for w in said if "MLX_LATTICE_TUNE_BUDGET" in str(w.message)]) == warns


def test_bad_tuning_variables_do_not_break_the_import():
    out = _python("import mlx_lattice.tuning as t; s = t.settings(); print(s.mode, s.budget_s)",
                  MLX_LATTICE_TUNE="sometimes", MLX_LATTICE_TUNE_BUDGET="nan")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["cached", "10.0"]
    assert "MLX_LATTICE_TUNE='sometimes'" in out.stderr and "MLX_LATTICE_TUNE_BUDGET='nan'" in out.stderr


def test_tuning_settings_are_checked():
    for kw, said in ((dict(budget_s=-1), "budget_s must be a number of seconds >= 0"),
                     (dict(budget_s="10"), "budget_s"), (dict(budget_s=float("nan")), "budget_s"),
                     (dict(min_rounds=0), "min_rounds must be an int >= 1"),
                     (dict(max_rounds=2.0), "max_rounds"), (dict(min_rounds=5, max_rounds=4), "more than max_rounds"),
                     (dict(max_candidates=1), "at least one other"), (dict(margin=1.0), "margin"),
                     (dict(per_candidate_s=float("inf")), "per_candidate_s"), (dict(cache_path=""), "cache_path"),
                     (dict(cache_path=3), "cache_path"), (dict(mode=None), "mode")):
        with pytest.raises(ValueError, match=said):
            tuning.configure(**kw)
    before = tuning.settings()
    with tuning.using(budget_s=float("inf"), cache_path=Path("/tmp/x.json"), margin=0):
        assert tuning.settings().cache_path == "/tmp/x.json" and tuning.settings().budget_s == float("inf")
    assert tuning.settings() == before


def test_tuning_cache_path_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", "")  # empty: as unset
    assert tuning_cache.default_path() == tmp_path / "home" / ".cache" / "mlx_lattice" / "tuning.json"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning_cache.default_path() == tmp_path / "xdg" / "mlx_lattice" / "tuning.json"
    # a relative XDG_CACHE_HOME is ignored, as the XDG rules say
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert tuning_cache.default_path() == tmp_path / "home" / ".cache" / "mlx_lattice" / "tuning.json"
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", "~/t.json")
    assert tuning_cache.default_path() == tmp_path / "home" / "t.json"
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", " mine.json ")  # from the working directory
    assert tuning_cache.default_path() == Path("mine.json")
    # a directory: read as unreadable (a warning), written never (a warning)
    monkeypatch.setenv("MLX_LATTICE_TUNE_CACHE", str(tmp_path))
    tuning_cache._warned.clear()
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert tuning_cache.TuningCache().load() == {}
    with pytest.raises(OSError):
        tuning_cache.TuningCache().merge({"k": {"route": "cpu.row_gather"}})


# ------------------------------------------------------------------ the route log
def _small_call(rng):
    coords = oracle.random_coords(rng, 60, 5, 1)
    x = ml.SparseTensor(coords, rng.standard_normal((len(coords), 4)).astype(np.float32))
    return lambda: mx.eval(ops.subm_conv3d(x, mx.ones((8, 3, 3, 3, 4))).feats)


def test_route_log_variable(rng, monkeypatch, tmp_path):
    call = _small_call(rng)
    log = tmp_path / "routes.jsonl"
    monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", str(log))
    call()
    call()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["op"] for r in lines if r["op"] != "map"] == ["subm_conv3d", "subm_conv3d"]
    # blank: no file, nothing said
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", "  ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routes.jsonl"]
    # a path that cannot be written (a directory, a missing directory): the
    # call runs, with one warning naming the variable and the path
    for bad in (tmp_path, tmp_path / "missing" / "routes.jsonl"):
        monkeypatch.setenv("MLX_LATTICE_ROUTE_LOG", str(bad))
        with pytest.warns(RuntimeWarning, match=re.escape(f"MLX_LATTICE_ROUTE_LOG={str(bad)!r}: cannot append")):
            with diagnostics.record() as rec:
                call()
        assert len(rec) == 1  # the records still reach the listeners in the process
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            call()  # said once


# ------------------------------------------------------------------ read by the extension at import
@pytest.mark.parametrize("value, threads", [("3", 3), (" 2 ", 2), ("+1", 1), ("", None), ("0", None),
                                            ("abc", "error"), ("-1", "error"), ("4x", "error"),
                                            ("2.5", "error"), ("99999999999", "error"), ("4097", "error")])
def test_thread_count_variable(value, threads):
    out = _python("import mlx_lattice as ml, os; print(ml.num_threads(), os.cpu_count())",
                  MLX_LATTICE_NUM_THREADS=value)
    if threads == "error":
        assert out.returncode != 0
        assert f"ImportError: MLX_LATTICE_NUM_THREADS={value.strip()!r}: expected a whole number" in out.stderr
        return
    assert out.returncode == 0, out.stderr[-2000:]
    n, cores = map(int, out.stdout.split())
    assert n == (threads or cores)


def test_thread_count_variable_is_read_at_import():
    # set after the import, it changes nothing: the pool took its count then
    out = _python("import os, mlx_lattice as ml; os.environ['MLX_LATTICE_NUM_THREADS'] = 'abc'; "
                  "import numpy as np, mlx.core as mx; from mlx_lattice import ops; import oracle; "
                  "c = oracle.random_coords(np.random.default_rng(0), 40, 5, 1); "
                  "x = ml.SparseTensor(c, np.ones((len(c), 4), np.float32)); "
                  "mx.eval(ops.subm_conv3d(x, mx.ones((4, 3, 3, 3, 4))).feats); print(ml.num_threads())",
                  MLX_LATTICE_NUM_THREADS="2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2"]


def test_extension_variables():
    isas = ml._ext.supported_cpu_isas()
    for env, ok in ((dict(MLX_LATTICE_CPU_ISA=isas[0]), isas[0]), (dict(MLX_LATTICE_CPU_ISA=""), None),
                    (dict(MLX_LATTICE_CPU_ISA="sse9"), "error"), (dict(MLX_LATTICE_MALLOC_TUNING="0"), "off"),
                    (dict(MLX_LATTICE_MALLOC_TUNING="yes"), "error"),
                    (dict(GLIBC_TUNABLES="glibc.malloc.trim_threshold=0"), "left as configured"),
                    (dict(MALLOC_TOP_PAD_="0"), "left as configured (MALLOC_TOP_PAD_ is set)")):
        out = _python("import mlx_lattice as ml; print(ml._ext.cpu_isa()); print(ml._ext.malloc_tuning())", **env)
        if ok == "error":
            assert out.returncode != 0
            var, value = next(iter(env.items()))
            assert f"ImportError: {var}={value}" in out.stderr
            continue
        assert out.returncode == 0, out.stderr[-2000:]
        isa, malloc = out.stdout.splitlines()
        if "MLX_LATTICE_CPU_ISA" in env:
            assert isa == (ok or ml._ext.cpu_isa())
        else:
            assert ok in malloc


# ------------------------------------------------------------------ the CUDA kernel cache
def test_cuda_cache_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for value in ("off", "OFF", " Off "):
        monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", value)
        assert jit.cache_dir() is None
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", "")
    assert jit.cache_dir() == tmp_path / "home" / ".cache" / "mlx_lattice" / "cuda"
    monkeypatch.setenv("XDG_CACHE_HOME", "not/absolute")
    assert jit.cache_dir() == tmp_path / "home" / ".cache" / "mlx_lattice" / "cuda"
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", "~/kernels")
    assert jit.cache_dir() == tmp_path / "home" / "kernels"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", "rel")
    assert jit.cache_dir() == tmp_path / "rel"  # absolute: a later chdir does not move it
    for value, n in (("0", 0), ("3", 3), (" 2 ", 2)):
        monkeypatch.setenv("MLX_LATTICE_CUDA_COMPILE_WORKERS", value)
        assert jit.compile_workers() == n
    monkeypatch.setenv("MLX_LATTICE_CUDA_COMPILE_WORKERS", "")
    assert jit.compile_workers() == max(0, min(8, (os.cpu_count() or 1) - 1))
    for value in ("-1", "two", "1.5"):
        monkeypatch.setenv("MLX_LATTICE_CUDA_COMPILE_WORKERS", value)
        with pytest.raises(ValueError, match=re.escape(f"MLX_LATTICE_CUDA_COMPILE_WORKERS={value!r}: expected")):
            jit.compile_workers()
    # CUDA_HOME / CUDA_PATH: where the CUDA headers are looked for; a
    # directory without them is passed over, and with no headers anywhere
    # the compiler is not made, with an error that names CUDA_HOME
    monkeypatch.setattr(jit, "_site_dirs", lambda: [])
    monkeypatch.setitem(sys.modules, "mlx", type(sys)("mlx"))
    sys.modules["mlx"].__path__ = [str(tmp_path / "mlx")]
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(OSError, match="set CUDA_HOME"):
        jit._Nvrtc._includes()
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    (tmp_path / "cuda" / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "cuda"))
    assert jit._Nvrtc._includes() == [str(tmp_path / "cuda" / "include")]
