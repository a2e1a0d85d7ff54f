// Sorting shared by the coordinate table, kernel-map building and the
// derived views of a relation. Every sort here is deterministic: the result
// does not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mlx_lattice {

// Sorts keys ascending and removes duplicates and kEmptyKey entries.
void sort_unique(std::vector<uint64_t>& keys);

// Stable counting sort of items 0 .. n-1 by key(i) in [0, buckets):
// offsets[b] .. offsets[b + 1] is where key b lands (offsets: buckets + 1
// entries) and order[j] the item at position j.
template <typename Offset, typename Order, typename Key>
void counting_sort(int64_t n, int64_t buckets, Key key, Offset* offsets, Order* order) {
  std::fill(offsets, offsets + buckets + 1, Offset(0));
  for (int64_t i = 0; i < n; ++i) {
    ++offsets[key(i) + 1];
  }
  for (int64_t b = 0; b < buckets; ++b) {
    offsets[b + 1] += offsets[b];
  }
  std::vector<Offset> cursor(offsets, offsets + buckets);
  for (int64_t i = 0; i < n; ++i) {
    order[cursor[key(i)]++] = static_cast<Order>(i);
  }
}

} // namespace mlx_lattice
