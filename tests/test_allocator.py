"""Heap settings applied at load (src/cpu/allocator.cpp): on glibc, freed
buffers stay in the heap, so repeated steps stop faulting their pages in."""

import os
import subprocess
import sys

import pytest
import mlx.core as mx

from mlx_lattice import _ext



def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


GLIBC = _glibc()

USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in USER_VARS + ("GLIBC_TUNABLES", "MLX_LATTICE_MALLOC_TUNING")}
    env.update(extra)
    return env


def _run(code, **extra):
    return subprocess.run([sys.executable, "-c", code], env=_env(**extra), capture_output=True, text=True)


STATUS = "from mlx_lattice import _ext; print(_ext.malloc_tuning())"

# Page faults of three rounds of six fresh 20 MiB arrays, after a first round
# (MLX's CPU allocator is malloc): the pages of the first round are reused
# when freed memory stays in the heap, and faulted in again when it is
# returned to the kernel. The arrays live on the CPU whatever the machine's
# default device (with a GPU, MLX would put them in GPU memory).
FAULTS = """
import resource
import mlx.core as mx
import mlx_lattice

mx.set_default_device(mx.cpu)

def round_():
    arrays = [mx.full((5 << 20,), float(i)) for i in range(6)]
    mx.eval(arrays)
    mx.synchronize()
    del arrays
    mx.synchronize()

round_()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


@pytest.mark.skipif(not GLIBC, reason="the heap settings are glibc's (mallopt)")
@pytest.mark.skipif(getattr(mx, "cuda", None) is not None and mx.cuda.is_available(),
                    reason="with MLX's CUDA backend every array, CPU ones too, comes from MLX's CUDA "
                           "allocator, not malloc: the heap settings do not apply")
def test_default_keeps_freed_memory():
    out = _run(STATUS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("glibc: blocks up to 32 MiB from the heap")
    tuned = _run(FAULTS)
    plain = _run(FAULTS, MLX_LATTICE_MALLOC_TUNING="0")
    assert tuned.returncode == 0 and plain.returncode == 0, tuned.stderr + plain.stderr
    pages = 3 * 6 * (20 << 20) // 4096
    assert int(plain.stdout) > pages // 2, plain.stdout
    assert int(tuned.stdout) < pages // 20, tuned.stdout


@pytest.mark.skipif(not GLIBC, reason="the heap settings are glibc's (mallopt)")
@pytest.mark.parametrize("var", USER_VARS + ("GLIBC_TUNABLES",))
def test_user_malloc_settings_are_left_alone(var):
    value = "glibc.malloc.trim_threshold=1048576" if var == "GLIBC_TUNABLES" else "1048576"
    out = _run(STATUS, **{var: value})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("left as configured (")
    assert ("GLIBC_TUNABLES" if var == "GLIBC_TUNABLES" else var) in out.stdout


@pytest.mark.skipif(not GLIBC, reason="the heap settings are glibc's (mallopt)")
def test_other_tunables_do_not_count_as_malloc_settings():
    out = _run(STATUS, GLIBC_TUNABLES="glibc.pthread.rseq=0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("glibc: ")


def test_opt_out_and_bad_value():
    out = _run(STATUS, MLX_LATTICE_MALLOC_TUNING="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "off (MLX_LATTICE_MALLOC_TUNING=0)"
    out = _run(STATUS, MLX_LATTICE_MALLOC_TUNING="yes")
    assert out.returncode != 0
    assert "MLX_LATTICE_MALLOC_TUNING=yes: expected 0 or 1" in out.stderr


def test_status_in_process():
    assert isinstance(_ext.malloc_tuning(), str) and _ext.malloc_tuning()
    if not GLIBC:
        assert _ext.malloc_tuning() in ("not applied (not glibc)", "off (MLX_LATTICE_MALLOC_TUNING=0)")


@pytest.mark.skipif(not GLIBC, reason="the heap settings are glibc's (mallopt)")
def test_huge_page_tunable_combines_with_the_thresholds():
    out = _run(STATUS, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("glibc: blocks up to 32 MiB from the heap")
    assert out.stdout.strip().endswith("transparent huge pages for the heap (glibc.malloc.hugetlb=1)")
    out = _run(STATUS, GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
    assert "huge pages" not in out.stdout and out.stdout.startswith("glibc: ")
    # another malloc tunable beside it still leaves the heap as configured
    out = _run(STATUS, GLIBC_TUNABLES="glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0")
    assert out.stdout.strip().startswith("left as configured (GLIBC_TUNABLES")
