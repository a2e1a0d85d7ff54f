// Parameters of the neighbour-query kernels (metal/neighbors.metal), shared
// with the host programs (src/metal/neighbors.cpp): 32-bit fields only.
#pragma once

struct NeighborParams {
  int n_query;       // query points
  int n_points;      // reference points
  int n_batch;       // batch items of the grid (largest point batch + 1)
  int dims[3];       // cells per axis, per batch item
  int n_cells;       // n_batch * dims[0] * dims[1] * dims[2]
  int exact;         // 1: integral coordinates, squared distances in 64-bit integers
  int k;             // knn: neighbours wanted; radius: most kept (0: all)
  int r2_lo;         // exact radius: floor(radius^2) as a 64-bit integer,
  int r2_hi;         //   low and high words
  float origin[3];   // lowest reference coordinate per axis
  float inv_cell;    // 1 / cell side
  float cell;        // cell side
  float radius;      // radius (0 for knn)
  float r2;          // float radius: radius^2 rounded to float
};
