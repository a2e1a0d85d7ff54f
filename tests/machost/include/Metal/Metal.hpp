// Stand-in for Apple's metal-cpp Metal/Metal.hpp, for compile checks of the
// Mac host code on Linux (tests/test_mac_host_build.py).
//
// Declarations only, with metal-cpp's names, signatures and class hierarchy
// (Buffer is a Resource is an Allocation, so a Buffer* converts where
// metal-cpp converts it and nowhere else), and only the entities that MLX's
// Metal headers and mlx_lattice use. A type or method missing here is missing
// on purpose: add it, from Apple's metal-cpp declaration, when the code
// starts to use it.
#pragma once

#include <Foundation/Foundation.hpp>

namespace MTL {

// MLX names the type only (function constants); no enumerator is used.
enum DataType : NS::UInteger {};

struct Size {
  Size() = default;
  Size(NS::UInteger width, NS::UInteger height, NS::UInteger depth);
  static Size Make(NS::UInteger width, NS::UInteger height, NS::UInteger depth);

  NS::UInteger width;
  NS::UInteger height;
  NS::UInteger depth;
};

class Allocation : public NS::Referencing<Allocation> {};

class Resource : public NS::Referencing<Resource, Allocation> {};

class Buffer : public NS::Referencing<Buffer, Resource> {};

class Fence : public NS::Referencing<Fence> {};

class Function : public NS::Referencing<Function> {};

class LinkedFunctions : public NS::Copying<LinkedFunctions> {};

class Library : public NS::Referencing<Library> {};

class ComputePipelineState : public NS::Referencing<ComputePipelineState> {
 public:
  [[nodiscard]] NS::UInteger maxTotalThreadsPerThreadgroup() const;
};

class CommandEncoder : public NS::Referencing<CommandEncoder> {};

class ComputeCommandEncoder : public NS::Referencing<ComputeCommandEncoder, CommandEncoder> {
 public:
  void setComputePipelineState(const class ComputePipelineState* state);
  void setBytes(const void* bytes, NS::UInteger length, NS::UInteger index);
  void setThreadgroupMemoryLength(NS::UInteger length, NS::UInteger index);
};

class CommandBuffer : public NS::Referencing<CommandBuffer> {};

class CommandQueue : public NS::Referencing<CommandQueue> {};

class ResidencySet : public NS::Referencing<ResidencySet> {};

class Device : public NS::Referencing<Device> {};

} // namespace MTL
