// Parameters of the normalisation kernels (metal/norm_act.metal), shared
// with the host programs (src/metal/norm_act.cpp): 32-bit fields only.
#pragma once

// Threads of the merge steps (one threadgroup per channel, or per
// (channel, segment)); block partials are merged in a fixed tree.
enum NormLimits : int {
  NORM_MERGE_THREADS = 64,
  NORM_BLOCK_ROWS = 256, // rows per block of the partial passes (times
                         // ceil(segments / NORM_SEGMENTS_PER_BLOCK))
  NORM_SEGMENTS_PER_BLOCK = 8,
  NORM_TILE_THREADS = 256, // threads of a (channels x rows) tile
  NORM_MAX_ROW_GROUPS = 65535, // row threadgroups of an elementwise pass
};

struct NormParams {
  int rows;       // N
  int channels;   // C
  int segments;   // S: statistics groups (1: batch norm)
  int segmented;  // 1: segment ids are bound (else every row is segment 0)
  int residual;   // forward: a residual is added before the activation;
                  // backward: act' is read from y's sign and g is written
  int training;   // 1: batch statistics (forward: written; backward: their
                  // cotangents are bound)
  int block_rows; // rows per block of the partial passes
  int blocks;     // ceil(rows / block_rows)
  int tile_c;     // channels per tile (threads along x), a power of two <= 32
  float low;      // the activation: y = z > 0 ? z : low * z
  float eps;
};
