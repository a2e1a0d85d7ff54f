// The shim as the strict pass (strict.py) compiles it with clang: the MSL
// address spaces become distinct address_space(N) qualifiers, so a pointer or
// reference cannot move between spaces without an explicit cast. `thread` is
// the default space. Where strict.py takes an object of class type out of
// its space (`device float4` -> `mh_class_device float4`: clang's C++ mode
// has no copy constructors or methods for objects in a named space), the
// mh_class_* words expand to nothing.
#pragma once

#define MH_STRICT 1
#include "mh/all.h"

#undef device
#undef constant
#undef thread
#undef threadgroup
#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define mh_class_device
#define mh_class_constant const
#define mh_class_object
#define mh_class_threadgroup
