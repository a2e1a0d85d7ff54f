// metal/lattice_keys.h as the host (C++) or, with -D__CUDACC_RTC__
// -D__device__=, the CUDA branch compiles it: reads rows "b x y z" from
// stdin and prints "in_range key hash b x y z" (the key unpacked) per row,
// as probe.metal computes them (tests/test_lattice_keys.py).
#include "../../metal/lattice_keys.h"

#include <cstdio>

using namespace mlx_lattice;

#if !defined(__CUDACC_RTC__)
// The host branch is constexpr: the packing is checked at compile time too.
static_assert(pack_key(0, kCoordMin, kCoordMin, kCoordMin) == 0, "the smallest key is 0");
static_assert(unpack_axis(pack_key(3, -1, 0, 1), 0) == -1, "x round-trips");
#endif

int main() {
  long long b, x, y, z;
  while (std::scanf("%lld %lld %lld %lld", &b, &x, &y, &z) == 4) {
    const bool ok = in_range(b, x, y, z);
    const lattice_u64 key = ok ? pack_key(b, x, y, z) : kEmptyKey;
    std::printf(
        "%d %llu %llu %d %d %d %d\n", ok ? 1 : 0, (unsigned long long)key,
        (unsigned long long)key_hash(key), unpack_batch(key), unpack_axis(key, 0),
        unpack_axis(key, 1), unpack_axis(key, 2));
  }
  return 0;
}
