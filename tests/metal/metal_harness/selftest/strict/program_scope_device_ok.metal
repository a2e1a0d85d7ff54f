// Valid neighbour of program_scope_device.metal for the strict pass (test_metal_strict.py):
// a constant at program scope; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

constant int counter = 0;

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = counter;
}
