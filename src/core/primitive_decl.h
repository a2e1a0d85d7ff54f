// The member declarations every primitive of ours repeats, in the manner of
// MLX's DEFINE_* macros (mlx/primitives.h), spelled with the mx:: prefix our
// namespace uses. Each class still defines its own members in its .cpp.
#pragma once

#include <vector>

#include "mlx/primitives.h"

#define LATTICE_EVAL()                                                    \
  void eval_cpu(                                                          \
      const std::vector<mlx::core::array>& in,                           \
      std::vector<mlx::core::array>& out) override;                      \
  void eval_gpu(                                                          \
      const std::vector<mlx::core::array>& in,                           \
      std::vector<mlx::core::array>& out) override;

#define LATTICE_VJP()                                                     \
  std::vector<mlx::core::array> vjp(                                      \
      const std::vector<mlx::core::array>& primals,                      \
      const std::vector<mlx::core::array>& cotangents,                   \
      const std::vector<int>& argnums,                                    \
      const std::vector<mlx::core::array>& outputs) override;

#define LATTICE_JVP()                                                     \
  std::vector<mlx::core::array> jvp(                                      \
      const std::vector<mlx::core::array>& primals,                      \
      const std::vector<mlx::core::array>& tangents,                     \
      const std::vector<int>& argnums) override;

#define LATTICE_OUTPUT_SHAPES()                                           \
  std::vector<mlx::core::Shape> output_shapes(                            \
      const std::vector<mlx::core::array>& inputs) override;

#define LATTICE_NAME(NAME)            \
  const char* name() const override { \
    return NAME;                      \
  }

// For primitives without parameters: any two of a class compute the same.
#define LATTICE_ALWAYS_EQUIVALENT()                                        \
  bool is_equivalent(const mlx::core::Primitive&) const override {        \
    return true;                                                          \
  }
