import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import mlx.core as mx

# Tests assert the static route order: neither a tuning cache of this
# machine's user nor a route named in the environment may change it
# (tests/test_tuner.py sets its own modes, caches and routes).
os.environ["MLX_LATTICE_TUNE"] = "off"
for _pass in ("FORWARD", "DGRAD", "WGRAD"):
    os.environ.pop(f"MLX_LATTICE_ROUTE_{_pass}", None)

import mlx_lattice as ml
from mlx_lattice.backends import cuda


@pytest.fixture
def rng(request):
    # A stable seed per test (crc32, not hash(): that is salted per process),
    # so failures reproduce in isolation and across runs.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def restore_isa():
    """Puts back the CPU instruction-set path and thread count a test changes."""
    previous = ml._ext.cpu_isa()
    threads = ml.num_threads()
    yield
    ml._ext.set_cpu_isa(previous)
    ml.set_num_threads(threads)


@pytest.fixture(params=ml._ext.supported_cpu_isas())
def isa(request, restore_isa):
    """Each CPU instruction-set path this machine supports, in turn."""
    ml._ext.set_cpu_isa(request.param)
    return request.param


def to_np(a) -> np.ndarray:
    """mx.array (any float dtype) -> float64 NumPy."""
    return np.array(a.astype(mx.float32)).astype(np.float64)


def check_statistics_gradients(raw_norm_act, rng):
    """A raw fused norm's batch mean and variance outputs carry gradients:
    `raw_norm_act` has the signature of `_ext.norm_act`, checked against
    central differences of the same function of x in float64."""
    from oracle import numeric_grad

    x = rng.standard_normal((11, 2))
    w, b = rng.uniform(0.5, 1.5, 2), rng.standard_normal(2)
    w32, b32 = mx.array(w.astype(np.float32)), mx.array(b.astype(np.float32))

    def f_np(xv):
        return (xv.mean(0) ** 2).sum() + (xv.var(0) * w).sum()

    def f_mx(xv):
        _, mean, var = raw_norm_act(xv, w32, b32, None, None, 1, None, None, 1e-5, 1, 0.0)
        return (mean**2).sum() + (var * w32).sum()

    g = mx.grad(f_mx)(mx.array(x.astype(np.float32)))
    np.testing.assert_allclose(to_np(g), numeric_grad(f_np, [x], 0), rtol=1e-3, atol=1e-4)


def voxel_cloud(rng, n: int, batches: int = 2, extent: int = 12) -> mx.array:
    """Unique int32 (batch, x, y, z) rows, coordinates in [-extent, extent),
    in random order (map builders must not rely on sorted input)."""
    pts = np.stack(
        [rng.integers(0, batches, n), *(rng.integers(-extent, extent, n) for _ in range(3))], 1
    )
    pts = np.unique(pts, axis=0)
    return mx.array(pts[rng.permutation(len(pts))].astype(np.int32))


def assert_same(a, b):
    """Equal arrays: shape, dtype and every element."""
    a, b = np.array(a), np.array(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def assert_same_across_threads(run, counts=(1, 2, 3)):
    """run() returns arrays; they must agree bit for bit at every thread
    count in `counts` (the library's count is restored after)."""
    before = ml.num_threads()
    results = []
    try:
        for t in counts:
            ml.set_num_threads(t)
            results.append([np.array(a) for a in run()])
    finally:
        ml.set_num_threads(before)
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_array_equal(a, b)
            assert a.tobytes() == b.tobytes()


@pytest.fixture
def on_cpu():
    """Run on the CPU backend (tests that assert CPU route names or threads)."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


@pytest.fixture
def on_gpu():
    """Run on the GPU backend (tests of the CUDA kernels)."""
    previous = mx.default_device()
    mx.set_default_device(mx.gpu)
    yield
    mx.set_default_device(previous)


# The CUDA tests run only where MLX's CUDA backend sees a GPU.
needs_cuda = pytest.mark.skipif(not cuda.available(), reason="needs MLX's CUDA backend and an NVIDIA GPU")


TOLERANCES = {
    mx.float32: dict(rtol=1e-4, atol=1e-4),
    mx.float16: dict(rtol=2e-2, atol=2e-2),
    mx.bfloat16: dict(rtol=6e-2, atol=6e-2),
}

# Metal programs (harness or GPU) against the float64 oracle: float16 rows
# are summed in float but stored in half, hence the wider absolute bound.
METAL_TOLERANCES = {
    mx.float32: dict(rtol=1e-4, atol=1e-4),
    mx.float16: dict(rtol=2e-2, atol=3e-2),
}
# CUDA routes against the float64 oracle: as the Metal programs, and
# bfloat16 wider still (8 mantissa bits).
CUDA_TOLERANCES = {**METAL_TOLERANCES, mx.bfloat16: dict(rtol=6e-2, atol=1.5e-1)}
# Single kernels against per-edge NumPy sums in the same precision.
METAL_KERNEL_TOLERANCES = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2e-3, atol=2e-2),
}


def cpu_kernel_sources() -> list[Path]:
    """The per-instruction-set kernel files, as CMakeLists.txt lists them
    (LATTICE_CPU_KERNELS), for the standalone kernel builds of the tests."""
    root = Path(__file__).resolve().parent.parent
    text = (root / "CMakeLists.txt").read_text()
    start = text.index("set(LATTICE_CPU_KERNELS")
    body = text[start + len("set(LATTICE_CPU_KERNELS"): text.index(")", start)]
    return [root / name for name in body.split()]


def float32_matmul_tolerance() -> dict:
    """Tolerance of float32 products computed by MLX ops (mx.matmul, nn.Linear).

    Those follow MLX's precision: on a CUDA GPU float32 matmuls run in TF32
    unless MLX_ENABLE_TF32=0 (docs/semantics.md). mlx_lattice's own routes
    accumulate in float32 everywhere and keep the tight bound.
    """
    tf32 = (
        mx.default_device().type == mx.gpu
        and getattr(mx, "cuda", None) is not None
        and mx.cuda.is_available()
        and os.environ.get("MLX_ENABLE_TF32", "1") != "0"
    )
    return dict(rtol=3e-3, atol=3e-3) if tf32 else dict(rtol=1e-5, atol=1e-5)


def pytest_configure(config):
    # MLX_LATTICE_TEST_DEVICE=gpu runs the whole suite with the GPU as the
    # default device (tests that need the CPU backend ask for it themselves).
    device = os.environ.get("MLX_LATTICE_TEST_DEVICE", "")
    if device not in ("", "cpu", "gpu"):
        raise ValueError(f"MLX_LATTICE_TEST_DEVICE must be 'cpu' or 'gpu', got {device!r}")
    if device:
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
    # Kernel coverage of the Metal harness (MLX_LATTICE_KERNEL_COVERAGE=<path>).
    # The harness lives beside the Metal tests, in tests/metal/.
    sys.path.insert(0, str(Path(__file__).parent / "metal"))
    from metal_harness import plugin

    config.pluginmanager.register(plugin, "mlx_lattice_metal_harness")
