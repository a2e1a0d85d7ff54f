// Each unit is compiled on its own, with no unity batch and no precompiled
// header to lend it includes: a Metal host file that calls into another of
// the project's headers must include it (metal::run is declared in
// metal/program.h, which relation.h does not include).
#include "core/relation.h"
#if MACBUILD_BAD != 1
#include "metal/program.h"
#endif

void encode(mlx::core::array& out, mlx::core::Stream s) {
  mlx_lattice::metal::run({}, {}, out, s); // MACBUILD-ERROR 1
}
