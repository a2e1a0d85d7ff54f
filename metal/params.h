// Kernel parameters, defined once for both sides: the kernels in metal/
// include this file, and so does the host code in src/metal/ that fills
// them (src/metal/program.h). Plain 32-bit ints only, so the layout is the
// same in MSL and C++.
#pragma once

// Convolution products (GatherConv and its routes).
struct ConvParams {
  int rows;      // output rows of this product
  int a;         // input channels
  int b;         // output channels
  int pointwise; // 1: row r reads row r at offset 0 (no relation)
  int k;         // kernel volume
  int n_in;      // rows of x
  int n_tiles;   // tiles of the sorted plan
  int edges;     // edge count
};

// Weight gradients (WeightGrad).
struct WeightGradParams {
  int k;
  int a;
  int b;
  int pointwise_rows; // rows of a pointwise product; -1 with a relation
};

// Grouped products (metal/grouped.metal) and the matrix-unit products of
// metal/csr_mma.metal, grouped or not (ag = a, bg = b): W is (K, ag, b);
// output channel c reads input channels [(c / bg) * ag, ...) of x's a.
struct GroupedParams {
  int rows;           // output rows (convolution) or kernel volume (gradient)
  int a;              // input channels (all groups)
  int b;              // output channels (all groups)
  int ag;             // input channels per group
  int bg;             // output channels per group
  int pointwise_rows; // rows of a pointwise product; -1 with a relation
};

// Partitioned weight gradient (TensorOps): partitions per offset.
struct WeightGradPartsParams {
  int k;
  int a;
  int b;
  int parts; // partitions per offset
};

// Matrix-unit weight gradient (metal/wgrad_mma.metal): the fields of
// WeightGradPartsParams (its reduction step's: dW is (k, a, b)), then the
// rows of a pointwise product and the channel groups (x has a * groups
// channels; dW's output channels [j * b / groups, ...) read group j's).
struct WeightGradMmaParams {
  int k;
  int a;              // input channels per group (rows of dW[k])
  int b;              // output channels, all groups
  int parts;          // partitions per offset (1: dW written directly)
  int pointwise_rows; // rows of a pointwise product; -1 with a relation
  int groups;         // channel groups (1: an ungrouped product)
};

// Quantized convolution (QuantizedConv); metal/quant_params.h has the
// kernels' code and weight readers.
struct QuantParams {
  int rows;      // output rows of this product
  int a;         // input channels
  int b;         // output channels
  int pointwise; // 1: row r reads row r at offset 0 (no relation)
  int k;         // kernel volume
  int n_in;      // rows of x
  int n_tiles;   // tiles of the sorted plan
  int edges;     // edge count
  int bits;      // 4 or 8
  int group;     // input channels per scale/bias
};

// Map building (metal/map_build.metal): the sizes its steps work in (the
// coordinate range is metal/lattice_keys.h's).
enum MapLimits : int {
  MAP_SCAN_THREADS = 1024, // threads of the scan step
  MAP_SORT_BLOCK = 1024,   // keys a threadgroup sorts in shared memory
  MAP_PLAN_TILE = 64,      // rows per tile mask of the sorted plan
};

// Map building: a relation between input and output coordinates through a
// kernel (conv form q*s - p + dil*d, or the transposed form).
struct MapParams {
  int n_in;       // input coordinates (rows of the table)
  int n_out;      // output coordinates (rows of the relation)
  int mask;       // table slots - 1 (a power of two minus one)
  int kv;         // kernel volume
  int transposed; // 1: v = (q + p - dil*d) / s where divisible
  int edges;      // edge count (the fill step; 0 before it is known)
  int size[3];
  int stride[3];
  int padding[3];
  int dilation[3];
};

// Map building: one step of a sort over `count` (key, value) elements (an
// output support's candidates, or the sorted plan's rows; map: the kernel
// and rows), padded to `padded` (a power of two, at least MAP_SORT_BLOCK)
// for the bitonic network; stage k, step j; the elements start at word
// `base` of their buffer.
struct MapSortParams {
  MapParams map;
  int count;
  int padded;
  int k;
  int j;
  int base;
};
