// macOS's own APIs at the deployment target: the SDK headers mark each
// function with the release that brought it. __sqrtf16 (half-precision
// square root, <math.h>) arrived in macOS 15.0; a build for macOS 14 may
// use the float one.
#include <math.h>

_Float16 root(_Float16 x) {
#if MACBUILD_BAD == 1
  return __sqrtf16(x); // MACBUILD-ERROR 1
#else
  return static_cast<_Float16>(sqrtf(static_cast<float>(x)));
#endif
}
