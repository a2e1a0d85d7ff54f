// MLX's own Metal API, from the macOS wheel's headers: a buffer is not an
// array, and a dispatch takes the grid and the threadgroup.
#include "mlx/backend/metal/device.h"

namespace mx = mlx::core;

void encode(mx::Stream s, const mx::array& x, mx::array& y, MTL::Buffer* buf) {
  auto& enc = mx::metal::get_command_encoder(s);
  const int n = 3;
  (void)buf;
#if MACBUILD_BAD == 1
  enc.set_input_array(buf, 0); // MACBUILD-ERROR 1
#else
  enc.set_input_array(x, 0);
#endif
  enc.set_output_array(y, 1);
  enc.set_bytes(n, 2);
#if MACBUILD_BAD == 2
  enc.dispatch_threadgroups(MTL::Size(1, 1, 1)); // MACBUILD-ERROR 2
#else
  enc.dispatch_threadgroups(MTL::Size(1, 1, 1), MTL::Size(32, 1, 1));
#endif
}
