// Valid neighbour of threadgroup_allocations.metal for the strict pass (test_metal_strict.py):
// 31 allocations; Apple's compiler accepts it, and so must the pass.
#include <metal_stdlib>
using namespace metal;

kernel void planted(device int* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {
  threadgroup int v0;
  threadgroup int v1;
  threadgroup int v2;
  threadgroup int v3;
  threadgroup int v4;
  threadgroup int v5;
  threadgroup int v6;
  threadgroup int v7;
  threadgroup int v8;
  threadgroup int v9;
  threadgroup int v10;
  threadgroup int v11;
  threadgroup int v12;
  threadgroup int v13;
  threadgroup int v14;
  threadgroup int v15;
  threadgroup int v16;
  threadgroup int v17;
  threadgroup int v18;
  threadgroup int v19;
  threadgroup int v20;
  threadgroup int v21;
  threadgroup int v22;
  threadgroup int v23;
  threadgroup int v24;
  threadgroup int v25;
  threadgroup int v26;
  threadgroup int v27;
  threadgroup int v28;
  threadgroup int v29;
  threadgroup int v30;
  if (t == 0) {
    v0 = 0; v1 = 1; v2 = 2; v3 = 3; v4 = 4; v5 = 5; v6 = 6; v7 = 7; v8 = 8; v9 = 9; v10 = 10; v11 = 11; v12 = 12; v13 = 13; v14 = 14; v15 = 15; v16 = 16; v17 = 17; v18 = 18; v19 = 19; v20 = 20; v21 = 21; v22 = 22; v23 = 23; v24 = 24; v25 = 25; v26 = 26; v27 = 27; v28 = 28; v29 = 29; v30 = 30;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = v0 + v1 + v2 + v3 + v4 + v5 + v6 + v7 + v8 + v9 + v10 + v11 + v12 + v13 + v14 + v15 + v16 + v17 + v18 + v19 + v20 + v21 + v22 + v23 + v24 + v25 + v26 + v27 + v28 + v29 + v30;
}
