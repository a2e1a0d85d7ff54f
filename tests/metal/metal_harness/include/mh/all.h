// The MSL shim: everything <metal_stdlib> provides to our kernels, then the
// address-space words as empty macros (kept last so the shim itself can use
// any identifier).
#pragma once

#include "mh/types.h"
#include "mh/vec.h"
#include "mh/math.h"
#include "mh/matrix.h"
#include "mh/atomic.h"
#include "mh/simd.h"
#include "mh/bind.h"
#include "mh/tensor.h"
#include "mh/logging.h"

namespace mh {
// Storage for a `threadgroup` variable; the source pre-pass rewrites
//   threadgroup T name[N];   into   auto& name = *::mh::tg_var<T[N]>(id, "name");
template <class A>
inline A* tg_var(int id, const char* name) {
  return static_cast<A*>(rt_tg_var(id, sizeof(A), alignof(A), name));
}
} // namespace mh

#define METAL_FUNC inline __attribute__((__always_inline__))
#define METAL_CONST constexpr constant
#define device
// Constant memory is read-only: source.py spells `constant T` as const T
// (a `const constant int&` binds to a `constant int&` parameter, as in MLX's
// quantized.h); g++ takes no duplicate const, so the word goes where there
// is one.
#define constant
#define thread
#define threadgroup
#define threadgroup_imageblock
#define ray_data
#define object_data
#define kernel
