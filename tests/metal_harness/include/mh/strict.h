// The shim as the strict pass (strict.py) compiles it with clang: the MSL
// address spaces become distinct address_space(N) qualifiers, so a pointer or
// reference cannot move between spaces without an explicit cast. `thread` is
// the default space. Objects of class type keep no space here (strict.py
// rewrites `device float4` to `mh_class_device float4`): clang's C++ mode has
// no address-space-qualified member functions or copy constructors.
#pragma once

#define MH_STRICT 1
#include "mh/all.h"

#undef device
#undef constant
#undef thread
#undef threadgroup
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define mh_class_device
#define mh_class_constant
#define mh_class_threadgroup
