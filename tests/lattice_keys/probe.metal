// metal/lattice_keys.h as the Metal kernels compile it: per coordinate row
// (b, x, y, z), whether it is in range, its key (kEmptyKey when not), the
// key's hash and the key unpacked. tests/test_lattice_keys.py compares them
// with the C++ and CUDA builds of the same header.
#include <metal_stdlib>

#include "../../metal/lattice_keys.h"

using namespace metal;
using namespace mlx_lattice;

[[kernel]] void lattice_keys_probe(
    device const int* coords [[buffer(0)]],
    device int* in_ranges [[buffer(1)]],
    device ulong* keys [[buffer(2)]],
    device ulong* hashes [[buffer(3)]],
    device int* unpacked [[buffer(4)]],
    constant int& n [[buffer(5)]],
    uint tid [[thread_position_in_grid]]) {
  const int i = int(tid);
  if (i >= n) {
    return;
  }
  device const int* c = coords + 4 * i;
  const bool ok = in_range(c[0], c[1], c[2], c[3]);
  const ulong key = ok ? pack_key(c[0], c[1], c[2], c[3]) : kEmptyKey;
  in_ranges[i] = ok ? 1 : 0;
  keys[i] = key;
  hashes[i] = key_hash(key);
  unpacked[4 * i] = unpack_batch(key);
  for (int a = 0; a < 3; ++a) {
    unpacked[4 * i + 1 + a] = unpack_axis(key, a);
  }
}
