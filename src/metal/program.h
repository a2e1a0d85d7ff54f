// Metal programs: the kernels, dispatch shapes and buffer bindings that
// eval_gpu encodes for a route. The test harness reads the same programs
// (through _ext.metal_program) and runs them on the CPU, so it exercises
// exactly what a Mac runs. Routes build them in src/metal/<family>.cpp
// (see route.h).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

// The kernel parameter structs, shared with the kernels (no copies).
#include "../../metal/params.h"

static_assert(sizeof(ConvParams) == 8 * 4, "ConvParams: 32-bit fields");
static_assert(sizeof(QuantParams) == 10 * 4, "QuantParams: 32-bit fields");

namespace mlx_lattice::metal {

namespace mx = mlx::core;

struct Binding {
  enum class Kind { Input, Output, Temp, Bytes };
  Kind kind;
  int index = 0;              // input, output or temporary index
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

// ------------------------------------------------- helpers for route tables

inline uint64_t ceil_div(int64_t a, int64_t b) {
  return static_cast<uint64_t>((std::max<int64_t>(a, 1) + b - 1) / b);
}

// Grid extent over kernel offsets (at least one group).
inline uint64_t offsets_grid(int64_t k) {
  return static_cast<uint64_t>(std::max<int64_t>(k, 1));
}

// One thread per row, 256 to a threadgroup (the map-building and neighbour
// programs).
inline Step rows_step(const char* kernel, int64_t rows, std::vector<Binding> buffers) {
  constexpr int kRowThreads = 256;
  Step s;
  s.kernel = kernel;
  s.threads = {kRowThreads, 1, 1};
  s.groups = {ceil_div(rows, kRowThreads), 1, 1};
  s.buffers = std::move(buffers);
  return s;
}

template <typename P>
Binding bytes(const P& p, const char* name = "params") {
  Binding b{Binding::Kind::Bytes};
  b.bytes.resize(sizeof(P));
  std::memcpy(b.bytes.data(), &p, sizeof(P));
  b.name = name;
  return b;
}

inline Binding input(int i, const char* name) {
  Binding b{Binding::Kind::Input};
  b.index = i;
  b.name = name;
  return b;
}

inline Binding output(const char* name = "y") {
  Binding b{Binding::Kind::Output};
  b.name = name;
  return b;
}

// Output i of a primitive with several outputs.
inline Binding output(int i, const char* name) {
  Binding b{Binding::Kind::Output};
  b.index = i;
  b.name = name;
  return b;
}

inline Binding temp(int i, const char* name) {
  Binding b{Binding::Kind::Temp};
  b.index = i;
  b.name = name;
  return b;
}

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

// The same for a primitive with several outputs (Binding::index selects
// one); every output is allocated, and only the steps' bindings are set.
void run(
    const Program& program,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outs,
    mx::Stream s);

} // namespace mlx_lattice::metal
