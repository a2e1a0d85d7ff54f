// Kernel-map building: the output support of a convolution and the
// relation (edges out <- in through offset k) between two coordinate sets.
#include <algorithm>
#include <atomic>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "cpu/coords.h"
#include "cpu/kernel_map.h"
#include "core/sort.h"
#include "core/threadpool.h"
#include "mlx/allocator.h"

namespace mlx_lattice {

namespace {

int64_t floor_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// Per-axis candidate coordinates of one row for every kernel offset, and
// their contribution to the packed key (packing is additive per field).
struct AxisCandidates {
  int n = 0;
  bool valid[64];    // an integer coordinate inside the range
  bool overflow[64]; // an integer coordinate outside the range
  uint64_t part[64];
};

// conv form: v = s*c - p + dil*d; transposed form: v = (c + p - dil*d) / s
// when divisible; generative form: v = s*c - p + dil*d (inputs to outputs).
enum class Form { Conv, Transposed };

inline void axis_candidates(
    int64_t c,
    int a,
    const KernelSpec& spec,
    Form form,
    AxisCandidates& out) {
  out.n = spec.size[a];
  for (int d = 0; d < spec.size[a]; ++d) {
    int64_t v;
    bool ok = true;
    if (form == Form::Conv) {
      v = int64_t(spec.stride[a]) * c - spec.padding[a] +
          int64_t(spec.dilation[a]) * d;
    } else {
      int64_t t = c + spec.padding[a] - int64_t(spec.dilation[a]) * d;
      ok = floor_mod(t, spec.stride[a]) == 0;
      v = ok ? t / spec.stride[a] : 0;
    }
    const bool inside = coord_in_range(v);
    out.valid[d] = ok && inside;
    out.overflow[d] = ok && !inside;
    out.part[d] = out.valid[d] ? key_axis(a, v) : 0;
  }
}

void check_kernel(const KernelSpec& spec) {
  for (int a = 0; a < 3; ++a) {
    if (spec.size[a] > 64) {
      throw std::invalid_argument("kernel sizes above 64 are not supported");
    }
  }
}

// Keys of every offset of one row (kEmptyKey where the candidate is invalid),
// in weight order (dx outer, dz inner). Returns whether some candidate was an
// integer coordinate outside the range.
inline bool row_keys(
    const int32_t* row,
    const KernelSpec& spec,
    Form form,
    uint64_t* keys,
    AxisCandidates ax[3]) {
  bool overflow = false;
  for (int a = 0; a < 3; ++a) {
    axis_candidates(row[a + 1], a, spec, form, ax[a]);
    for (int d = 0; d < ax[a].n; ++d) {
      overflow |= ax[a].overflow[d];
    }
  }
  const uint64_t bpart = key_batch(row[0]);
  int k = 0;
  for (int dx = 0; dx < ax[0].n; ++dx) {
    for (int dy = 0; dy < ax[1].n; ++dy) {
      const bool vxy = ax[0].valid[dx] && ax[1].valid[dy];
      const uint64_t pxy = bpart + ax[0].part[dx] + ax[1].part[dy];
      for (int dz = 0; dz < ax[2].n; ++dz) {
        keys[k++] = vxy && ax[2].valid[dz] ? pxy + ax[2].part[dz] : kEmptyKey;
      }
    }
  }
  return overflow;
}

// A kernel that tiles the grid: size = stride on every axis, no padding or
// dilation (the usual 2x2x2 stride-2 layer). Each input then reaches exactly
// one output, its parent floor(p / s), through offset p mod s.
bool tiles(const KernelSpec& spec) {
  for (int a = 0; a < 3; ++a) {
    if (spec.size[a] != spec.stride[a] || spec.padding[a] != 0 || spec.dilation[a] != 1) {
      return false;
    }
  }
  return true;
}

inline int64_t floor_div(int64_t a, int64_t b) {
  return (a - floor_mod(a, b)) / b;
}

// The parent key of an input row under a tiling kernel, and the offset index
// (weight order: dx outer, dz inner) through which it reaches it.
inline uint64_t parent_key(const int32_t* r, const KernelSpec& spec, int* k) {
  int64_t q[3];
  int idx = 0;
  for (int a = 0; a < 3; ++a) {
    q[a] = floor_div(r[a + 1], spec.stride[a]);
    idx = idx * spec.size[a] + static_cast<int>(floor_mod(r[a + 1], spec.stride[a]));
  }
  *k = idx;
  return pack_key(r[0], q[0], q[1], q[2]);
}

// Every output reached from the inputs, sorted and unique. Generative
// outputs are q = s*p - pad + dil*d (the conv form applied to inputs);
// forward outputs are q = (p + pad - dil*d) / s where divisible. A reachable
// output outside the coordinate range is an error.
mx::array support(const CoordTable& in, const KernelSpec& spec, bool generative) {
  check_kernel(spec);
  const int kv = spec.volume();
  const int64_t n = in.size();
  const int32_t* c = in.coord_data();
  if (!generative && tiles(spec)) {
    // One parent per input (inside the range whenever the input is).
    std::vector<uint64_t> parents(n);
    parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
      int k;
      for (int64_t i = b; i < e; ++i) {
        parents[i] = parent_key(c + 4 * i, spec, &k);
      }
    });
    sort_unique(parents);
    return coords_from_keys(parents);
  }
  std::vector<uint64_t> keys(n * kv);
  const Form form = generative ? Form::Conv : Form::Transposed;
  std::atomic<int64_t> bad_row{n};
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    AxisCandidates ax[3];
    for (int64_t i = b; i < e; ++i) {
      if (row_keys(c + 4 * i, spec, form, keys.data() + i * kv, ax)) {
        int64_t cur = bad_row.load();
        while (i < cur && !bad_row.compare_exchange_weak(cur, i)) {
        }
      }
    }
  });
  if (bad_row.load() < n) {
    const int32_t* p = c + 4 * bad_row.load();
    throw std::invalid_argument(
        "output coordinate reached from input " + tuple4(p) +
        " leaves the supported range: x/y/z in [" + std::to_string(kCoordMin) +
        ", " + std::to_string(kCoordMax) + "]");
  }
  // Drop invalid candidates before sorting (strided maps reach few outputs).
  keys.erase(std::remove(keys.begin(), keys.end(), kEmptyKey), keys.end());
  sort_unique(keys);
  return coords_from_keys(keys);
}

} // namespace

bool symmetric_geometry(const KernelSpec& spec, bool transposed) {
  if (transposed) {
    return false;
  }
  for (int a = 0; a < 3; ++a) {
    if (spec.stride[a] != 1 || spec.size[a] % 2 == 0 ||
        spec.padding[a] != spec.dilation[a] * (spec.size[a] - 1) / 2) {
      return false;
    }
  }
  return true;
}

mx::array forward_support(const CoordTable& in, const KernelSpec& spec) {
  return support(in, spec, false);
}

mx::array generative_support(const CoordTable& in, const KernelSpec& spec) {
  return support(in, spec, true);
}

namespace {

// The relation of a dense (m, kv) neighbour map (-1 where absent): CSR in
// offset order, as build_relation orders edges. Rows are compacted without
// branches through a per-task buffer (hits are unpredictable).
std::shared_ptr<Relation> compact(
    const int32_t* nm,
    int64_t n,
    int64_t m,
    int kv,
    const std::string& kind) {
  mx::array offsets = make_int32(m + 1);
  int32_t* off = offsets.data<int32_t>();
  off[0] = 0;
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      int32_t count = 0;
      for (int k = 0; k < kv; ++k) {
        count += nm[q * kv + k] >= 0;
      }
      off[q + 1] = count;
    }
  });
  for (int64_t q = 0; q < m; ++q) {
    off[q + 1] += off[q];
  }
  mx::array in_idx = make_int32(off[m]);
  mx::array k_idx = make_int32(off[m]);
  int32_t* ip = in_idx.data<int32_t>();
  int32_t* kp = k_idx.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    std::vector<int32_t> bi(kv), bk(kv);
    for (int64_t q = b; q < e; ++q) {
      const int32_t* row = nm + q * kv;
      int j = 0;
      for (int k = 0; k < kv; ++k) {
        bi[j] = row[k];
        bk[j] = k;
        j += row[k] >= 0;
      }
      std::copy(bi.begin(), bi.begin() + j, ip + off[q]);
      std::copy(bk.begin(), bk.begin() + j, kp + off[q]);
    }
  });
  return std::make_shared<Relation>(kind, n, m, kv, offsets, in_idx, k_idx);
}

// A symmetric geometry onto the input's own rows (the same buffer).
bool onto_itself_symmetric(const CoordTable& in, const mx::array& out, const KernelSpec& spec, bool transposed) {
  return out.shape(0) == in.size() && (in.size() == 0 || out.data<int32_t>() == in.coord_data()) &&
      symmetric_geometry(spec, transposed);
}

// Symmetric relations look up only the first half of the offsets and mirror
// each hit into the neighbour map (distinct slots: no two rows write the same
// one), then compact the map into CSR in offset order.
std::shared_ptr<Relation> build_symmetric(
    const CoordTable& in,
    const KernelSpec& spec,
    const std::string& kind) {
  const int64_t n = in.size();
  const int kv = spec.volume();
  const int center = kv / 2;
  const int32_t* c = in.coord_data();
  mx::array nmap = make_int32(n, kv);
  int32_t* nm = nmap.data<int32_t>();
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    std::fill(nm + b * kv, nm + e * kv, -1);
  });
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    // Several rows per batch of lookups: more misses in flight at once.
    const int group = std::max(1, 256 / std::max(center, 1));
    std::vector<uint64_t> keys(int64_t(group) * kv);
    std::vector<int32_t> found(int64_t(group) * kv);
    AxisCandidates ax[3];
    for (int64_t q0 = b; q0 < e; q0 += group) {
      const int rows = static_cast<int>(std::min<int64_t>(group, e - q0));
      for (int i = 0; i < rows; ++i) {
        // Rows are packed `center` apart: each writes all kv keys, and the
        // next row overwrites only the mirrored half, which is not queried.
        row_keys(c + 4 * (q0 + i), spec, Form::Conv, keys.data() + int64_t(i) * center, ax);
      }
      in.find_many(keys.data(), rows * center, found.data());
      for (int i = 0; i < rows; ++i) {
        const int64_t q = q0 + i;
        for (int k = 0; k < center; ++k) {
          const int32_t p = found[int64_t(i) * center + k];
          if (p >= 0) {
            nm[q * kv + k] = p;
            nm[int64_t(p) * kv + (kv - 1 - k)] = static_cast<int32_t>(q);
          }
        }
        nm[q * kv + center] = static_cast<int32_t>(q);
      }
    }
  });
  auto rel = compact(nm, n, n, kv, kind);
  rel->set_neighbor_map(nmap);
  rel->set_symmetric();
  return rel;
}

} // namespace

namespace {

// A tiling kernel onto its own support (unique outputs, each reached): every
// input looks up its one parent in a table of the outputs (n lookups in a
// table of the smaller set, instead of kv per output in the inputs'), fills
// the neighbour map's (parent, offset) slot, and the map is compacted into
// CSR in offset order, as build_relation orders edges.
std::shared_ptr<Relation> build_tiled(
    const CoordTable& in,
    const mx::array& out_coords,
    const KernelSpec& spec,
    const std::string& kind,
    const CoordTable* out_table) {
  const bool same = out_table != nullptr &&
      out_table->size() == out_coords.shape(0) &&
      (out_table->size() == 0 ||
       out_table->coord_data() == out_coords.data<int32_t>());
  std::optional<CoordTable> own;
  if (!same) {
    own.emplace(out_coords);
  }
  const CoordTable& out = same ? *out_table : *own;
  const int64_t n = in.size(), m = out.size();
  const int kv = spec.volume();
  const int32_t* c = in.coord_data();
  mx::array nmap = make_int32(m, kv);
  int32_t* nm = nmap.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    std::fill(nm + b * kv, nm + e * kv, -1);
  });
  // Distinct inputs have distinct (parent, offset) slots: no two tasks
  // write the same one.
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    constexpr int kGroup = 64;
    uint64_t keys[kGroup];
    int ks[kGroup];
    int32_t found[kGroup];
    for (int64_t i0 = b; i0 < e; i0 += kGroup) {
      const int rows = static_cast<int>(std::min<int64_t>(kGroup, e - i0));
      for (int i = 0; i < rows; ++i) {
        keys[i] = parent_key(c + 4 * (i0 + i), spec, &ks[i]);
      }
      out.find_many(keys, rows, found);
      for (int i = 0; i < rows; ++i) {
        if (found[i] >= 0) {
          nm[int64_t(found[i]) * kv + ks[i]] = static_cast<int32_t>(i0 + i);
        }
      }
    }
  });
  auto rel = compact(nm, n, m, kv, kind);
  rel->set_neighbor_map(nmap);
  return rel;
}

} // namespace

std::shared_ptr<Relation> build_relation(
    const CoordTable& in,
    const mx::array& out_coords_in,
    const KernelSpec& spec,
    bool transposed,
    const std::string& kind,
    const CoordTable* out_table) {
  check_kernel(spec);
  mx::array out_coords = evaluated(out_coords_in);
  check_coords(out_coords, "output coordinates");
  if (onto_itself_symmetric(in, out_coords, spec, transposed)) {
    return build_symmetric(in, spec, kind);
  }
  // "forward" relations are built onto the support of the same kernel
  // (unique, valid outputs): the tiled build needs exactly that.
  if (!transposed && kind == "forward" && tiles(spec)) {
    return build_tiled(in, out_coords, spec, kind, out_table);
  }
  const int64_t m = out_coords.shape(0);
  const int kv = spec.volume();
  const int32_t* oc = m > 0 ? out_coords.data<int32_t>() : nullptr;
  const Form form = transposed ? Form::Transposed : Form::Conv;

  // Pass 1: per chunk of output rows, collect (in, k) pairs in edge order.
  const int64_t n_chunks = (m + kRowGrain - 1) / kRowGrain;
  std::vector<std::vector<int32_t>> chunk_in(n_chunks), chunk_k(n_chunks);
  mx::array offsets = make_int32(m + 1);
  int32_t* off = offsets.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    auto& ins = chunk_in[b / kRowGrain];
    auto& ks = chunk_k[b / kRowGrain];
    ins.resize((e - b) * kv);
    ks.resize((e - b) * kv);
    int64_t n = 0;
    // Several rows per batch of lookups: more misses in flight at once.
    const int group = std::max(1, 256 / kv);
    std::vector<uint64_t> keys(int64_t(group) * kv);
    std::vector<int32_t> found(int64_t(group) * kv);
    AxisCandidates ax[3];
    for (int64_t r0 = b; r0 < e; r0 += group) {
      const int rows = static_cast<int>(std::min<int64_t>(group, e - r0));
      for (int i = 0; i < rows; ++i) {
        const int32_t* q = oc + 4 * (r0 + i);
        uint64_t* kr = keys.data() + int64_t(i) * kv;
        if (batch_in_range(q[0])) {
          row_keys(q, spec, form, kr, ax);
        } else {
          std::fill(kr, kr + kv, kEmptyKey);
        }
      }
      in.find_many(keys.data(), rows * kv, found.data());
      for (int i = 0; i < rows; ++i) {
        const int64_t before = n;
        const int32_t* f = found.data() + int64_t(i) * kv;
        for (int k = 0; k < kv; ++k) {
          ins[n] = f[k];
          ks[n] = k;
          n += f[k] >= 0;
        }
        off[r0 + i + 1] = static_cast<int32_t>(n - before);
      }
    }
    ins.resize(n);
    ks.resize(n);
  });
  off[0] = 0;
  for (int64_t r = 0; r < m; ++r) {
    off[r + 1] += off[r];
  }
  const int64_t e_total = off[m];
  mx::array in_idx = make_int32(e_total);
  mx::array k_idx = make_int32(e_total);
  int32_t* ip = in_idx.data<int32_t>();
  int32_t* kp = k_idx.data<int32_t>();
  parallel_for(n_chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t start = off[c * kRowGrain];
      std::copy(chunk_in[c].begin(), chunk_in[c].end(), ip + start);
      std::copy(chunk_k[c].begin(), chunk_k[c].end(), kp + start);
    }
  });
  return std::make_shared<Relation>(
      kind, in.size(), m, kv, offsets, in_idx, k_idx);
}

} // namespace mlx_lattice
