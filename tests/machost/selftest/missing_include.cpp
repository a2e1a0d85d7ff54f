// A Metal host file that calls into another of the project's headers must
// include it: metal::run is declared in metal/program.h, which relation.h
// does not include.
#include "core/relation.h"
#if MACHOST_BAD != 1
#include "metal/program.h"
#endif

void encode(mlx::core::array& out, mlx::core::Stream s) {
  mlx_lattice::metal::run({}, {}, out, s); // MACHOST-ERROR 1
}
