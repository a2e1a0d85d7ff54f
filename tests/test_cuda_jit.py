"""The CUDA kernels' on-disk cache (mlx_lattice/backends/cuda/jit.py): what it
compiles, and where it keeps it. Compiling and launching need a GPU
(tests/test_cuda*.py run them there); these check the parts that do not."""

import mlx.core as mx

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
