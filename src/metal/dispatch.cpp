#include "metal/dispatch.h"

#include <stdexcept>

#include "mlx/allocator.h"

#ifdef MLX_LATTICE_METAL
#include <dlfcn.h>

#include <filesystem>

#include "mlx/backend/metal/device.h"
#include "mlx/backend/metal/utils.h"
#endif

namespace mlx_lattice::metal {

namespace {

constexpr uint64_t kChannelTile = 32;
constexpr uint64_t kRowTile = 8;

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
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

// One thread per (row, output channel): rows of 8 x 32 channels per group.
Plan plan_gather_conv(const std::string& dtype, int64_t rows, int a, int b) {
  (void)a;
  Plan p;
  p.kernel = "gather_conv_" + dtype;
  p.threads = {kChannelTile, kRowTile, 1};
  p.groups = {
      ceil_div(std::max(b, 1), kChannelTile),
      ceil_div(std::max<int64_t>(rows, 1), kRowTile),
      1};
  p.buffers = {"x", "w", "offsets", "gather", "k", "y", "params"};
  return p;
}

// One thread per (offset, input channel, output channel).
Plan plan_weight_grad(const std::string& dtype, int64_t k, int a, int b) {
  Plan p;
  p.kernel = "weight_grad_" + dtype;
  p.threads = {kChannelTile, kRowTile, 1};
  p.groups = {
      ceil_div(std::max(b, 1), kChannelTile),
      ceil_div(std::max(a, 1), kRowTile),
      static_cast<uint64_t>(std::max<int64_t>(k, 1))};
  p.buffers = {"x", "ct", "offsets", "g", "r", "dw", "params"};
  return p;
}

#ifdef MLX_LATTICE_METAL

namespace {

std::string metallib_path() {
  Dl_info info;
  dladdr(reinterpret_cast<void*>(&metallib_path), &info);
  auto dir = std::filesystem::path(info.dli_fname).parent_path();
  return (dir / "mlx_lattice.metallib").string();
}

MTL::ComputePipelineState* kernel(mx::Stream s, const std::string& name) {
  auto& d = mx::metal::device(s.device);
  auto* lib = d.get_library("mlx_lattice", metallib_path());
  return d.get_kernel(name, lib);
}

void encode(
    const Plan& plan,
    const std::vector<mx::array>& bufs,
    mx::array& out,
    const void* params,
    size_t params_size,
    mx::Stream s) {
  auto& enc = mx::metal::get_command_encoder(s);
  enc.set_compute_pipeline_state(kernel(s, plan.kernel));
  for (size_t i = 0; i < bufs.size(); ++i) {
    enc.set_input_array(bufs[i], static_cast<int>(i));
  }
  enc.set_output_array(out, static_cast<int>(bufs.size()));
  enc.set_bytes(
      static_cast<const uint8_t*>(params),
      static_cast<int>(params_size),
      static_cast<int>(bufs.size() + 1));
  enc.dispatch_threadgroups(
      MTL::Size(plan.groups[0], plan.groups[1], plan.groups[2]),
      MTL::Size(plan.threads[0], plan.threads[1], plan.threads[2]));
}

} // namespace

bool available() {
  return true;
}

void gather_conv(
    const std::vector<mx::array>& in,
    mx::array& out,
    const std::string& route,
    bool has_relation,
    mx::Stream s) {
  (void)route;
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) {
    return;
  }
  GatherConvParams prm{
      out.shape(0), in[0].shape(1), in[1].shape(2), has_relation ? 0 : 1};
  Plan plan = plan_gather_conv(type_name(out.dtype()), prm.rows, prm.a, prm.b);
  std::vector<mx::array> bufs = {in[0], in[1]};
  for (int i = 2; i < 5; ++i) {
    bufs.push_back(has_relation ? in[i] : in[0]);
  }
  encode(plan, bufs, out, &prm, sizeof(prm), s);
}

void weight_grad(
    const std::vector<mx::array>& in,
    mx::array& out,
    bool has_relation,
    mx::Stream s) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) {
    return;
  }
  WeightGradParams prm{
      out.shape(0),
      out.shape(1),
      out.shape(2),
      has_relation ? -1 : static_cast<int32_t>(in[0].shape(0))};
  Plan plan = plan_weight_grad(type_name(out.dtype()), prm.k, prm.a, prm.b);
  std::vector<mx::array> bufs = {in[0], in[1]};
  for (int i = 2; i < 5; ++i) {
    bufs.push_back(has_relation ? in[i] : in[0]);
  }
  encode(plan, bufs, out, &prm, sizeof(prm), s);
}

#else

bool available() {
  return false;
}

void gather_conv(
    const std::vector<mx::array>&,
    mx::array&,
    const std::string&,
    bool,
    mx::Stream) {
  throw std::runtime_error(
      "mlx_lattice was built without Metal; run sparse convolution on the CPU "
      "stream");
}

void weight_grad(const std::vector<mx::array>&, mx::array&, bool, mx::Stream) {
  throw std::runtime_error(
      "mlx_lattice was built without Metal; run sparse convolution on the CPU "
      "stream");
}

#endif

} // namespace mlx_lattice::metal
