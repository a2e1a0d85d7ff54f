// Programs of metal/map_build.metal: one thread per coordinate row for the
// table, count and fill; one threadgroup for the scan. Route
// "metal.hash_map" (mlx_lattice/routes.py): mlx_lattice/backends/metal/maps.py
// runs them through map_step (map_primitive.h) when the default device is
// a Metal GPU.
#include "metal/map_build.h"

#include <limits>
#include <stdexcept>

static_assert(sizeof(MapParams) == 18 * 4, "MapParams: 32-bit fields");
static_assert(sizeof(MapSortParams) == 23 * 4, "MapSortParams: 32-bit fields");

namespace mlx_lattice::metal {

Step map_scan_step(const MapParams& p, const char* name) {
  Step s;
  s.kernel = "map_scan";
  s.threads = {MAP_SCAN_THREADS, 1, 1};
  s.buffers = {output(name), bytes(p)};
  return s;
}

int64_t map_table_slots(int64_t n) {
  int64_t cap = 16;
  while (cap < 2 * std::max<int64_t>(n, 8)) {
    cap <<= 1;
  }
  return cap;
}

MapParams map_params(
    int64_t n_in,
    int64_t n_out,
    const std::array<int, 3>& size,
    const std::array<int, 3>& stride,
    const std::array<int, 3>& padding,
    const std::array<int, 3>& dilation,
    bool transposed,
    int64_t edges) {
  const int64_t limit = int64_t(1) << 30;
  if (n_in < 0 || n_out < 0 || n_in > limit || n_out > limit || edges < 0 ||
      edges > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(
        "map building: row counts must lie in [0, 2^30] and the edge count "
        "in [0, 2^31 - 1]; got n_in " + std::to_string(n_in) + ", n_out " +
        std::to_string(n_out) + ", edges " + std::to_string(edges));
  }
  MapParams p{};
  p.n_in = static_cast<int>(n_in);
  p.n_out = static_cast<int>(n_out);
  p.mask = static_cast<int>(map_table_slots(n_in) - 1);
  p.kv = 1;
  p.transposed = transposed ? 1 : 0;
  p.edges = static_cast<int>(edges);
  for (int a = 0; a < 3; ++a) {
    if (size[a] < 1 || size[a] > 64 || stride[a] < 1 || dilation[a] < 1) {
      throw std::invalid_argument(
          "map building: kernel size must lie in [1, 64], stride and dilation "
          "be positive");
    }
    p.size[a] = size[a];
    p.stride[a] = stride[a];
    p.padding[a] = padding[a];
    p.dilation[a] = dilation[a];
    p.kv *= size[a];
  }
  // Edge counts, offsets and the (rows, K) maps are int32: the most edges a
  // map can have, rows * K, must fit (checked here, not truncated later).
  const int64_t most = std::max(n_in, n_out) * int64_t(p.kv);
  if (most > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument(
        "map building: rows * kernel volume must be below 2^31 (int32 edge "
        "indices); got " + std::to_string(std::max(n_in, n_out)) + " rows * " +
        std::to_string(p.kv));
  }
  return p;
}

Program map_table_program(const MapParams& p) {
  const int64_t words = int64_t(p.mask) + 1 + 2;
  Step clear = rows_step("map_table_clear", words, {output("table"), bytes(p)});
  Step insert = rows_step(
      "map_table_insert", p.n_in, {input(0, "coords"), output("table"), bytes(p)});
  return {{}, {clear, insert}};
}

Program map_count_program(const MapParams& p) {
  Step count = rows_step(
      "map_count",
      p.n_out,
      {input(0, "in_coords"), input(1, "table"), input(2, "out_coords"),
       output("offsets"), bytes(p)});
  Step scan = map_scan_step(p, "offsets");
  return {{}, {count, scan}};
}

Program map_fill_program(const MapParams& p) {
  Step fill = rows_step(
      "map_fill",
      p.n_out,
      {input(0, "in_coords"), input(1, "table"), input(2, "out_coords"),
       input(3, "offsets"), output("edges"), bytes(p)});
  return {{}, {fill}};
}

Program map_neighbor_map_program(const MapParams& p) {
  Step s = rows_step(
      "map_neighbor_map",
      p.n_out,
      {input(0, "offsets"), input(1, "in_idx"), input(2, "k_idx"),
       output("nmap"), bytes(p)});
  return {{}, {s}};
}

Program map_out_idx_program(const MapParams& p) {
  Step s = rows_step(
      "map_out_idx", p.n_out, {input(0, "offsets"), output("out_idx"), bytes(p)});
  return {{}, {s}};
}

Program map_kernel_major_program(const MapParams& p) {
  Temp emap{mx::int32, std::max<int64_t>(int64_t(p.n_out) * p.kv, 1)};
  Step edge_map = rows_step(
      "map_edge_map",
      p.n_out,
      {input(0, "offsets"), input(1, "in_idx"), input(2, "k_idx"),
       temp(0, "emap"), bytes(p)});
  Step count;
  count.kernel = "map_column_count";
  count.threads = {MAP_SCAN_THREADS, 1, 1};
  count.groups = {static_cast<uint64_t>(p.kv), 1, 1};
  count.buffers = {temp(0, "emap"), output("view"), bytes(p)};
  // The offsets are a scan of K counts: map_scan over "rows" = offsets.
  MapParams over_k = p;
  over_k.n_out = p.kv;
  Step scan = map_scan_step(over_k, "view");
  Step fill = count;
  fill.kernel = "map_column_fill";
  fill.buffers = {temp(0, "emap"), input(1, "in_idx"), output("view"), bytes(p)};
  return {{emap}, {edge_map, count, scan, fill}};
}

Program map_input_major_program(const MapParams& p) {
  Temp imap{mx::int32, std::max<int64_t>(int64_t(p.n_in) * p.kv, 1)};
  Temp edge_out{mx::int32, std::max<int64_t>(p.edges, 1)};
  Step clear = rows_step(
      "map_fill_minus_one", int64_t(p.n_in) * p.kv, {temp(0, "imap"), bytes(p)});
  Step scatter = rows_step(
      "map_input_edge_map",
      p.n_out,
      {input(0, "offsets"), input(1, "in_idx"), input(2, "k_idx"),
       temp(0, "imap"), temp(1, "edge_out"), bytes(p)});
  Step count = rows_step(
      "map_input_count", p.n_in, {temp(0, "imap"), output("view"), bytes(p)});
  MapParams over_in = p; // map_scan over the n_in counts
  over_in.n_out = p.n_in;
  Step scan = map_scan_step(over_in, "view");
  Step fill = rows_step(
      "map_input_fill",
      p.n_in,
      {temp(0, "imap"), temp(1, "edge_out"), input(2, "k_idx"), output("view"),
       bytes(p)});
  return {{imap, edge_out}, {clear, scatter, count, scan, fill}};
}

namespace {

// Sort parameters over count elements from word `base`.
MapSortParams sort_params(const MapParams& p, int64_t count, int64_t base, const char* what) {
  int64_t padded = MAP_SORT_BLOCK;
  while (padded < count + 1) {
    padded <<= 1;
  }
  if (padded > (int64_t(1) << 30)) {
    throw std::invalid_argument(
        std::string(what) + ": at most 2^30 - 1 elements to sort; got " +
        std::to_string(count));
  }
  MapSortParams s{};
  s.map = p;
  s.count = static_cast<int>(count);
  s.padded = static_cast<int>(padded);
  s.base = static_cast<int>(base);
  return s;
}

// The bitonic network over s.padded elements of `buf`: each block sorted
// in shared memory, then per stage k the passes j >= MAP_SORT_BLOCK over
// the whole buffer and the rest of the stage per block.
void sort_steps(const MapSortParams& s, const Binding& buf, std::vector<Step>& steps) {
  Step block;
  block.kernel = "map_sort_block";
  block.threads = {MAP_SORT_BLOCK / 2, 1, 1};
  block.groups = {static_cast<uint64_t>(s.padded / MAP_SORT_BLOCK), 1, 1};
  block.buffers = {buf, bytes(s, "sort")};
  steps.push_back(block);
  for (int64_t k = 2 * MAP_SORT_BLOCK; k <= s.padded; k <<= 1) {
    for (int64_t j = k / 2; j >= MAP_SORT_BLOCK; j >>= 1) {
      MapSortParams pass = s;
      pass.k = static_cast<int>(k);
      pass.j = static_cast<int>(j);
      steps.push_back(rows_step("map_sort_pass", s.padded / 2, {buf, bytes(pass, "sort")}));
    }
    MapSortParams rest = s;
    rest.k = static_cast<int>(k);
    Step tail = block;
    tail.buffers = {buf, bytes(rest, "sort")};
    steps.push_back(tail);
  }
}

} // namespace

MapSortParams map_sort_params(const MapParams& p) {
  // count = n_in * K is below 2^31 (map_params).
  const int64_t count = int64_t(p.n_in) * p.kv;
  return sort_params(p, count, count + 2, "output support (input rows * kernel volume candidates)");
}

int64_t map_support_words(const MapSortParams& s) {
  return int64_t(s.count) + 2 + 3 * int64_t(s.padded);
}

Program map_support_program(const MapParams& p, bool generative) {
  MapSortParams s = map_sort_params(p);
  s.map.transposed = generative ? 0 : 1;
  std::vector<Step> steps;
  steps.push_back(rows_step(
      "map_support_keys", s.padded, {input(0, "coords"), output("support"), bytes(s, "sort")}));
  sort_steps(s, output("support"), steps);
  steps.push_back(rows_step("map_support_flags", int64_t(s.count) + 1, {output("support"), bytes(s, "sort")}));
  MapParams over = p; // map_scan over the count flags
  over.n_out = s.count;
  Step scan = map_scan_step(over, "support");
  steps.push_back(scan);
  return {{}, steps};
}

Program map_support_fill_program(const MapParams& p) {
  const MapSortParams s = map_sort_params(p);
  Step fill = rows_step(
      "map_support_fill", s.count, {input(0, "support"), output("coords"), bytes(s, "sort")});
  return {{}, {fill}};
}

int64_t map_plan_words(const MapParams& p) {
  const int64_t n = p.n_out;
  return n + 2 * n * p.kv + 2 * ((n + MAP_PLAN_TILE - 1) / MAP_PLAN_TILE);
}

Program map_plan_program(const MapParams& p) {
  if (p.kv > 64) {
    throw std::invalid_argument(
        "the sorted plan needs a kernel volume of at most 64; got " + std::to_string(p.kv));
  }
  const MapSortParams s = sort_params(p, p.n_out, 0, "sorted plan (output rows)");
  Temp elems{mx::int32, 3 * int64_t(s.padded)};
  std::vector<Step> steps;
  steps.push_back(rows_step(
      "map_plan_keys", s.padded, {input(0, "nmap"), temp(0, "elems"), bytes(s, "sort")}));
  sort_steps(s, temp(0, "elems"), steps);
  steps.push_back(rows_step(
      "map_plan_rows", s.count,
      {input(0, "nmap"), temp(0, "elems"), output("plan"), bytes(s, "sort")}));
  steps.push_back(rows_step(
      "map_plan_tiles", ceil_div(s.count, MAP_PLAN_TILE),
      {temp(0, "elems"), output("plan"), bytes(s, "sort")}));
  return {{elems}, steps};
}

Program map_program(const std::string& step, const MapParams& p) {
  if (step == "table") {
    return map_table_program(p);
  }
  if (step == "count") {
    return map_count_program(p);
  }
  if (step == "fill") {
    return map_fill_program(p);
  }
  if (step == "neighbor_map") {
    return map_neighbor_map_program(p);
  }
  if (step == "out_idx") {
    return map_out_idx_program(p);
  }
  if (step == "kernel_major") {
    return map_kernel_major_program(p);
  }
  if (step == "input_major") {
    return map_input_major_program(p);
  }
  if (step == "forward_support" || step == "generative_support") {
    return map_support_program(p, step == "generative_support");
  }
  if (step == "support_fill") {
    return map_support_fill_program(p);
  }
  if (step == "sorted_plan") {
    return map_plan_program(p);
  }
  throw std::invalid_argument(
      "map step must be 'table', 'count', 'fill', 'neighbor_map', 'out_idx', "
      "'kernel_major', 'input_major', 'forward_support', "
      "'generative_support', 'support_fill' or 'sorted_plan', got '" + step +
      "'");
}

} // namespace mlx_lattice::metal
