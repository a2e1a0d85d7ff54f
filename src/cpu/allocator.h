// Heap settings for the CPU backend. MLX's CPU allocator is malloc; with
// glibc's defaults, the buffers a training step frees at its end go back to
// the kernel, and the next step faults them in again (zero-filled page by
// page). At load the extension keeps them in the heap instead, unless the
// user configured malloc or set MLX_LATTICE_MALLOC_TUNING=0.
#pragma once

#include <string>

namespace mlx_lattice::cpu {

// Applies the settings (once, at load) or records why not; raises
// std::invalid_argument for an MLX_LATTICE_MALLOC_TUNING other than 0 / 1.
void tune_malloc_from_env();

// What tune_malloc_from_env did, in words (doctor prints it).
const std::string& malloc_tuning();

} // namespace mlx_lattice::cpu
