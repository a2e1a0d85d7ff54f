// Python module mlx_lattice._ext: each area's names come from its file in
// src/bindings/ (bindings.h lists them).
#include "bindings/bindings.h"
#include "cpu/allocator.h"
#include "cpu/isa.h"

NB_MODULE(_ext, m) {
  using namespace mlx_lattice;
  m.doc() = "mlx_lattice native core";

  // Heap settings for MLX's malloc-based CPU allocator, before the module
  // allocates anything (src/cpu/allocator.h).
  cpu::tune_malloc_from_env();
  // CPU instruction-set path: chosen here, at load, from the CPU or
  // MLX_LATTICE_CPU_ISA (an unsupported name fails the import).
  cpu::select_cpu_isa_from_env();

  init_cpu(m);
  init_maps(m);
  init_conv(m);
  init_autodiff(m);
  init_norm(m);
  init_feature_ops(m);
  init_optim(m);
  init_attention(m);
  init_neighbors(m);
  init_metal(m);
}
