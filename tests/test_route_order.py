"""The registry's order: within a backend, routes of equal priority are
taken in registration order (select keeps the first whose predicate holds),
so each backend's registration order is part of what a call selects."""

from mlx_lattice import routes

ORDER = {
    "cpu": [
        "cpu.pointwise", "cpu.gather_gemm", "cpu.row_gather", "cpu.wgrad_gemm", "cpu.quantized_gather_gemm",
        "cpu.grouped_gather", "cpu.grouped_wgrad", "cpu.hash_map", "cpu.knn", "cpu.radius",
    ],
    "metal": [
        "metal.pointwise", "metal.sorted_gemm", "metal.tensorops_sorted", "metal.dense_channel", "metal.cout16",
        "metal.csr_mma", "metal.tensorops_csr_mma", "metal.vec4", "metal.fp16_gather", "metal.fp32_atomic",
        "metal.fetch_on_demand", "metal.wgrad_direct", "metal.tensorops_dgrad", "metal.dgrad_dense_grouped",
        "metal.dgrad_dense_channel", "metal.tensorops_wgrad", "metal.wgrad_mma", "metal.tensorops_wgrad_mma",
        "metal.wgrad_dense_square", "metal.wgrad_cout16", "metal.wgrad_block4", "metal.wgrad_fp16",
        "metal.tensorops_quantized", "metal.sorted_quantized", "metal.quantized_fetch_on_demand",
        "metal.grouped_csr_mma", "metal.grouped_wgrad_mma", "metal.grouped_fetch_on_demand",
        "metal.grouped_wgrad", "metal.hash_map", "metal.knn", "metal.radius",
    ],
    "cuda": [
        "cuda.grouped_fetch_on_demand", "cuda.grouped_wgrad", "cuda.pointwise_mma", "cuda.pointwise",
        "cuda.sorted_mma", "cuda.fetch_on_demand", "cuda.pointwise_wgrad_mma", "cuda.pointwise_wgrad",
        "cuda.wgrad_mma", "cuda.wgrad_direct", "cuda.hash_map", "cuda.knn", "cuda.radius",
    ],
}


def test_each_backend_registers_its_routes_in_this_order():
    for backend, names in ORDER.items():
        assert [n for n, r in routes._REGISTRY.items() if r.backend == backend] == names, backend


def test_selection_order_within_a_backend_is_priority_then_registration():
    for backend, names in ORDER.items():
        ranked = sorted(names, key=lambda n: -routes.get(n).priority)  # stable: ties keep registration order
        assert [r.name for r in routes._ordered(backend)] == ranked, backend


def test_the_registry_holds_the_backends_routes_backend_after_backend():
    # each backend's module registers its own (mlx_lattice/backends/<backend>_routes.py),
    # loaded by the package in this order
    assert list(routes._REGISTRY) == ORDER["cpu"] + ORDER["metal"] + ORDER["cuda"]
