// Instruction-set path selection for the CPU kernels (see cpu/isa.h).
#include "cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "cpu/cpu_features.h"

namespace mlx_lattice::cpu {

// Each path's entry points, defined by the kernel sources compiled for it.
#define LATTICE_DECLARE_PATH(isa)                                              \
  namespace isa {                                                              \
  void gather_conv(Float, const void*, const void*, WeightStrides, CsrView,    \
                   int64_t, int64_t, int, int, void*);                         \
  void gather_conv_quantized(Float, Float, const void*, const uint32_t*,       \
                             const void*, const void*, int, int, CsrView,      \
                             int64_t, int64_t, int, int, void*);               \
  void weight_grad(Float, const void*, const void*, PairView, int64_t,         \
                   int64_t, int, int, WeightStrides, void*);                   \
  void grouped_conv(Float, const void*, const void*, int, CsrView, int64_t,    \
                    int64_t, int, int, void*);                                 \
  void grouped_weight_grad(Float, const void*, const void*, int, PairView,     \
                           int64_t, int64_t, int, int, void*);                 \
  void attention_forward(Float, AttentionShape, StridedView, StridedView,      \
                         StridedView, const int32_t*, void*, float*);          \
  void attention_backward(Float, AttentionShape, StridedView, StridedView,     \
                          StridedView, const int32_t*, StridedView,            \
                          const float*, StridedView, const float*, void*,      \
                          void*, void*);                                       \
  void norm_forward(Float, NormShape, const void*, const float*, const float*, \
                    const void*, const int32_t*, const float*, const float*,   \
                    float*, float*, void*);                                    \
  void norm_backward(Float, NormShape, const void*, const void*, const void*,  \
                     const float*, const float*, const float*, const float*,   \
                     const int32_t*,                                           \
                     const float*, const float*, void*, float*, float*,        \
                     void*);                                                   \
  void adam_update(int64_t, AdamCoefficients, const float*, const float*,      \
                   const float*, const float*, const float*, float*, float*,   \
                   float*);                                                    \
  }

#if defined(__x86_64__) || defined(_M_X64)
LATTICE_DECLARE_PATH(baseline)
LATTICE_DECLARE_PATH(avx2)
LATTICE_DECLARE_PATH(avx512)
#elif defined(__aarch64__)
LATTICE_DECLARE_PATH(neon)
#else
LATTICE_DECLARE_PATH(baseline)
#endif
#undef LATTICE_DECLARE_PATH

namespace {

struct Path {
  KernelTable table;
  bool (*supported)();
};

#define LATTICE_TABLE(isa) \
  KernelTable {                                                            \
    #isa, &isa::gather_conv, &isa::gather_conv_quantized, &isa::weight_grad, \
        &isa::grouped_conv, &isa::grouped_weight_grad,                       \
        &isa::attention_forward, &isa::attention_backward,                   \
        &isa::norm_forward, &isa::norm_backward, &isa::adam_update           \
  }

bool always() {
  return true;
}

#if defined(__x86_64__) || defined(_M_X64)
// Slowest first; the wider paths those the build compiled (CMakeLists.txt,
// MLX_LATTICE_CPU_PATHS).
const Path kPaths[] = {
    {LATTICE_TABLE(baseline), &always},
#if defined(LATTICE_BUILT_AVX2)
    {LATTICE_TABLE(avx2), &has_avx2},
#endif
#if defined(LATTICE_BUILT_AVX512)
    {LATTICE_TABLE(avx512), &has_avx512},
#endif
};
#elif defined(__aarch64__)
// Advanced SIMD is part of the AArch64 base architecture.
const Path kPaths[] = {{LATTICE_TABLE(neon), &always}};
#else
const Path kPaths[] = {{LATTICE_TABLE(baseline), &always}};
#endif
#undef LATTICE_TABLE

const KernelTable* best() {
  const KernelTable* t = &kPaths[0].table;
  for (const auto& p : kPaths) {
    if (p.supported()) {
      t = &p.table;
    }
  }
  return t;
}

std::atomic<const KernelTable*> active{nullptr};

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) {
    s += (s.empty() ? "" : ", ") + n;
  }
  return s;
}

} // namespace

const KernelTable& active_kernels() {
  const KernelTable* t = active.load(std::memory_order_acquire);
  if (!t) {
    t = best();
    active.store(t, std::memory_order_release);
  }
  return *t;
}

std::string cpu_isa() {
  return active_kernels().name;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> names;
  for (const auto& p : kPaths) {
    if (p.supported()) {
      names.push_back(p.table.name);
    }
  }
  return names;
}

std::vector<std::string> built_isas() {
  std::vector<std::string> names;
  for (const auto& p : kPaths) {
    names.push_back(p.table.name);
  }
  return names;
}

void set_cpu_isa(const std::string& name) {
  for (const auto& p : kPaths) {
    if (name == p.table.name) {
      if (!p.supported()) {
        throw std::invalid_argument(
            "cpu_isa: this CPU does not support '" + name +
            "'; supported: " + join(supported_isas()));
      }
      active.store(&p.table, std::memory_order_release);
      return;
    }
  }
  throw std::invalid_argument(
      "cpu_isa: unknown instruction-set path '" + name +
      "'; this build carries: " + join(built_isas()));
}

void select_cpu_isa_from_env() {
  const char* env = std::getenv("MLX_LATTICE_CPU_ISA");
  if (env && *env) {
    try {
      set_cpu_isa(env);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(
          std::string("MLX_LATTICE_CPU_ISA=") + env + ": " + e.what());
    }
  } else {
    active.store(best(), std::memory_order_release);
  }
}

} // namespace mlx_lattice::cpu
