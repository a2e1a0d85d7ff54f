#include "metal/program.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mlx/allocator.h"
#include "relation.h"

#ifdef MLX_LATTICE_METAL
#include <dlfcn.h>

#include <filesystem>

#include "mlx/backend/metal/device.h"
#include "mlx/backend/metal/utils.h"
#endif

namespace mlx_lattice::metal {

namespace {

uint64_t ceil_div(int64_t a, int64_t b) {
  return static_cast<uint64_t>((std::max<int64_t>(a, 1) + b - 1) / b);
}

template <typename P>
Binding bytes(const P& p, const char* name = "params") {
  Binding b{Binding::Kind::Bytes};
  b.bytes.resize(sizeof(P));
  std::memcpy(b.bytes.data(), &p, sizeof(P));
  b.name = name;
  return b;
}

Binding input(int i, const char* name) {
  Binding b{Binding::Kind::Input};
  b.index = i;
  b.name = name;
  return b;
}

Binding output(const char* name = "y") {
  Binding b{Binding::Kind::Output};
  b.name = name;
  return b;
}

bool has(const std::string& route, const char* name) {
  return route == std::string("metal.") + name;
}

// CSR-traversal kernels bind (x, w, offsets, gather, k, y, params); a
// pointwise product binds x in place of the index buffers, never read.
std::vector<Binding> csr_bindings(bool identity) {
  std::vector<Binding> b = {input(0, "x"), input(1, "w")};
  const char* names[3] = {"offsets", "gather", "k"};
  for (int i = 0; i < 3; ++i) {
    b.push_back(input(identity ? 0 : 2 + i, names[i]));
  }
  b.push_back(output());
  return b;
}

} // namespace

std::string type_name(mx::Dtype dt) {
  if (dt == mx::float32) {
    return "float32";
  }
  if (dt == mx::float16) {
    return "float16";
  }
  if (dt == mx::bfloat16) {
    return "bfloat16";
  }
  throw std::invalid_argument("unsupported dtype for Metal kernels");
}

std::vector<mx::array> extra_inputs(
    const std::string& route,
    const std::shared_ptr<Relation>& rel,
    int view) {
  if (!rel) {
    return {};
  }
  if (view == 1) {
    // Input-gradient routes that traverse the input-major neighbour map.
    if (has(route, "dgrad_dense_channel") || has(route, "dgrad_dense_grouped") ||
        has(route, "tensorops_dgrad")) {
      return {rel->input_neighbor_map()};
    }
    return {};
  }
  if (has(route, "dense_channel")) {
    return {rel->neighbor_map()};
  }
  if (has(route, "fp32_atomic")) {
    return {rel->out_idx()};
  }
  if (has(route, "sorted_implicit_gemm") || has(route, "tensorops_sorted") ||
      has(route, "quantized_sorted") || has(route, "tensorops_quantized")) {
    const auto& p = rel->sorted_plan();
    return {p.reorder_rows, p.out_in_map, p.tile_masks};
  }
  return {};
}

Program conv_program(
    const std::string& route,
    const std::vector<mx::array>& in,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype) {
  const std::string dt = type_name(out_dtype);
  const bool identity = in.size() < 5;
  ConvParams p{};
  p.rows = out_shape[0];
  p.a = in[0].shape(1);
  p.b = out_shape[1];
  p.identity = identity ? 1 : 0;
  p.k = in[1].shape(0);
  p.n_in = in[0].shape(0);
  p.edges = identity ? p.rows : in[3].shape(0);
  // A route's kernels assume its predicate; refuse anything else clearly.
  auto require = [&](bool ok, const char* what) {
    if (!ok) {
      throw std::invalid_argument(route + " needs " + what);
    }
  };
  if (has(route, "vec4")) {
    require(p.b % 4 == 0 && out_dtype == mx::float32, "float32 and C_out divisible by 4 (vec4)");
  } else if (has(route, "cout16")) {
    require(p.b == 16, "C_out == 16 (cout16)");
  } else if (has(route, "fp16_gather")) {
    require(out_dtype == mx::float16, "float16 features (fp16_gather)");
  } else if (has(route, "fp32_atomic")) {
    require(out_dtype == mx::float32 && !identity && in.size() >= 6, "float32 and the output-major view");
  } else if (has(route, "dense_channel")) {
    auto ok = [](int c) { return c == 16 || c == 32 || c == 64; };
    require(ok(p.a) && ok(p.b) && !identity && in.size() >= 6, "C_in, C_out in {16, 32, 64} and a neighbour map");
  } else if (has(route, "sorted_implicit_gemm") || has(route, "tensorops_sorted")) {
    require(
        out_dtype == mx::float16 && p.a == p.b && (p.a == 32 || p.a == 64) && p.k == 27 && in.size() >= 8,
        "float16, K == 27, C_in == C_out in {32, 64} and the sorted plan");
  } else if (has(route, "pointwise")) {
    require(identity, "a pointwise product");
  } else if (has(route, "dgrad_dense_channel") || has(route, "dgrad_dense_grouped")) {
    auto ok = [](int c) { return c == 16 || c == 32 || c == 64; };
    require(ok(p.a) && ok(p.b) && !identity && in.size() >= 6,
            "C_in, C_out in {16, 32, 64} and the input-major neighbour map");
  } else if (has(route, "tensorops_dgrad")) {
    require(out_dtype == mx::float32 && p.a == 16 && p.b == 16 && !identity && in.size() >= 6,
            "float32, C_in == C_out == 16 and the input-major neighbour map");
  }
  Program prog;
  Step s;
  if (has(route, "pointwise")) {
    // 16 x 16 output tiles; x and w staged through threadgroup memory.
    s.kernel = "pointwise_gemm_" + dt;
    s.threads = {16, 16, 1};
    s.groups = {ceil_div(p.b, 16), ceil_div(p.rows, 16), 1};
    s.buffers = {input(0, "x"), input(1, "w"), output(), bytes(p)};
  } else if (has(route, "relation_traversal")) {
    // One thread per (row, output channel).
    s.kernel = "gather_conv_" + dt;
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b, 32), ceil_div(p.rows, 8), 1};
    s.buffers = csr_bindings(identity);
    s.buffers.push_back(bytes(p));
  } else if (has(route, "vec4")) {
    // One thread per (row, 4 output channels).
    s.kernel = "vec4_conv_" + dt;
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b / 4, 32), ceil_div(p.rows, 8), 1};
    s.buffers = csr_bindings(identity);
    s.buffers.push_back(bytes(p));
  } else if (has(route, "fp16_gather")) {
    // One simdgroup per row; the row's inputs staged in threadgroup memory.
    s.kernel = "fp16_gather_conv_" + dt;
    s.threads = {32, 4, 1};
    s.groups = {1, ceil_div(p.rows, 4), 1};
    s.buffers = csr_bindings(identity);
    s.buffers.push_back(bytes(p));
  } else if (has(route, "cout16")) {
    // One thread per row computing all 16 output channels.
    s.kernel = "cout16_conv_" + dt;
    s.threads = {64, 1, 1};
    s.groups = {ceil_div(p.rows, 64), 1, 1};
    s.buffers = csr_bindings(identity);
    s.buffers.push_back(bytes(p));
  } else if (has(route, "dense_channel")) {
    // (C_out / 4) x R threads, W[k] staged in threadgroup memory per offset.
    s.kernel = "dense_channel_" + dt + "_" + std::to_string(p.a) + "x" +
        std::to_string(p.b);
    const uint64_t tx = p.b / 4;
    const uint64_t ty = 256 / tx;
    s.threads = {tx, ty, 1};
    s.groups = {1, ceil_div(p.rows, ty), 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "neighbor_map"), output(), bytes(p)};
  } else if (has(route, "fp32_atomic")) {
    // Zero the output, then one thread per (edge, channel) adds atomically.
    Step zero;
    zero.kernel = "fill_zero_float32";
    const int32_t count = p.rows * p.b;
    zero.threads = {256, 1, 1};
    zero.groups = {ceil_div(count, 256), 1, 1};
    zero.buffers = {output(), bytes(count, "count")};
    prog.steps.push_back(zero);
    s.kernel = "atomic_conv_" + dt;
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b, 32), ceil_div(p.edges, 8), 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(3, "gather"), input(4, "k"),
                 input(5, "out_idx"), output(), bytes(p)};
  } else if (has(route, "sorted_implicit_gemm")) {
    // 64 sorted rows per group, 4 simdgroups of 8x8 matrix tiles.
    p.n_tiles = in[7].shape(0);
    s.kernel = "sorted_gemm_" + dt + "_c" + std::to_string(p.b);
    s.threads = {128, 1, 1};
    s.groups = {ceil_div(p.rows, 64), 1, 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "reorder_rows"),
                 input(6, "sorted_out_in_map"), input(7, "tile_masks"), output(), bytes(p)};
  } else if (has(route, "tensorops_sorted")) {
    // 64 sorted rows per group; one matmul2d per offset over 4 simdgroups
    // (the kernel's execution_simdgroups<4>: exactly 128 threads).
    p.n_tiles = in[7].shape(0);
    s.kernel = "tensorops_sorted_" + dt + "_c" + std::to_string(p.b);
    s.threads = {128, 1, 1};
    s.groups = {ceil_div(p.rows, 64), 1, 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "reorder_rows"),
                 input(6, "sorted_out_in_map"), input(7, "tile_masks"), output(), bytes(p)};
  } else if (has(route, "dgrad_dense_channel")) {
    // The forward dense-channel kernels over the input-major neighbour map
    // (x: the output cotangent, w: W transposed per offset).
    s.kernel = "dense_channel_" + dt + "_" + std::to_string(p.a) + "x" +
        std::to_string(p.b);
    const uint64_t tx = p.b / 4;
    const uint64_t ty = 256 / tx;
    s.threads = {tx, ty, 1};
    s.groups = {1, ceil_div(p.rows, ty), 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "input_neighbor_map"), output(), bytes(p)};
  } else if (has(route, "dgrad_dense_grouped")) {
    // As dgrad_dense_channel, each thread owning 4 rows spaced ty apart.
    s.kernel = "dense_channel_grouped_" + dt + "_" + std::to_string(p.a) + "x" +
        std::to_string(p.b);
    const uint64_t tx = p.b / 4;
    const uint64_t ty = 256 / tx;
    s.threads = {tx, ty, 1};
    s.groups = {1, ceil_div(p.rows, ty * 4), 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "input_neighbor_map"), output(), bytes(p)};
  } else if (has(route, "tensorops_dgrad")) {
    // 64 input rows per group; one matmul2d per offset over 4 simdgroups.
    s.kernel = "tensorops_dgrad_float32_c16";
    s.threads = {128, 1, 1};
    s.groups = {ceil_div(p.rows, 64), 1, 1};
    s.buffers = {input(0, "x"), input(1, "w"), input(5, "input_neighbor_map"), output(), bytes(p)};
  } else {
    throw std::invalid_argument("no Metal program for route " + route);
  }
  prog.steps.push_back(s);
  return prog;
}

Program weight_grad_program(
    const std::string& route,
    const std::vector<mx::array>& in,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype) {
  const bool identity = in.size() < 5;
  const std::string dt = type_name(out_dtype);
  WeightGradParams p{
      out_shape[0], out_shape[1], out_shape[2],
      identity ? static_cast<int32_t>(in[0].shape(0)) : -1};
  auto require = [&](bool ok, const char* what) {
    if (!ok) {
      throw std::invalid_argument(route + " needs " + what);
    }
  };
  const uint64_t kz = static_cast<uint64_t>(std::max(p.k, 1));
  Program prog;
  Step s;
  s.buffers = {input(0, "x"), input(1, "ct")};
  const char* names[3] = {"offsets", "g", "r"};
  for (int i = 0; i < 3; ++i) {
    s.buffers.push_back(input(identity ? 0 : 2 + i, names[i]));
  }
  if (has(route, "tensorops_wgrad")) {
    auto ok = [](int c) { return c == 16 || c == 32 || c == 64; };
    require(ok(p.a) && ok(p.b) && !identity, "C_in, C_out in {16, 32, 64} and a relation");
    // Step 1: partition (p, k) contracts chunks p, p + P, ... of offset k's
    // edges into a float partial; P grows with the edges per offset (about
    // 256 edges per partition), at most 64. Step 2 adds them in order.
    const int64_t edges = in[3].shape(0);
    const int64_t per_k = (edges + p.k - 1) / std::max(p.k, 1);
    const int32_t parts = static_cast<int32_t>(std::clamp<int64_t>((per_k + 255) / 256, 1, 64));
    WeightGradPartsParams q{p.k, p.a, p.b, parts};
    prog.temps.push_back({mx::float32, int64_t(p.k) * parts * p.a * p.b});
    s.kernel = "tensorops_wgrad_" + dt + "_" + std::to_string(p.a) + "x" + std::to_string(p.b);
    s.threads = {128, 1, 1};
    s.groups = {static_cast<uint64_t>(parts), kz, 1};
    Binding partials{Binding::Kind::Temp};
    partials.index = 0;
    partials.name = "partials";
    s.buffers.push_back(partials);
    s.buffers.push_back(bytes(q));
    prog.steps.push_back(s);
    Step r;
    r.kernel = "wgrad_reduce_" + dt;
    r.threads = {256, 1, 1};
    r.groups = {ceil_div(int64_t(p.a) * p.b, 256), kz, 1};
    r.buffers = {partials, output("dw"), bytes(q)};
    prog.steps.push_back(r);
    return prog;
  }
  if (has(route, "weight_gradient")) {
    // One thread per (offset, input channel, output channel).
    s.kernel = "weight_grad_" + dt;
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b, 32), ceil_div(p.a, 8), kz};
  } else if (has(route, "wgrad_fp16")) {
    require(out_dtype == mx::float16, "float16 features (wgrad_fp16)");
    // A 32 x 8 block of dW[k] per group; 32 edges staged at a time.
    s.kernel = "wgrad_fp16";
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b, 32), ceil_div(p.a, 8), kz};
  } else if (has(route, "wgrad_block4")) {
    require(out_dtype == mx::float32 && p.a % 4 == 0 && p.b % 4 == 0,
            "float32 and C_in, C_out divisible by 4 (wgrad_block4)");
    // One thread per 4 x 4 block of dW[k].
    s.kernel = "wgrad_block4";
    s.threads = {8, 8, 1};
    s.groups = {ceil_div(p.b / 4, 8), ceil_div(p.a / 4, 8), kz};
  } else if (has(route, "wgrad_cout16")) {
    require(p.b == 16, "C_out == 16 (wgrad_cout16)");
    // One thread per (offset, input channel), all 16 output channels.
    s.kernel = "wgrad_cout16_" + dt;
    s.threads = {64, 1, 1};
    s.groups = {ceil_div(p.a, 64), 1, kz};
  } else if (has(route, "wgrad_dense_square")) {
    require(p.a == p.b && (p.a == 16 || p.a == 32 || p.a == 64),
            "C_in == C_out in {16, 32, 64} (wgrad_dense_square)");
    // One group of 256 threads per offset.
    s.kernel = "wgrad_dense_square_" + dt + "_c" + std::to_string(p.a);
    s.threads = {256, 1, 1};
    s.groups = {1, 1, kz};
  } else {
    throw std::invalid_argument("no Metal program for route " + route);
  }
  s.buffers.push_back(output("dw"));
  s.buffers.push_back(bytes(p));
  prog.steps.push_back(s);
  return prog;
}

Program quantized_program(
    const std::string& route,
    const std::vector<mx::array>& in,
    const mx::Shape& out_shape,
    mx::Dtype out_dtype) {
  const std::string dt = type_name(out_dtype);
  const bool identity = in.size() < 7;
  QuantParams p{};
  p.rows = out_shape[0];
  p.a = in[0].shape(1);
  p.b = out_shape[1];
  p.identity = identity ? 1 : 0;
  p.k = in[1].shape(1);
  p.n_in = in[0].shape(0);
  p.edges = identity ? p.rows : in[5].shape(0);
  p.bits = static_cast<int32_t>(in[1].shape(2) * 32 / std::max(p.a, 1));
  p.group = static_cast<int32_t>(p.a / std::max(in[2].shape(2), 1));
  auto require = [&](bool ok, const char* what) {
    if (!ok) {
      throw std::invalid_argument(route + " needs " + what);
    }
  };
  require(p.bits == 4 || p.bits == 8, "4- or 8-bit codes");
  require(in[2].dtype() == mx::float32 && in[3].dtype() == mx::float32, "float32 scales and biases");
  const std::string bits = "_int" + std::to_string(p.bits);
  auto c3264 = [](int c) { return c == 32 || c == 64; };
  Program prog;
  Step s;
  if (has(route, "quantized_direct")) {
    // One thread per (row, output channel); codes read in place.
    s.kernel = "quantized_conv_" + dt + bits;
    s.threads = {32, 8, 1};
    s.groups = {ceil_div(p.b, 32), ceil_div(p.rows, 8), 1};
    s.buffers = {input(0, "x"), input(1, "codes"), input(2, "scales"), input(3, "biases")};
    const char* names[3] = {"offsets", "gather", "k"};
    for (int i = 0; i < 3; ++i) {
      s.buffers.push_back(input(identity ? 0 : 4 + i, names[i]));
    }
  } else if (has(route, "quantized_sorted") || has(route, "tensorops_quantized")) {
    const bool tops = has(route, "tensorops_quantized");
    require(
        out_dtype == mx::float16 && c3264(p.a) && c3264(p.b) && p.k == 27 && in.size() >= 10 &&
            (tops ? p.group == p.a : p.group <= p.a),
        tops ? "float16, K == 27, C_in, C_out in {32, 64}, group_size == C_in and the sorted plan"
             : "float16, K == 27, C_in, C_out in {32, 64}, group_size <= C_in and the sorted plan");
    // 64 sorted rows per group of 128 threads (4 simdgroups).
    p.n_tiles = in[9].shape(0);
    s.kernel = std::string(tops ? "tensorops_quantized_" : "sorted_quantized_") + dt + "_" +
        std::to_string(p.a) + "x" + std::to_string(p.b) + bits;
    s.threads = {128, 1, 1};
    s.groups = {ceil_div(p.rows, 64), 1, 1};
    s.buffers = {input(0, "x"), input(1, "codes"), input(2, "scales"), input(3, "biases"),
                 input(7, "reorder_rows"), input(8, "sorted_out_in_map"), input(9, "tile_masks")};
  } else {
    throw std::invalid_argument("no Metal program for route " + route);
  }
  s.buffers.push_back(output());
  s.buffers.push_back(bytes(p));
  prog.steps.push_back(s);
  return prog;
}

bool tensor_ops_kernels() {
#ifdef MLX_LATTICE_TENSOROPS
  return true;
#else
  return false;
#endif
}

#ifdef MLX_LATTICE_METAL

namespace {

std::string metallib_path(const char* file = "mlx_lattice.metallib") {
  Dl_info info;
  dladdr(reinterpret_cast<void*>(&metallib_path), &info);
  auto dir = std::filesystem::path(info.dli_fname).parent_path();
  return (dir / file).string();
}

// TensorOps kernels live in their own library, compiled as Metal 4.0 (see
// CMakeLists.txt); everything else in mlx_lattice.metallib.
MTL::Library* library_for(mx::metal::Device& d, const std::string& kernel) {
  if (kernel.rfind("tensorops_", 0) != 0) {
    return d.get_library("mlx_lattice", metallib_path());
  }
  if (!tensor_ops_kernels()) {
    throw std::runtime_error(
        "mlx_lattice was built with an SDK without Metal 4 TensorOps; kernel " +
        kernel + " is not available");
  }
  return d.get_library(
      "mlx_lattice_tensorops", metallib_path("mlx_lattice_tensorops.metallib"));
}

} // namespace

bool available() {
  return true;
}

void run(
    const Program& program,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    mx::Stream s) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) {
    return;
  }
  auto& d = mx::metal::device(s.device);
  auto& enc = mx::metal::get_command_encoder(s);
  std::vector<mx::array> temps;
  for (const auto& t : program.temps) {
    temps.emplace_back(
        mx::allocator::malloc(std::max<int64_t>(t.size, 1) * mx::size_of(t.dtype)),
        mx::Shape{static_cast<int>(t.size)},
        t.dtype);
  }
  for (const auto& step : program.steps) {
    enc.set_compute_pipeline_state(
        d.get_kernel(step.kernel, library_for(d, step.kernel)));
    for (size_t i = 0; i < step.buffers.size(); ++i) {
      const Binding& b = step.buffers[i];
      const int idx = static_cast<int>(i);
      switch (b.kind) {
        case Binding::Kind::Input:
          enc.set_input_array(inputs[b.index], idx);
          break;
        case Binding::Kind::Output:
          enc.set_output_array(out, idx);
          break;
        case Binding::Kind::Temp:
          enc.set_output_array(temps[b.index], idx);
          break;
        case Binding::Kind::Bytes:
          enc.set_bytes(b.bytes.data(), static_cast<int>(b.bytes.size()), idx);
          break;
      }
    }
    enc.dispatch_threadgroups(
        MTL::Size(step.groups[0], step.groups[1], step.groups[2]),
        MTL::Size(step.threads[0], step.threads[1], step.threads[2]));
  }
  enc.add_temporaries(std::move(temps));
}

#else

bool available() {
  return false;
}

void run(const Program&, const std::vector<mx::array>&, mx::array&, mx::Stream) {
  throw std::runtime_error(
      "mlx_lattice was built without Metal; run sparse convolution on the CPU "
      "stream");
}

#endif

} // namespace mlx_lattice::metal
