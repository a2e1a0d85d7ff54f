#include "relation.h"

#include <algorithm>
#include <numeric>
#include <sstream>
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

// Growable set of packed keys (single writer), used to collect supports.
class KeySet {
 public:
  explicit KeySet(uint64_t expected) {
    rehash(next_pow2(2 * std::max<uint64_t>(expected, 8)));
  }
  void insert(uint64_t key) {
    if (2 * (count_ + 1) > keys_.size()) {
      rehash(keys_.size() * 2);
    }
    uint64_t h = CoordTable::hash(key) & mask_;
    while (keys_[h] != kEmptyKey) {
      if (keys_[h] == key) {
        return;
      }
      h = (h + 1) & mask_;
    }
    keys_[h] = key;
    ++count_;
  }
  std::vector<uint64_t> sorted() const {
    std::vector<uint64_t> out;
    out.reserve(count_);
    for (uint64_t k : keys_) {
      if (k != kEmptyKey) {
        out.push_back(k);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  void rehash(uint64_t cap) {
    std::vector<uint64_t> old;
    old.swap(keys_);
    keys_.assign(cap, kEmptyKey);
    mask_ = cap - 1;
    count_ = 0;
    for (uint64_t k : old) {
      if (k != kEmptyKey) {
        insert(k);
      }
    }
  }
  std::vector<uint64_t> keys_;
  uint64_t mask_ = 0;
  uint64_t count_ = 0;
};

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

template <typename Visit>
void for_each_offset(const KernelSpec& spec, Visit visit) {
  int k = 0;
  for (int dx = 0; dx < spec.size[0]; ++dx) {
    for (int dy = 0; dy < spec.size[1]; ++dy) {
      for (int dz = 0; dz < spec.size[2]; ++dz) {
        visit(k++, dx, dy, dz);
      }
    }
  }
}

[[noreturn]] void range_error(const int32_t* c, const char* what) {
  std::ostringstream os;
  os << what << " coordinate (" << c[0] << ", " << c[1] << ", " << c[2] << ", "
     << c[3] << ") leaves the supported range: batch in [0, " << kBatchLimit
     << "), x/y/z in [" << kCoordMin << ", " << kCoordMax << "]";
  throw std::invalid_argument(os.str());
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
  keys_.assign(cap, kEmptyKey);
  vals_.assign(cap, -1);
  const int32_t* c = n_ > 0 ? coords_.data<int32_t>() : nullptr;
  for (int64_t i = 0; i < n_; ++i) {
    const int32_t* r = c + 4 * i;
    if (!in_range(r[0], r[1], r[2], r[3])) {
      range_error(r, "input");
    }
    uint64_t key = pack_key(r[0], r[1], r[2], r[3]);
    uint64_t h = hash(key) & mask_;
    while (keys_[h] != kEmptyKey) {
      if (keys_[h] == key) {
        std::ostringstream os;
        os << "coords contain duplicate rows " << vals_[h] << " and " << i
           << " at (" << r[0] << ", " << r[1] << ", " << r[2] << ", " << r[3]
           << "); merge duplicates with mlx_lattice.sparse_quantize first";
        throw std::invalid_argument(os.str());
      }
      h = (h + 1) & mask_;
    }
    keys_[h] = key;
    vals_[h] = static_cast<int32_t>(i);
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

mx::array forward_support(const CoordTable& in, const KernelSpec& spec) {
  KeySet set(in.size());
  const int32_t* c = in.coord_data();
  for (int64_t i = 0; i < in.size(); ++i) {
    const int32_t* p = c + 4 * i;
    for_each_offset(spec, [&](int, int dx, int dy, int dz) {
      int64_t t[3];
      int d[3] = {dx, dy, dz};
      for (int a = 0; a < 3; ++a) {
        t[a] = int64_t(p[a + 1]) + spec.padding[a] -
            int64_t(spec.dilation[a]) * d[a];
        if (floor_mod(t[a], spec.stride[a]) != 0) {
          return;
        }
        t[a] /= spec.stride[a];
      }
      if (!in_range(p[0], t[0], t[1], t[2])) {
        int32_t bad[4] = {p[0], int32_t(t[0]), int32_t(t[1]), int32_t(t[2])};
        range_error(bad, "output");
      }
      set.insert(pack_key(p[0], t[0], t[1], t[2]));
    });
  }
  return coords_from_keys(set.sorted());
}

mx::array generative_support(const CoordTable& in, const KernelSpec& spec) {
  KeySet set(int64_t(in.size()) * spec.volume());
  const int32_t* c = in.coord_data();
  for (int64_t i = 0; i < in.size(); ++i) {
    const int32_t* p = c + 4 * i;
    for_each_offset(spec, [&](int, int dx, int dy, int dz) {
      int64_t t[3];
      int d[3] = {dx, dy, dz};
      for (int a = 0; a < 3; ++a) {
        t[a] = int64_t(spec.stride[a]) * p[a + 1] - spec.padding[a] +
            int64_t(spec.dilation[a]) * d[a];
      }
      if (!in_range(p[0], t[0], t[1], t[2])) {
        int32_t bad[4] = {p[0], int32_t(t[0]), int32_t(t[1]), int32_t(t[2])};
        range_error(bad, "output");
      }
      set.insert(pack_key(p[0], t[0], t[1], t[2]));
    });
  }
  return coords_from_keys(set.sorted());
}

std::shared_ptr<Relation> build_relation(
    const CoordTable& in,
    const mx::array& out_coords_in,
    const KernelSpec& spec,
    bool transposed,
    const std::string& kind) {
  mx::array out_coords = evaluated(out_coords_in);
  check_coords(out_coords, "output coordinates");
  const int64_t m = out_coords.shape(0);
  const int kv = spec.volume();
  const int32_t* oc = m > 0 ? out_coords.data<int32_t>() : nullptr;

  // Pass 1: per chunk of output rows, collect (in, k) pairs in edge order.
  const int64_t n_chunks = (m + kRowGrain - 1) / kRowGrain;
  std::vector<std::vector<int32_t>> chunk_in(n_chunks), chunk_k(n_chunks);
  mx::array offsets = make_int32(m + 1);
  int32_t* off = offsets.data<int32_t>();
  parallel_for(m, kRowGrain, [&](int64_t b, int64_t e) {
    auto& ins = chunk_in[b / kRowGrain];
    auto& ks = chunk_k[b / kRowGrain];
    for (int64_t r = b; r < e; ++r) {
      const int32_t* q = oc + 4 * r;
      int32_t count = 0;
      for_each_offset(spec, [&](int k, int dx, int dy, int dz) {
        int64_t t[3];
        int d[3] = {dx, dy, dz};
        for (int a = 0; a < 3; ++a) {
          if (transposed) {
            int64_t v = int64_t(q[a + 1]) + spec.padding[a] -
                int64_t(spec.dilation[a]) * d[a];
            if (floor_mod(v, spec.stride[a]) != 0) {
              return;
            }
            t[a] = v / spec.stride[a];
          } else {
            t[a] = int64_t(spec.stride[a]) * q[a + 1] - spec.padding[a] +
                int64_t(spec.dilation[a]) * d[a];
          }
        }
        if (!in_range(q[0], t[0], t[1], t[2])) {
          return;
        }
        int32_t i = in.find(pack_key(q[0], t[0], t[1], t[2]));
        if (i >= 0) {
          ins.push_back(i);
          ks.push_back(k);
          ++count;
        }
      });
      off[r + 1] = count;
    }
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

int64_t Relation::max_neighbors() const {
  const int32_t* off = out_offsets_.data<int32_t>();
  int64_t mx_n = 0;
  for (int64_t r = 0; r < n_out_; ++r) {
    mx_n = std::max<int64_t>(mx_n, off[r + 1] - off[r]);
  }
  return mx_n;
}

std::shared_ptr<Relation> Relation::swapped(const std::string& kind) {
  const InputMajor& im = input_major();
  return std::make_shared<Relation>(
      kind, n_out_, n_in_, k_, im.offsets, im.out_idx, im.k_idx);
}

} // namespace mlx_lattice
