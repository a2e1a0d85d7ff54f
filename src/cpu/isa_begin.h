// Opens the compilation of one instruction-set path of the CPU kernels.
//
// Each kernel translation unit is compiled once per path with
// LATTICE_ISA_ID set (see CMakeLists.txt): 0 baseline (x86-64 SSE2, or the
// target's default), 1 AVX2 + FMA + F16C, 2 AVX-512, 3 NEON. Everything the
// kernels define lives in namespace mlx_lattice::cpu::LATTICE_ISA.
//
// The instruction set is raised by a target pragma *after* the system and
// MLX headers, not by command-line flags: inline and template functions of
// those headers (std::vector<float>, half conversions) are then compiled for
// the baseline in every path, so the linker's choice among their duplicate
// copies can never hand AVX-512 code to a baseline CPU.
//
// Include after every other header except the project's cpu/ headers, and
// close with cpu/isa_end.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "core/threadpool.h"
#include "cpu/convert_base.h"
#include "cpu/isa.h"
#include "mlx/types/bf16.h"
#include "mlx/types/half_types.h"
#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#if !defined(LATTICE_ISA_ID)
#error "compile the CPU kernels with LATTICE_ISA_ID (see CMakeLists.txt)"
#endif

#if LATTICE_ISA_ID == 0
#define LATTICE_ISA baseline
#elif LATTICE_ISA_ID == 1
#define LATTICE_ISA avx2
#elif LATTICE_ISA_ID == 2
#define LATTICE_ISA avx512
#elif LATTICE_ISA_ID == 3
#if !defined(__ARM_NEON)
#error "the NEON path needs an Arm target"
#endif
#define LATTICE_ISA neon
#else
#error "unknown LATTICE_ISA_ID"
#endif

// (Target pragmas take no macros: the strings are spelled out.)
#if LATTICE_ISA_ID == 1 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif LATTICE_ISA_ID == 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#elif LATTICE_ISA_ID == 2 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#elif LATTICE_ISA_ID == 2
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif
