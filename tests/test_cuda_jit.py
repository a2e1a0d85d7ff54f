"""The CUDA kernels' on-disk cache (mlx_lattice/backends/cuda/jit.py): what it
compiles, and where it keeps it. Compiling and launching need a GPU
(tests/test_cuda*.py run them there); these check the parts that do not."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import mlx.core as mx

from conftest import needs_cuda
from mlx_lattice.backends.cuda import jit


def test_specialised_source_matches_mlx_signature_order():
    k = jit.kernel("mlx_lattice_demo", ["x", "params"], ["y"],
                   "  y[0] = x[0] * (T)A + (T)x_shape[1];", header="// header\n")
    text = k._specialised([mx.zeros((3, 5), mx.float16), mx.zeros((2,), mx.int32)], [mx.float16],
                          [("T", mx.float16), ("A", 4), ("FLAG", True)])
    # inputs, then outputs, then the shaped inputs' sizes as int scalars
    sig = text[text.index('extern "C" __global__ void KERNEL_NAME('):text.index(") {")]
    assert [p.strip() for p in sig.split("(", 1)[1].split(",")] == [
        "const __half* x", "const int32_t* params", "__half* y", "int x_shape_0", "int x_shape_1"]
    assert "const int x_shape[2] = {x_shape_0, x_shape_1};" in text
    assert "constexpr int A = 4;" in text and "constexpr bool FLAG = true;" in text and "using T = __half;" in text
    assert text.index("// header") < text.index("namespace mlx::core::cu")
    assert k.shaped == ["x"]


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", str(tmp_path))
    assert jit.cache_dir() == tmp_path
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", "off")
    assert jit.cache_dir() is None
    monkeypatch.delenv("MLX_LATTICE_CUDA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jit.cache_dir() == tmp_path / "mlx_lattice" / "cuda"


def _standins(key):
    ins, outs, template = key
    return [jit._Standin(d, n) for d, n in ins], list(outs), list(template)


def test_shipped_manifest_names_this_package_kernels():
    # Every line of the package's list names a kernel of this package with
    # its arity, and reads back to the same line.
    lines = jit._SHIPPED.read_text().splitlines()
    parsed = [jit._parse(line) for line in lines]
    assert lines and all(p is not None for p in parsed)
    assert [jit._entry(k, key) for k, key in parsed] == [json.dumps(json.loads(line)) for line in lines]
    names = {k.name for k, _ in parsed}
    assert {"mlx_lattice_sorted_mma", "mlx_lattice_wgrad_mma", "mlx_lattice_map_insert",
            "mlx_lattice_norm_stats", "mlx_lattice_map_rows"} <= names
    # each feature dtype of a training step is listed, and every kernel
    # serving all dtypes carries no T
    assert {str(jit._dtype(key)) for _, key in parsed} == {"None", str(mx.float16), str(mx.bfloat16),
                                                             str(mx.float32)}
    assert jit._parse('{"kernel": "mlx_lattice_no_such_kernel", "inputs": [], "outputs": [], "template": []}') is None
    assert jit._parse("not json") is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_shipped_kernels_compile_with_nvcc(tmp_path):
    # The prologue and every kernel's specialised source, as the compiler
    # processes get them: one of each kernel and dtype, compiled for Hopper.
    picked = {}
    for kernel, key in jit.manifest([jit._SHIPPED]):
        picked.setdefault((kernel.name, str(jit._dtype(key))), (kernel, key))
    procs = []
    for i, (kernel, key) in enumerate(picked.values()):
        src = tmp_path / f"k{i}.cu"
        src.write_text(kernel._specialised(*_standins(key)).replace("KERNEL_NAME", f"k{i}"))
        procs.append((kernel.name, key, subprocess.Popen(
            ["nvcc", "-cubin", "-arch=sm_90", "-o", str(tmp_path / f"k{i}.cubin"), str(src)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        if len(procs) % 2 == 0:
            procs[-2][2].wait()
    for name, key, p in procs:
        out = p.communicate()[0]
        assert p.returncode == 0, f"{name} {key[2]}: {out[-2000:]}"


@needs_cuda
def test_pool_compiles_listed_kernels_side_by_side(tmp_path, monkeypatch):
    # A first miss on a machine: the listed kernels of its dtype compile in
    # the compiler processes; one still queued is the caller's to compile.
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", str(tmp_path))
    comp = jit._nvrtc()
    pool = jit._Pool(comp, tmp_path, 2)
    try:
        pool.offer(mx.float16)
        paths = list(pool.done)
        assert len(paths) > 50
        assert pool.wait(paths[-1]) is False  # taken back from the queue
        assert pool.wait(paths[-1]) is True  # and no longer waited for
        deadline = time.monotonic() + 300
        while not all(pool.done[p].is_set() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(os.path.getsize(p) > 0 for p in paths[:-1])
        assert not os.path.exists(paths[-1])  # the workers skipped it
        pool.offer(mx.float16)  # once per dtype
        assert list(pool.done) == paths
    finally:
        for proc in pool.procs:
            proc.stdin.close()


def test_manifest_lines_naming_other_things_are_skipped(tmp_path):
    # A cache's list may come from another release: what this package does
    # not have, or cannot read, is left out, not raised.
    good = jit._SHIPPED.read_text().splitlines()[0]
    bad = [
        '{"kernel": "mlx_lattice_map_insert", "inputs": [["array", 2], ["int32", 1]], '
        '"outputs": ["uint64", "int32", "int32"], "template": []}',
        '{"kernel": "mlx_lattice_map_insert", "inputs": [["int32", 2]], "outputs": [], "template": []}',
        '{"kernel": "mlx_lattice_sorted_mma", "inputs": [], "outputs": [], "template": [["T", [1]]]}',
        '{"kernel": 3}',
        "[]",
    ]
    listed = tmp_path / "manifest.jsonl"
    listed.write_text("\n".join(bad + [good, good]) + "\n")
    assert [jit._entry(k, key) for k, key in jit.manifest([listed, tmp_path / "missing.jsonl"])] == [
        json.dumps(json.loads(good))]


def test_prebuild_arguments_are_checked(capsys):
    from mlx_lattice.__main__ import main

    for argv, said in ((["--arch", "sm90"], "--arch must look like sm_90"),
                       (["--dtypes", "int8"], "--dtypes takes float16"),
                       (["--workers", "0"], "--workers must be at least 1")):
        with pytest.raises(SystemExit):
            main(["cuda-prebuild", *argv])
        assert said in capsys.readouterr().err


def _nvrtc_or_skip():
    try:
        return jit._Nvrtc(arch="sm_90")
    except (OSError, RuntimeError, AttributeError) as e:
        pytest.skip(f"needs NVRTC: {e}")


def test_prebuild_fills_the_cache_for_a_named_arch(tmp_path, monkeypatch):
    # Ahead of time, for an architecture named rather than read from a GPU:
    # the listed specialisations of the dtypes asked for, and a second run
    # finds them there.
    _nvrtc_or_skip()
    monkeypatch.setenv("MLX_LATTICE_CUDA_CACHE", str(tmp_path / "cache"))
    lines = [line for line in jit._SHIPPED.read_text().splitlines()
             if '"mlx_lattice_wgrad_reduce"' in line or '"mlx_lattice_map_insert"' in line]
    listed = tmp_path / "listed.jsonl"
    listed.write_text("\n".join(lines) + "\n")
    r = jit.prebuild([mx.bfloat16], arch="sm_90", workers=2, manifests=[listed])
    assert (r["compiled"], r["failed"], r["arch"]) == (2, 0, "sm_90")  # map_insert and the bf16 reduce
    assert len(list((tmp_path / "cache" / "sm_90").glob("*.cubin"))) == 2
    again = jit.prebuild([mx.bfloat16], arch="sm_90", workers=1, manifests=[listed])
    assert (again["compiled"], again["cached"]) == (0, 2)


@needs_cuda
def test_a_training_step_leaves_no_kernels_for_mlx_to_compile(tmp_path):
    # MLX compiles some kernels of its own at run time (gathers, fused
    # kernels of mx.compile) and keeps them in MLX_PTX_CACHE_DIR; each took
    # seconds of a machine's first step. A MinkUNet step (maps, products,
    # norms, the compiled Adam update, the first step's running statistics
    # of a half-precision model) needs none of them.
    code = (
        "import mlx.core as mx\n"
        "from mlx_lattice import scenes\n"
        "from mlx_lattice.bench.training_step import TrainingStep\n"
        "mx.set_default_device(mx.gpu)\n"
        "v, f = scenes.procedural_closed_mesh()\n"
        "coords = scenes.surface_voxels(v, f, resolution=48)\n"
        "for dt in (mx.float16, mx.float32):\n"
        "    step = TrainingStep(coords, width=0.5, dtype=dt)\n"
        "    step(); step()\n"
    )
    env = dict(os.environ, MLX_PTX_CACHE_DIR=str(tmp_path / "mlx"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "mlx").rglob("*") if p.is_file()) == []
