// Planted defect for the strict pass (test_metal_strict.py): a program-scope
// variable in device memory (MSL 4.2: program-scope variables are constant).
#include <metal_stdlib>
using namespace metal;

device int counter = 0; // defect

kernel void planted(device int* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  y[i] = counter;
}
