// MSL's named constants (<metal_math>'s HALF_* and M_*_F), shared by both
// front ends' shims (math.h for the executor and the C++ pass, opencl.h for
// the OpenCL pass). Macros: `half` is whichever type the including shim has.
#pragma once

#define HALF_MAX (half(65504.0f))
#define HALF_MIN (half(6.103515625e-05f))
#define HALF_EPSILON (half(0.0009765625f))
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
