// Packed coordinate keys and their table hash, defined once for the C++
// host code (src/core/), the Metal kernels (metal/map_build.metal) and the
// CUDA kernels, which prepend this text (_ext.lattice_keys_source()) to
// their NVRTC sources. Keys order as (b, x, y, z) do, so sorted keys are
// sorted coordinates, and every backend's tables, supports and relations
// agree element for element.
//
// The same text compiles as C++, as Metal Shading Language and as CUDA:
// only the function qualifier, the constants' address space and the 64-bit
// integer spellings differ (MSL's long is 64 bits and it has no long long
// and no standard headers). Include guards, not #pragma once, so that the
// text can be prepended to a source.
#ifndef MLX_LATTICE_LATTICE_KEYS_H
#define MLX_LATTICE_LATTICE_KEYS_H

#if defined(__METAL_VERSION__)
#define LATTICE_KEYS_FN inline
#define LATTICE_KEYS_CONST constant
typedef ulong lattice_u64;
typedef long lattice_i64;
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LATTICE_KEYS_FN __device__ inline
#define LATTICE_KEYS_CONST constexpr
typedef unsigned long long lattice_u64;
typedef long long lattice_i64;
#else
#include <cstdint>
#define LATTICE_KEYS_FN constexpr inline
#define LATTICE_KEYS_CONST constexpr
typedef uint64_t lattice_u64;
typedef int64_t lattice_i64;
#endif

namespace mlx_lattice {

// Coordinate range: batch in [0, 4096) (12 bits), x/y/z in [-65536, 65535]
// (17 bits each, stored as offsets from kCoordMin).
LATTICE_KEYS_CONST lattice_i64 kBatchLimit = 4096;
LATTICE_KEYS_CONST lattice_i64 kCoordMin = -65536;
LATTICE_KEYS_CONST lattice_i64 kCoordMax = 65535;
// No coordinate in range packs to it (its batch field reads 8191): marks
// empty slots and invalid candidates, and sorts after every coordinate.
LATTICE_KEYS_CONST lattice_u64 kEmptyKey = ~lattice_u64(0);

LATTICE_KEYS_FN bool coord_in_range(lattice_i64 v) {
  return v >= kCoordMin && v <= kCoordMax;
}

LATTICE_KEYS_FN bool batch_in_range(lattice_i64 b) {
  return b >= 0 && b < kBatchLimit;
}

LATTICE_KEYS_FN bool in_range(lattice_i64 b, lattice_i64 x, lattice_i64 y, lattice_i64 z) {
  return batch_in_range(b) && coord_in_range(x) && coord_in_range(y) && coord_in_range(z);
}

// A key is key_batch(b) + key_axis(0, x) + key_axis(1, y) + key_axis(2, z):
// batch in bits 51..62, x in 34..50, y in 17..33, z in 0..16. The parts
// occupy disjoint bits, so a builder may add them one axis at a time.
LATTICE_KEYS_FN lattice_u64 key_batch(lattice_i64 b) {
  return lattice_u64(b) << 51;
}

LATTICE_KEYS_FN lattice_u64 key_axis(int a, lattice_i64 v) {
  return lattice_u64(v - kCoordMin) << (34 - 17 * a);
}

LATTICE_KEYS_FN lattice_u64 pack_key(lattice_i64 b, lattice_i64 x, lattice_i64 y, lattice_i64 z) {
  return key_batch(b) | key_axis(0, x) | key_axis(1, y) | key_axis(2, z);
}

LATTICE_KEYS_FN int unpack_batch(lattice_u64 key) {
  return int(key >> 51);
}

// Coordinate a (0: x, 1: y, 2: z) of a key.
LATTICE_KEYS_FN int unpack_axis(lattice_u64 key, int a) {
  return int(lattice_i64((key >> (34 - 17 * a)) & 0x1ffff) + kCoordMin);
}

// The bits of a key above its two lowest, mixed (a 64-bit finaliser).
LATTICE_KEYS_FN lattice_u64 key_mix(lattice_u64 key) {
  lattice_u64 x = key >> 2;
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44d;
  x ^= x >> 33;
  return x;
}

// Table hash: runs of 4 voxels along z hash to 4 consecutive slots (one
// cache line of 16-byte slots on the CPU), so a row's z-neighbours usually
// share a line; the rest of the key is mixed so that runs spread evenly.
LATTICE_KEYS_FN lattice_u64 key_hash(lattice_u64 key) {
  return (key_mix(key) << 2) | (key & 3);
}

} // namespace mlx_lattice

#endif
