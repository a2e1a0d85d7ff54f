#include "relation.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <stdexcept>

#include "mlx/allocator.h"
#include "threadpool.h"

namespace mlx_lattice {

namespace {

constexpr int64_t kRowGrain = 4096;

uint64_t next_pow2(uint64_t v) {
  uint64_t p = 16;
  while (p < v) {
    p <<= 1;
  }
  return p;
}

int64_t floor_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r < 0 ? r + b : r;
}

// LSD radix sort of a range on 16-bit digits; digits on which all keys agree
// are skipped.
void radix_sort(uint64_t* keys, uint64_t* tmp, size_t n) {
  std::vector<uint32_t> count(1 << 16);
  for (int shift = 0; shift < 64; shift += 16) {
    std::fill(count.begin(), count.end(), 0);
    for (size_t i = 0; i < n; ++i) {
      ++count[(keys[i] >> shift) & 0xFFFF];
    }
    if (n == 0 || count[(keys[0] >> shift) & 0xFFFF] == n) {
      continue;
    }
    uint32_t sum = 0;
    for (auto& c : count) {
      uint32_t v = c;
      c = sum;
      sum += v;
    }
    for (size_t i = 0; i < n; ++i) {
      tmp[count[(keys[i] >> shift) & 0xFFFF]++] = keys[i];
    }
    std::copy(tmp, tmp + n, keys);
  }
}

// Unique sorted keys without kEmptyKey entries. Fixed parts (independent of
// the thread count) are deduplicated and sorted in parallel, then merged
// pairwise; the result is the same for any number of threads.
void sort_unique(std::vector<uint64_t>& keys) {
  constexpr int64_t kParts = 8;
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<int64_t> bound(kParts + 1);
  for (int64_t p = 0; p <= kParts; ++p) {
    bound[p] = n * p / kParts;
  }
  std::vector<uint64_t> tmp(keys.size());
  std::vector<int64_t> len(kParts);
  parallel_for(kParts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint64_t* k = keys.data() + bound[p];
      const int64_t m = bound[p + 1] - bound[p];
      radix_sort(k, tmp.data() + bound[p], m);
      int64_t u = 0;
      for (int64_t i = 0; i < m; ++i) {
        if (k[i] != kEmptyKey && (u == 0 || k[u - 1] != k[i])) {
          k[u++] = k[i];
        }
      }
      len[p] = u;
    }
  });
  // Pairwise merges of the deduplicated runs: 8 -> 4 -> 2 -> 1.
  for (int64_t width = 1; width < kParts; width *= 2) {
    const int64_t pairs = kParts / (2 * width);
    parallel_for(pairs, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t a = 2 * width * q, b = a + width;
        uint64_t* a0 = keys.data() + bound[a];
        uint64_t* b0 = keys.data() + bound[b];
        uint64_t* out = tmp.data() + bound[a];
        uint64_t* end = std::set_union(a0, a0 + len[a], b0, b0 + len[b], out);
        len[a] = end - out;
        std::copy(out, end, a0);
      }
    });
  }
  keys.resize(len[0]);
}

void check_coords(const mx::array& c, const char* name) {
  if (c.ndim() != 2 || c.shape(1) != 4 || c.dtype() != mx::int32) {
    throw std::invalid_argument(
        std::string(name) + " must be an (N, 4) int32 array");
  }
  if (c.size() > 0 && !c.flags().row_contiguous) {
    throw std::invalid_argument(std::string(name) + " must be row-contiguous");
  }
}

mx::array evaluated(const mx::array& a) {
  mx::array b = a;
  b.eval();
  return b;
}

mx::array coords_from_keys(const std::vector<uint64_t>& keys) {
  int64_t m = static_cast<int64_t>(keys.size());
  mx::array out(
      mx::allocator::malloc(std::max<int64_t>(m, 1) * 4 * sizeof(int32_t)),
      {static_cast<int>(m), 4},
      mx::int32);
  int32_t* p = out.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      unpack_key(keys[i], p + 4 * i);
    }
  });
  return out;
}

// Messages are built with std::to_string, not iostreams: formatting numbers
// through a stream crashed an extension built against MLX's CUDA wheel,
// whose link gave the module its own copy of the C++ runtime.
std::string tuple4(const int32_t* c) {
  return "(" + std::to_string(c[0]) + ", " + std::to_string(c[1]) + ", " +
      std::to_string(c[2]) + ", " + std::to_string(c[3]) + ")";
}

[[noreturn]] void range_error(const int32_t* c, const char* what) {
  throw std::invalid_argument(
      std::string(what) + " coordinate " + tuple4(c) +
      " leaves the supported range: batch in [0, " + std::to_string(kBatchLimit) +
      "), x/y/z in [" + std::to_string(kCoordMin) + ", " +
      std::to_string(kCoordMax) + "]");
}

} // namespace

mx::array make_int32(int64_t n) {
  return mx::array(
      mx::allocator::malloc(std::max<int64_t>(n, 1) * sizeof(int32_t)),
      {static_cast<int>(n)},
      mx::int32);
}

CoordTable::CoordTable(const mx::array& coords) : coords_(evaluated(coords)) {
  check_coords(coords_, "coords");
  n_ = coords_.shape(0);
  uint64_t cap = next_pow2(2 * static_cast<uint64_t>(std::max<int64_t>(n_, 8)));
  mask_ = cap - 1;
  slots_.assign(cap, Slot{kEmptyKey, -1, 0});
  const int32_t* c = n_ > 0 ? coords_.data<int32_t>() : nullptr;
  for (int64_t i = 0; i < n_; ++i) {
    const int32_t* r = c + 4 * i;
    if (!in_range(r[0], r[1], r[2], r[3])) {
      range_error(r, "input");
    }
    uint64_t key = pack_key(r[0], r[1], r[2], r[3]);
    uint64_t h = hash(key) & mask_;
    while (slots_[h].key != kEmptyKey) {
      if (slots_[h].key == key) {
        throw std::invalid_argument(
            "coords contain duplicate rows " + std::to_string(slots_[h].val) +
            " and " + std::to_string(i) + " at " + tuple4(r) +
            "; merge duplicates with mlx_lattice.sparse_quantize first");
      }
      h = (h + 1) & mask_;
    }
    slots_[h] = Slot{key, static_cast<int32_t>(i), 0};
  }
}

mx::array CoordTable::lookup(const mx::array& queries_in) const {
  mx::array queries = evaluated(queries_in);
  check_coords(queries, "queries");
  int64_t m = queries.shape(0);
  mx::array out = make_int32(m);
  int32_t* o = out.data<int32_t>();
  const int32_t* q = m > 0 ? queries.data<int32_t>() : nullptr;
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int32_t* r = q + 4 * i;
      o[i] = in_range(r[0], r[1], r[2], r[3])
          ? find(pack_key(r[0], r[1], r[2], r[3]))
          : -1;
    }
  });
  return out;
}

namespace {

// Per-axis candidate coordinates of one row for every kernel offset, and
// their contribution to the packed key (packing is additive per field).
struct AxisCandidates {
  int n = 0;
  bool valid[64];    // an integer coordinate inside the range
  bool overflow[64]; // an integer coordinate outside the range
  uint64_t part[64];
};

constexpr int kShift[3] = {34, 17, 0};

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
    const bool inside = v >= kCoordMin && v <= kCoordMax;
    out.valid[d] = ok && inside;
    out.overflow[d] = ok && !inside;
    out.part[d] = out.valid[d] ? uint64_t(v - kCoordMin) << kShift[a] : 0;
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
  const uint64_t bpart = uint64_t(row[0]) << 51;
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

// Every output reached from the inputs, sorted and unique. Generative
// outputs are q = s*p - pad + dil*d (the conv form applied to inputs);
// forward outputs are q = (p + pad - dil*d) / s where divisible. A reachable
// output outside the coordinate range is an error.
mx::array support(const CoordTable& in, const KernelSpec& spec, bool generative) {
  check_kernel(spec);
  const int kv = spec.volume();
  const int64_t n = in.size();
  std::vector<uint64_t> keys(n * kv);
  const int32_t* c = in.coord_data();
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

mx::array forward_support(const CoordTable& in, const KernelSpec& spec) {
  return support(in, spec, false);
}

mx::array generative_support(const CoordTable& in, const KernelSpec& spec) {
  return support(in, spec, true);
}

namespace {

// A centred odd kernel at stride 1 mapping a set onto itself: q reaches p
// through offset k exactly when p reaches q through K - 1 - k.
bool symmetric(const CoordTable& in, const mx::array& out, const KernelSpec& spec, bool transposed) {
  if (transposed || out.shape(0) != in.size() ||
      (in.size() > 0 && out.data<int32_t>() != in.coord_data())) {
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
  mx::array nmap(
      mx::allocator::malloc(std::max<int64_t>(n * kv, 1) * sizeof(int32_t)),
      {static_cast<int>(n), kv},
      mx::int32);
  int32_t* nm = nmap.data<int32_t>();
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    std::fill(nm + b * kv, nm + e * kv, -1);
  });
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    // Several rows per batch of lookups: more misses in flight at once.
    const int group = std::max(1, 64 / std::max(center, 1));
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
  mx::array offsets = make_int32(n + 1);
  int32_t* off = offsets.data<int32_t>();
  off[0] = 0;
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      int32_t count = 0;
      for (int k = 0; k < kv; ++k) {
        count += nm[q * kv + k] >= 0;
      }
      off[q + 1] = count;
    }
  });
  for (int64_t q = 0; q < n; ++q) {
    off[q + 1] += off[q];
  }
  mx::array in_idx = make_int32(off[n]);
  mx::array k_idx = make_int32(off[n]);
  int32_t* ip = in_idx.data<int32_t>();
  int32_t* kp = k_idx.data<int32_t>();
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      int32_t j = off[q];
      for (int k = 0; k < kv; ++k) {
        const int32_t p = nm[q * kv + k];
        if (p >= 0) {
          ip[j] = p;
          kp[j++] = k;
        }
      }
    }
  });
  auto rel = std::make_shared<Relation>(kind, n, n, kv, offsets, in_idx, k_idx);
  rel->set_neighbor_map(nmap);
  return rel;
}

} // namespace

std::shared_ptr<Relation> build_relation(
    const CoordTable& in,
    const mx::array& out_coords_in,
    const KernelSpec& spec,
    bool transposed,
    const std::string& kind) {
  check_kernel(spec);
  mx::array out_coords = evaluated(out_coords_in);
  check_coords(out_coords, "output coordinates");
  if (symmetric(in, out_coords, spec, transposed)) {
    return build_symmetric(in, spec, kind);
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
    const int group = std::max(1, 64 / kv);
    std::vector<uint64_t> keys(int64_t(group) * kv);
    std::vector<int32_t> found(int64_t(group) * kv);
    AxisCandidates ax[3];
    for (int64_t r0 = b; r0 < e; r0 += group) {
      const int rows = static_cast<int>(std::min<int64_t>(group, e - r0));
      for (int i = 0; i < rows; ++i) {
        const int32_t* q = oc + 4 * (r0 + i);
        uint64_t* kr = keys.data() + int64_t(i) * kv;
        if (q[0] >= 0 && q[0] < kBatchLimit) {
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

Relation::Relation(
    std::string kind,
    int64_t n_in,
    int64_t n_out,
    int64_t k,
    mx::array out_offsets,
    mx::array in_idx,
    mx::array k_idx)
    : kind_(std::move(kind)),
      n_in_(n_in),
      n_out_(n_out),
      k_(k),
      e_(in_idx.shape(0)),
      out_offsets_(std::move(out_offsets)),
      in_idx_(std::move(in_idx)),
      k_idx_(std::move(k_idx)) {}

const mx::array& Relation::out_idx() {
  std::call_once(out_once_, [&] {
    mx::array a = make_int32(e_);
    int32_t* o = a.data<int32_t>();
    const int32_t* off = out_offsets_.data<int32_t>();
    parallel_for(n_out_, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        std::fill(o + off[r], o + off[r + 1], static_cast<int32_t>(r));
      }
    });
    out_idx_ = a;
  });
  return *out_idx_;
}

const Relation::KernelMajor& Relation::kernel_major() {
  std::call_once(k_once_, [&] {
    const int32_t* out = out_idx().data<int32_t>();
    const int32_t* in = in_idx_.data<int32_t>();
    const int32_t* kk = k_idx_.data<int32_t>();
    mx::array offsets = make_int32(k_ + 1);
    mx::array perm = make_int32(e_);
    mx::array v_in = make_int32(e_);
    mx::array v_out = make_int32(e_);
    int32_t* off = offsets.data<int32_t>();
    std::fill(off, off + k_ + 1, 0);
    for (int64_t e = 0; e < e_; ++e) {
      ++off[kk[e] + 1];
    }
    for (int64_t k = 0; k < k_; ++k) {
      off[k + 1] += off[k];
    }
    std::vector<int64_t> cursor(off, off + k_);
    int32_t* p = perm.data<int32_t>();
    for (int64_t e = 0; e < e_; ++e) {
      p[cursor[kk[e]]++] = static_cast<int32_t>(e);
    }
    int32_t* vi = v_in.data<int32_t>();
    int32_t* vo = v_out.data<int32_t>();
    for (int64_t j = 0; j < e_; ++j) {
      vi[j] = in[p[j]];
      vo[j] = out[p[j]];
    }
    k_view_ = KernelMajor{offsets, perm, v_in, v_out};
  });
  return *k_view_;
}

const Relation::InputMajor& Relation::input_major() {
  std::call_once(in_once_, [&] {
    // Stable counting sort of the (k, out)-ordered view by input row gives
    // edges ordered by (in, k).
    const KernelMajor& km = kernel_major();
    const int32_t* kp = km.perm.data<int32_t>();
    const int32_t* kin = km.in_idx.data<int32_t>();
    const int32_t* kout = km.out_idx.data<int32_t>();
    const int32_t* kk = k_idx_.data<int32_t>();
    mx::array offsets = make_int32(n_in_ + 1);
    mx::array perm = make_int32(e_);
    mx::array v_out = make_int32(e_);
    mx::array v_k = make_int32(e_);
    int32_t* off = offsets.data<int32_t>();
    std::fill(off, off + n_in_ + 1, 0);
    for (int64_t j = 0; j < e_; ++j) {
      ++off[kin[j] + 1];
    }
    for (int64_t i = 0; i < n_in_; ++i) {
      off[i + 1] += off[i];
    }
    std::vector<int32_t> cursor(off, off + n_in_);
    int32_t* p = perm.data<int32_t>();
    int32_t* vo = v_out.data<int32_t>();
    int32_t* vk = v_k.data<int32_t>();
    for (int64_t j = 0; j < e_; ++j) {
      int32_t dst = cursor[kin[j]]++;
      int32_t e = kp[j];
      p[dst] = e;
      vo[dst] = kout[j];
      vk[dst] = kk[e];
    }
    in_view_ = InputMajor{offsets, perm, v_out, v_k};
  });
  return *in_view_;
}

void Relation::set_neighbor_map(mx::array nmap) {
  std::call_once(nmap_once_, [&] { nmap_ = std::move(nmap); });
}

const mx::array& Relation::neighbor_map() {
  std::call_once(nmap_once_, [&] {
    mx::array a(
        mx::allocator::malloc(std::max<int64_t>(n_out_ * k_, 1) * 4),
        {static_cast<int>(n_out_), static_cast<int>(k_)},
        mx::int32);
    int32_t* m = a.data<int32_t>();
    const int32_t* off = out_offsets_.data<int32_t>();
    const int32_t* in = in_idx_.data<int32_t>();
    const int32_t* kk = k_idx_.data<int32_t>();
    parallel_for(n_out_, kRowGrain, [&](int64_t b, int64_t e) {
      std::fill(m + b * k_, m + e * k_, -1);
      for (int64_t r = b; r < e; ++r) {
        for (int32_t j = off[r]; j < off[r + 1]; ++j) {
          m[r * k_ + kk[j]] = in[j];
        }
      }
    });
    nmap_ = a;
  });
  return *nmap_;
}

const Relation::SortedPlan& Relation::sorted_plan() {
  std::call_once(plan_once_, [&] {
    if (k_ > 64) {
      throw std::invalid_argument(
          "the sorted plan needs a kernel volume of at most 64");
    }
    const int32_t* nm = neighbor_map().data<int32_t>();
    std::vector<uint64_t> mask(n_out_);
    parallel_for(n_out_, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        uint64_t m = 0;
        for (int64_t k = 0; k < k_; ++k) {
          m |= uint64_t(nm[r * k_ + k] >= 0) << k;
        }
        mask[r] = m;
      }
    });
    // Stable LSD radix sort of rows by mask, 16 bits per pass (K <= 64).
    std::vector<int32_t> order(n_out_), tmp(n_out_);
    std::iota(order.begin(), order.end(), 0);
    std::vector<int64_t> count(1 << 16);
    for (int shift = 0; shift < k_; shift += 16) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t i = 0; i < n_out_; ++i) {
        ++count[(mask[i] >> shift) & 0xFFFF];
      }
      int64_t sum = 0;
      for (auto& c : count) {
        int64_t v = c;
        c = sum;
        sum += v;
      }
      for (int64_t i = 0; i < n_out_; ++i) {
        const int32_t r = order[i];
        tmp[count[(mask[r] >> shift) & 0xFFFF]++] = r;
      }
      order.swap(tmp);
    }
    const int64_t n_tiles = (n_out_ + kPlanTile - 1) / kPlanTile;
    mx::array reorder = make_int32(n_out_);
    auto shape2 = [](int64_t a, int64_t b) {
      return mx::Shape{static_cast<int>(a), static_cast<int>(b)};
    };
    const size_t bytes = std::max<int64_t>(n_out_ * k_, 1) * sizeof(int32_t);
    mx::array sorted(mx::allocator::malloc(bytes), shape2(n_out_, k_), mx::int32);
    mx::array kv(mx::allocator::malloc(bytes), shape2(k_, n_out_), mx::int32);
    mx::array tiles(
        mx::allocator::malloc(std::max<int64_t>(n_tiles, 1) * sizeof(uint64_t)),
        {static_cast<int>(n_tiles)},
        mx::uint64);
    int32_t* ro = reorder.data<int32_t>();
    int32_t* so = sorted.data<int32_t>();
    int32_t* kvo = kv.data<int32_t>();
    uint64_t* tm = tiles.data<uint64_t>();
    std::copy(order.begin(), order.end(), ro);
    // Both layouts from one read of each source row; the (K, N) writes are
    // K sequential streams within a block of rows.
    parallel_for(n_out_, kRowGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int32_t* src = nm + int64_t(order[i]) * k_;
        for (int64_t k = 0; k < k_; ++k) {
          so[i * k_ + k] = src[k];
          kvo[k * n_out_ + i] = src[k];
        }
      }
    });
    for (int64_t t = 0; t < n_tiles; ++t) {
      uint64_t m = 0;
      for (int64_t i = t * kPlanTile; i < std::min(n_out_, (t + 1) * kPlanTile); ++i) {
        m |= mask[order[i]];
      }
      tm[t] = m;
    }
    plan_ = SortedPlan{reorder, sorted, kv, tiles};
  });
  return *plan_;
}

int64_t Relation::max_neighbors() const {
  const int32_t* off = out_offsets_.data<int32_t>();
  int64_t mx_n = 0;
  for (int64_t r = 0; r < n_out_; ++r) {
    mx_n = std::max<int64_t>(mx_n, off[r + 1] - off[r]);
  }
  return mx_n;
}

const mx::array& Relation::input_neighbor_map() {
  std::call_once(in_nmap_once_, [&] {
    const InputMajor& im = input_major();
    mx::array a(
        mx::allocator::malloc(std::max<int64_t>(n_in_ * k_, 1) * 4),
        {static_cast<int>(n_in_), static_cast<int>(k_)},
        mx::int32);
    int32_t* m = a.data<int32_t>();
    const int32_t* off = im.offsets.data<int32_t>();
    const int32_t* out = im.out_idx.data<int32_t>();
    const int32_t* kk = im.k_idx.data<int32_t>();
    // Each task writes the entries of its own input rows only.
    parallel_for(n_in_, kRowGrain, [&](int64_t b, int64_t e) {
      std::fill(m + b * k_, m + e * k_, -1);
      for (int64_t i = b; i < e; ++i) {
        for (int32_t j = off[i]; j < off[i + 1]; ++j) {
          m[i * k_ + kk[j]] = out[j];
        }
      }
    });
    in_nmap_ = a;
  });
  return *in_nmap_;
}

std::shared_ptr<Relation> Relation::swapped(const std::string& kind) {
  const InputMajor& im = input_major();
  return std::make_shared<Relation>(
      kind, n_out_, n_in_, k_, im.offsets, im.out_idx, im.k_idx);
}

} // namespace mlx_lattice
