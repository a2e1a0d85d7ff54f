// Programs of metal/norm_act.metal: partial passes give each (channel, row
// block) one thread, tile_c channels by NORM_TILE_THREADS / tile_c blocks to
// a threadgroup; merges one threadgroup of NORM_MERGE_THREADS per channel
// (per (channel, segment) in the forward pass); elementwise passes the same
// tiles over rows, striding past NORM_MAX_ROW_GROUPS threadgroups.
// NormAct::eval_gpu and NormActGrad::eval_gpu (below) encode them.
#include "metal/norm_act.h"

#include <limits>
#include <stdexcept>
#include <string>

static_assert(sizeof(NormParams) == 11 * 4, "NormParams: 32-bit fields");

namespace mlx_lattice::metal {

namespace {

// Threads (tile_c, rows) of a tile.
std::array<uint64_t, 3> tile_threads(const NormParams& p) {
  return {static_cast<uint64_t>(p.tile_c), static_cast<uint64_t>(NORM_TILE_THREADS / p.tile_c), 1};
}

// A partial pass: one thread per (channel, block).
Step partial_step(const std::string& kernel, const NormParams& p, std::vector<Binding> buffers) {
  Step s;
  s.kernel = kernel;
  s.threads = tile_threads(p);
  s.groups = {ceil_div(p.channels, p.tile_c), ceil_div(p.blocks, NORM_TILE_THREADS / p.tile_c), 1};
  s.buffers = std::move(buffers);
  return s;
}

// An elementwise pass: one thread per channel and row of the grid.
Step rows_pass(const std::string& kernel, const NormParams& p, std::vector<Binding> buffers) {
  Step s;
  s.kernel = kernel;
  s.threads = tile_threads(p);
  const uint64_t rows = ceil_div(p.rows, NORM_TILE_THREADS / p.tile_c);
  s.groups = {ceil_div(p.channels, p.tile_c), std::min<uint64_t>(rows, NORM_MAX_ROW_GROUPS), 1};
  s.buffers = std::move(buffers);
  return s;
}

// A temporary of `planes` planes of S x C x blocks floats.
Temp partials(const NormParams& p, int planes) {
  const int64_t n = int64_t(planes) * p.segments * p.channels * p.blocks;
  if (n > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(
        "norm_act on Metal: the partial sums of " + std::to_string(p.rows) + " rows x " +
        std::to_string(p.channels) + " channels x " + std::to_string(p.segments) +
        " segments exceed 2^31 floats; use fewer segments or rows per call");
  }
  return {mx::float32, n};
}

} // namespace

NormParams norm_params(const NormSpec& spec, int64_t rows, int64_t channels) {
  if (rows < 0 || rows > std::numeric_limits<int32_t>::max() || channels < 0 ||
      channels > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("norm_act on Metal: rows and channels must lie in [0, 2^31 - 1]");
  }
  NormParams p{};
  p.rows = static_cast<int>(rows);
  p.channels = static_cast<int>(channels);
  p.segments = spec.segments;
  p.segmented = spec.segmented ? 1 : 0;
  p.residual = spec.residual ? 1 : 0;
  p.training = spec.training ? 1 : 0;
  // More segments, longer blocks: the partials (segments x blocks per
  // channel) stay near rows / 32 per channel.
  const int64_t per_block = spec.segmented
      ? int64_t(NORM_BLOCK_ROWS) * ((spec.segments + NORM_SEGMENTS_PER_BLOCK - 1) / NORM_SEGMENTS_PER_BLOCK)
      : NORM_BLOCK_ROWS;
  p.block_rows = static_cast<int>(std::min<int64_t>(per_block, std::numeric_limits<int32_t>::max()));
  p.blocks = static_cast<int>((rows + p.block_rows - 1) / p.block_rows);
  int tile = 1;
  while (tile < 32 && tile < channels) {
    tile *= 2;
  }
  p.tile_c = tile;
  p.low = low_slope(spec.act, spec.slope);
  p.eps = spec.eps;
  return p;
}

// Inputs (src/core/norm.h): x, weight, bias, [residual], [segments] (training)
// or x, weight, bias, mean, var, [residual] (eval). Bindings a kernel never
// reads (no residual, no segment ids) get x.
Program norm_forward_program(const NormSpec& spec, int64_t rows, int64_t channels, mx::Dtype dtype) {
  const NormParams p = norm_params(spec, rows, channels);
  const std::string dt = type_name(dtype);
  Program prog;
  if (p.channels == 0) {
    return prog; // every output is empty
  }
  int next = spec.training ? 3 : 5;
  const Binding x = input(0, "x");
  const Binding r = spec.residual ? input(next++, "residual") : input(0, "x");
  const Binding seg = spec.segmented ? input(next++, "segments") : input(0, "x");
  Binding mean = input(3, "mean");
  Binding var = input(4, "var");
  if (spec.training) {
    prog.temps.push_back(partials(p, 4));
    if (p.blocks > 0) {
      prog.steps.push_back(partial_step(
          "norm_act_stats_" + dt, p, {x, seg, temp(0, "moments"), bytes(p)}));
    }
    Step merge;
    merge.kernel = "norm_act_merge";
    merge.threads = {NORM_MERGE_THREADS, 1, 1};
    merge.groups = {static_cast<uint64_t>(p.channels), static_cast<uint64_t>(p.segments), 1};
    merge.buffers = {temp(0, "moments"), output(1, "mean"), output(2, "var"), bytes(p)};
    prog.steps.push_back(std::move(merge));
    mean = output(1, "mean");
    var = output(2, "var");
  }
  if (p.rows > 0) {
    prog.steps.push_back(rows_pass(
        "norm_act_apply_" + dt, p,
        {x, input(1, "weight"), input(2, "bias"), mean, var, r, seg, output(0, "y"), bytes(p)}));
  }
  return prog;
}

// Inputs (src/core/norm.h): x, y, ct, weight, bias, mean, var, [segments], and in
// training ct_mean, ct_var. Outputs dx, dweight, dbias[, g].
Program norm_backward_program(const NormSpec& spec, int64_t rows, int64_t channels, mx::Dtype dtype) {
  const NormParams p = norm_params(spec, rows, channels);
  const std::string dt = type_name(dtype);
  Program prog;
  if (p.channels == 0) {
    return prog;
  }
  int next = 7;
  const Binding x = input(0, "x");
  const Binding w = input(3, "weight");
  const Binding seg = spec.segmented ? input(next++, "segments") : input(0, "x");
  const Binding ct_mean = spec.training ? input(next++, "ct_mean") : w;
  const Binding ct_var = spec.training ? input(next++, "ct_var") : w;
  prog.temps.push_back(partials(p, 3));
  prog.temps.push_back({mx::float32, 3 * int64_t(p.segments) * p.channels});
  if (p.blocks > 0) {
    prog.steps.push_back(partial_step(
        "norm_act_grad_sums_" + dt, p,
        {x, input(1, "y"), input(2, "ct"), w, input(4, "bias"), input(5, "mean"),
         input(6, "var"), seg, temp(0, "sums"), bytes(p)}));
  }
  Step merge;
  merge.kernel = "norm_act_grad_merge";
  merge.threads = {NORM_MERGE_THREADS, 1, 1};
  merge.groups = {static_cast<uint64_t>(p.channels), 1, 1};
  merge.buffers = {
      temp(0, "sums"), w, input(6, "var"), ct_mean, ct_var, temp(1, "coef"),
      output(1, "dweight"), output(2, "dbias"), bytes(p)};
  prog.steps.push_back(std::move(merge));
  if (p.rows > 0) {
    // Without a residual g is not an output: dx stands in, never written.
    const Binding g = spec.residual ? output(3, "g") : output(0, "dx");
    prog.steps.push_back(rows_pass(
        "norm_act_grad_apply_" + dt, p,
        {x, input(1, "y"), input(2, "ct"), input(4, "bias"), input(5, "mean"), seg,
         temp(1, "coef"), output(0, "dx"), g, bytes(p)}));
  }
  return prog;
}

} // namespace mlx_lattice::metal

namespace mlx_lattice {

namespace {

// Encodes a norm's program over in[0]'s rows and channels. Metal only: on
// other GPUs the layers do not build these primitives
// (mlx_lattice/nn/normalization.py), and the programs exist only in builds
// with the Metal kernels.
void run_norm_program(
    metal::Program (*program)(const NormSpec&, int64_t, int64_t, mx::Dtype),
    const NormSpec& spec,
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out,
    mx::Stream s) {
  if (!metal::available()) {
    throw std::runtime_error(
        "norm_act: this build has no Metal kernels; on other GPUs the norms "
        "run as MLX ops");
  }
  const auto& x = in[0];
  metal::run(program(spec, x.shape(0), x.shape(1), x.dtype()), in, out, s);
}

} // namespace

void NormAct::eval_gpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  run_norm_program(metal::norm_forward_program, spec_, in, out, stream());
}

void NormActGrad::eval_gpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  run_norm_program(metal::norm_backward_program, spec_, in, out, stream());
}

} // namespace mlx_lattice
