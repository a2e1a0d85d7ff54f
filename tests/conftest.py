import zlib

import numpy as np
import pytest
import mlx.core as mx


@pytest.fixture
def rng(request):
    # A stable seed per test (crc32, not hash(): that is salted per process),
    # so failures reproduce in isolation and across runs.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def to_np(a) -> np.ndarray:
    """mx.array (any float dtype) -> float64 NumPy."""
    return np.array(a.astype(mx.float32)).astype(np.float64)


@pytest.fixture
def on_cpu():
    """Run on the CPU backend (tests that assert CPU route names or threads)."""
    previous = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(previous)


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
# Single kernels against per-edge NumPy sums in the same precision.
METAL_KERNEL_TOLERANCES = {
    mx.float32: dict(rtol=1e-5, atol=1e-5),
    mx.float16: dict(rtol=2e-3, atol=2e-2),
}


def pytest_configure(config):
    # Kernel coverage of the Metal harness (MLX_LATTICE_KERNEL_COVERAGE=<path>).
    from metal_harness import plugin

    config.pluginmanager.register(plugin, "mlx_lattice_metal_harness")
