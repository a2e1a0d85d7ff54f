// Accepted by the strict pass (test_metal_strict.py): bfloat values read
// from and written to device memory, directly and through a template
// parameter, which MSL allows (bfloat is a scalar there; the shim's is a
// class, whose methods clang's C++ mode refuses on objects in a named space).
#include <metal_stdlib>
using namespace metal;

template <typename T>
[[kernel]] void scale_rows(
    device const T* x [[buffer(0)]],
    device T* y [[buffer(1)]],
    device bfloat* z [[buffer(2)]],
    uint i [[thread_position_in_grid]]) {
  const float v = float(x[i]) * 2.0f;
  y[i] = T(v);
  z[i] = bfloat(float(z[i]) + v);
}

template [[host_name("scale_rows_bfloat16")]] [[kernel]] decltype(scale_rows<bfloat>) scale_rows<bfloat>;
