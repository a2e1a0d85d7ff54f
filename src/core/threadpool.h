// A small persistent thread pool for the CPU kernels and map building.
// Work is split into fixed chunks whose boundaries never depend on the
// thread count, so results are bitwise identical for any number of threads.
#pragma once

#include <cstdint>
#include <functional>

namespace mlx_lattice {

// Rows per task of the parallel loops over coordinates and relation rows.
constexpr int64_t kRowGrain = 4096;

int num_threads();
void set_num_threads(int n);

// Calls fn(begin, end) over [0, n) in chunks of `grain` items (the last one
// shorter). Chunks run concurrently; nested calls run serially.
void parallel_for(
    int64_t n,
    int64_t grain,
    const std::function<void(int64_t, int64_t)>& fn);

} // namespace mlx_lattice
