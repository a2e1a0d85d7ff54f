// Interface between the MSL shim (inlined into each compiled .metal file)
// and the executor in runtime.cpp. Everything here runs on one OS thread;
// GPU threads are cooperative fibers that switch only inside rt_sync().
#pragma once

#include <cstddef>
#include <cstdint>

namespace mh {

enum class Sync : int {
  none = 0,
  threadgroup = 1, // threadgroup_barrier: the whole threadgroup
  simd = 2,        // simd collectives, simdgroup_barrier, matrix ops
};

// Built-in values a kernel parameter can ask for.
enum class Builtin : int {
  thread_position_in_grid,
  threadgroup_position_in_grid,
  thread_position_in_threadgroup,
  threads_per_threadgroup,
  threadgroups_per_grid,
  threads_per_grid,
  thread_index_in_threadgroup,
  thread_index_in_simdgroup,
  simdgroup_index_in_threadgroup,
  simdgroups_per_threadgroup,
  threads_per_simdgroup,
  thread_index_in_quadgroup,
  quadgroup_index_in_threadgroup,
  quadgroups_per_threadgroup,
  dispatch_threads_per_threadgroup,  // the launch's threadgroup size (an edge group of a grid dispatch may be smaller)
  dispatch_simdgroups_per_threadgroup,
  dispatch_quadgroups_per_threadgroup,
  grid_origin,  // of a kernel's stage_in region; no stage_in here: 0
  grid_size,    // of that region: the grid
  count
};

// Values of the current GPU thread.
struct ThreadInfo {
  uint32_t grid_pos[3];
  uint32_t group_pos[3];
  uint32_t local_pos[3];
  uint32_t group_size[3];
  uint32_t groups[3];
  uint32_t grid_size[3];
  uint32_t local_index;
  uint32_t lane;
  uint32_t simd_index;
  uint32_t simd_count;
  uint32_t dispatch_size[3];  // the threadgroup size the launch asked for
};

constexpr int kSimdWidth = 32;
constexpr int kSlotBytes = 64; // largest value a simd collective exchanges

// The thread now running (set by the executor before each switch).
extern ThreadInfo* g_thread;

[[noreturn]] void rt_fail(const char* fmt, ...)
    __attribute__((format(printf, 1, 2)));

// Park the current thread at a synchronisation point until the executor
// releases it. `site` identifies the call site (file, line, column).
void rt_sync(
    Sync kind,
    const char* what,
    const char* file,
    unsigned line,
    unsigned column);

// Simd exchange: rt_simd_slot() is this lane's slot for the next
// collective; after rt_sync(Sync::simd, ...) rt_simd_result() returns the
// 32 slots of that collective and the mask of lanes that took part.
void* rt_simd_slot();
const unsigned char* rt_simd_result(uint64_t* active_mask);

// Storage of a `threadgroup` variable (declaration site `id`), shared by the
// threads of the running threadgroup and filled with 0xFF when the group
// starts.
void* rt_tg_var(int id, size_t bytes, size_t align, const char* name);
// Multiply-adds a thread did on the matrix units (counted per dispatch).
void rt_count_matrix_macs(uint64_t n);

// Buffer bound at `index` (fails the launch if none is bound or it is smaller
// than `min_bytes`); threadgroup buffers through rt_tg_buffer.
void* rt_buffer(int index, size_t min_bytes, const char* param);
void* rt_tg_buffer(int index, const char* param);

// Storage for a buffer parameter that a false function constant removes from
// the pipeline: one read-only page of zeros (a kernel's dead reads through it
// see 0, a write faults).
void* rt_absent_buffer();

// The value of function constant `index` at this dispatch (`size` bytes into
// `out`); false where the dispatch gives it none.
bool rt_function_constant(int index, void* out, size_t size);

// Kernel registry, filled by static initialisers in each compiled .metal.
using Invoke = void (*)();
void rt_register(
    const char* host_name,
    const char* function,
    Invoke invoke,
    int max_threads);

} // namespace mh
