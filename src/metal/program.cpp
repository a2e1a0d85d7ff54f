#include "metal/program.h"

#include <algorithm>
#include <stdexcept>

#include "mlx/allocator.h"

#ifdef MLX_LATTICE_METAL
#include <dlfcn.h>

#include <filesystem>

#include "mlx/backend/metal/device.h"
#include "mlx/backend/metal/utils.h"
#endif

namespace mlx_lattice::metal {

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

// Encodes the steps over outputs that are already allocated.
void encode(
    const Program& program,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outs,
    mx::Stream s) {
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
          enc.set_output_array(outs[b.index], idx);
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
  std::vector<mx::array> outs = {out};
  encode(program, inputs, outs, s);
}

void run(
    const Program& program,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outs,
    mx::Stream s) {
  for (auto& o : outs) {
    o.set_data(mx::allocator::malloc(o.nbytes()));
  }
  encode(program, inputs, outs, s);
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

void run(const Program&, const std::vector<mx::array>&, std::vector<mx::array>&, mx::Stream) {
  throw std::runtime_error(
      "mlx_lattice was built without Metal; run it on the CPU stream");
}

#endif

} // namespace mlx_lattice::metal
