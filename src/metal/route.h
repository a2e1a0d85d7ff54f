// Metal route tables: one entry per route, named as in mlx_lattice/routes.py,
// holding everything that route needs: the arrays it reads besides the
// relation view, the checks its kernels assume, and its program. Entries sit
// in src/metal/<family>.cpp beside the kernels they launch in
// metal/<family>.metal.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/relation.h"
#include "core/route_table.h"
#include "metal/program.h"

namespace mlx_lattice::metal {

// What a program is built from: exactly the primitive's inputs and output.
struct Call {
  const std::string& route;
  const std::vector<mx::array>& in;
  const mx::Shape& out_shape;
  mx::Dtype out_dtype;
  std::string dt; // type_name(out_dtype): the kernels' dtype suffix
  int groups = 1; // channel groups of a grouped product (the primitive's)

  // The route's name without "metal.": the stem of its kernels' host names.
  std::string stem() const;
  // Raises "<route> needs <what>" unless ok: a kernel's assumptions.
  void require(bool ok, const char* what) const;
};

struct Route {
  const char* name;
  Op op; // the primitive that runs it
  ExtraInputs extra_inputs; // nullptr: none
  Program (*program)(const Call& call);
  bool grouped = false; // see RouteEntry::grouped
};

// ----------------------------------------- shared by the family tables

// Channel counts the compile-time-channel kernels are instantiated for.
inline bool dense_channels(int c) {
  return c == 16 || c == 32 || c == 64;
}

// Convolution products: (x, w[, offsets, gather, k, extra...]).
bool conv_pointwise(const Call& c);
ConvParams conv_params(const Call& c);
// (x, w, offsets, gather, k, y); a pointwise product binds x in place of
// the index buffers, never read.
std::vector<Binding> csr_bindings(bool pointwise);

// Weight gradients: (x, ct[, offsets, g, r]).
bool weight_grad_pointwise(const Call& c);
WeightGradParams weight_grad_params(const Call& c);
// (x, ct, offsets, g, r), index buffers replaced by x when pointwise.
std::vector<Binding> pair_bindings(bool pointwise);

// Grouped products: the primitive's group count (c.groups) with a, a's
// share per group (ag, from W's or dW's shape) and b; raises unless the
// shapes hold exactly that many groups.
GroupedParams grouped_params(int a, int ag, int b, const Call& c);

// The ordered sum of a weight gradient's float partials (temp 0) into dw
// (metal/backward.metal's wgrad_reduce), after a partitioned product.
Step wgrad_reduce_step(const Call& c, const WeightGradPartsParams& q);

// Quantized convolutions: (x, codes, scales, biases[, offsets, gather, k,
// extra...]); checks the code width and the scale dtype.
bool quantized_pointwise(const Call& c);
QuantParams quant_params(const Call& c);

// The sorted implicit GEMM program (sorted_gemm.cpp), shared with its
// TensorOps twin: same checks, grid and bindings, other kernels.
Program sorted_gemm_program(const Call& c);
// The sorted quantized program (quantized.cpp), shared with its TensorOps
// twin; one_group: one scale and bias per (output channel, offset).
Program sorted_quantized_program(const Call& c, bool one_group);

// The matrix-unit weight gradient's program (wgrad_mma.cpp), shared with
// its TensorOps twin: same blocks, chunks, partitions and reduction; the
// kernels named <stem>_<dtype>_n<32|64>.
Program wgrad_mma_program(const Call& c, int groups, const std::string& stem);

// The matrix-unit CSR implicit GEMM's program for one group (csr_mma.cpp),
// shared with its TensorOps twin: same column blocks, grid, row order and
// bindings; the kernels named <stem>_<dtype>_n<16|32|64|128>.
Program csr_mma_program(const Call& c, const std::string& stem);

// Extra inputs: the sorted plan (reorder_rows, out_in_map, tile_masks) of
// the output-major view.
std::vector<mx::array> sorted_plan_inputs(Relation& rel, View view);
// Extra inputs: the input-major neighbour map (N_in, K) of the input
// gradient routes.
std::vector<mx::array> input_neighbor_map_inputs(Relation& rel, View view);
// Extra inputs: the view's rows in order of their offset sets
// (Relation::row_order), the order the matrix-unit CSR routes tile them in.
std::vector<mx::array> row_order_inputs(Relation& rel, View view);

// The family tables (src/metal/<family>.cpp).
const std::vector<Route>& fetch_on_demand_routes();
const std::vector<Route>& forward_vector_routes();
const std::vector<Route>& forward_dense_routes();
const std::vector<Route>& sorted_gemm_routes();
const std::vector<Route>& tensorops_sorted_routes();
const std::vector<Route>& backward_routes();
const std::vector<Route>& tensorops_backward_routes();
const std::vector<Route>& quantized_routes();
const std::vector<Route>& tensorops_quantized_routes();
const std::vector<Route>& grouped_routes();
const std::vector<Route>& csr_mma_routes();
const std::vector<Route>& wgrad_mma_routes();
const std::vector<Route>& tensorops_wgrad_mma_routes();
const std::vector<Route>& tensorops_csr_mma_routes();

// Every Metal route, in family order.
const std::vector<const Route*>& routes();

// The entry of `name`, which must be a route of `op`.
const Route& find(const std::string& name, Op op);

// Registers the table with the primitives' (core/route_table.h).
void register_routes();

// The program of route `name` for a primitive's inputs and output (and its
// channel groups).
Program program(
    const std::string& name,
    Op op,
    const std::vector<mx::array>& inputs,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype,
    int groups = 1);

} // namespace mlx_lattice::metal
