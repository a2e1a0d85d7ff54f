// The CPU backend's settings: heap tuning, threads and the instruction-set
// path of the kernels.
#include "bindings/bindings.h"
#include "core/threadpool.h"
#include "cpu/allocator.h"
#include "cpu/isa.h"

using namespace nanobind::literals;

namespace mlx_lattice {

void init_cpu(nb::module_& m) {
  m.def("malloc_tuning", &cpu::malloc_tuning);
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.def("cpu_isa", &cpu::cpu_isa);
  m.def("supported_cpu_isas", &cpu::supported_isas);
  m.def("built_cpu_isas", &cpu::built_isas);
  m.def("set_cpu_isa", &cpu::set_cpu_isa, "name"_a);
  // "native" (the x86-64 paths the building machine runs) or "all"
  // (cmake/cpu_paths.cmake).
  m.attr("CPU_PATHS_BUILT") = LATTICE_CPU_PATHS_BUILT;
#if defined(MLX_LATTICE_NATIVE)
  m.attr("CPU_NATIVE_BUILD") = true;
#else
  m.attr("CPU_NATIVE_BUILD") = false;
#endif
}

} // namespace mlx_lattice
