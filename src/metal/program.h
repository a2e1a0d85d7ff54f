// Metal programs: the kernels, dispatch shapes and buffer bindings that
// eval_gpu encodes for a route. The test harness reads the same programs
// (through _ext.metal_program) and runs them on the CPU, so it exercises
// exactly what a Mac runs.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace mlx_lattice {
class Relation;
}

namespace mlx_lattice::metal {

namespace mx = mlx::core;

// Parameters of every convolution kernel (layout shared with metal/*.metal).
struct ConvParams {
  int32_t rows;     // output rows of this product
  int32_t a;        // input channels
  int32_t b;        // output channels
  int32_t identity; // 1: pointwise (row r reads row r, offset 0)
  int32_t k;        // kernel volume
  int32_t n_in;     // rows of x
  int32_t n_tiles;  // sorted plan tiles
  int32_t edges;    // edge count
};

struct WeightGradParams {
  int32_t k;
  int32_t a;
  int32_t b;
  int32_t pointwise_rows; // rows of a pointwise product; -1 with a relation
};

// Parameters of the quantized kernels (metal/quant_params.h).
struct QuantParams {
  int32_t rows;
  int32_t a;
  int32_t b;
  int32_t identity;
  int32_t k;
  int32_t n_in;
  int32_t n_tiles;
  int32_t edges;
  int32_t bits;
  int32_t group;
};

// Partitioned weight gradient (TensorOps): partitions per offset.
struct WeightGradPartsParams {
  int32_t k;
  int32_t a;
  int32_t b;
  int32_t parts;
};

struct Binding {
  enum class Kind { Input, Output, Temp, Bytes };
  Kind kind;
  int index = 0;              // input or temporary index
  std::vector<uint8_t> bytes; // Kind::Bytes
  std::string name;
};

struct Step {
  std::string kernel;
  std::array<uint64_t, 3> groups{1, 1, 1};  // threadgroups per grid
  std::array<uint64_t, 3> threads{1, 1, 1}; // threads per threadgroup
  std::vector<Binding> buffers;             // position = buffer index
};

struct Temp {
  mx::Dtype dtype;
  int64_t size;
};

struct Program {
  std::vector<Temp> temps;
  std::vector<Step> steps;
};

// Route-specific arrays a route needs besides (x, w, offsets, gather, k).
std::vector<mx::array> extra_inputs(
    const std::string& route,
    const std::shared_ptr<Relation>& rel,
    int view);

// Programs for the GatherConv and WeightGrad primitives, given exactly the
// primitive's inputs and output.
Program conv_program(
    const std::string& route,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype);
Program weight_grad_program(
    const std::string& route,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype);

// Program for QuantizedConv: inputs (x, codes, scales, biases as float32
// [, offsets, gather, k, extra inputs]); bits and group size follow from
// the shapes.
Program quantized_program(
    const std::string& route,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype);

std::string type_name(mx::Dtype dt);

// True when this build can run Metal kernels.
bool available();

// True when this build has the Metal 4 TensorOps kernels
// (mlx_lattice_tensorops.metallib).
bool tensor_ops_kernels();

// Encodes a program on the stream (Metal builds only).
void run(
    const Program& program,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    mx::Stream s);

} // namespace mlx_lattice::metal
