// Valid for the strict pass (test_metal_strict.py): a function as a template
// argument through a function-pointer alias (MLX's FFT passes its radix
// codelets so), resolved at compile time; no pointer to a function is made
// at run time. Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

template <typename T>
using Codelet = void (*)(thread T*, thread T*);

template <typename T>
void negate(thread T* x, thread T* y) {
  y[0] = -x[0];
}

template <typename T, Codelet<T> codelet>
void apply(thread T* x, thread T* y) {
  codelet(x, y);
}

kernel void planted(device float2* v [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float2 x = v[i];
  float2 y;
  apply<float2, negate<float2>>(&x, &y);
  v[i] = y + 0.5 * x;
}
