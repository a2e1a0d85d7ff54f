// Parameters shared by the convolution kernels; the same layout as
// ConvParams in src/metal/program.h.
#pragma once

struct ConvParams {
  int rows;     // output rows of this product
  int a;        // input channels
  int b;        // output channels
  int identity; // 1: pointwise (row r reads row r at offset 0)
  int k;        // kernel volume
  int n_in;     // rows of x
  int n_tiles;  // tiles of the sorted plan
  int edges;    // edge count
};
