// A relation and the views derived from it (kernel-major, input-major,
// neighbour maps, the sorted plan), each built once on first use.
#include "core/relation.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "core/sort.h"
#include "core/threadpool.h"
#include "mlx/allocator.h"
#include "mlx/transforms.h"

namespace mlx_lattice {

mx::array make_int32(int64_t n) {
  return mx::array(
      mx::allocator::malloc(std::max<int64_t>(n, 1) * sizeof(int32_t)),
      {static_cast<int>(n)},
      mx::int32);
}

mx::array make_int32(int64_t rows, int64_t cols) {
  return mx::array(
      mx::allocator::malloc(std::max<int64_t>(rows * cols, 1) * sizeof(int32_t)),
      {static_cast<int>(rows), static_cast<int>(cols)},
      mx::int32);
}

namespace {

// A GPU builder may hand over arrays that are not evaluated yet; the host
// derivations here read them, so they are evaluated (and waited on) first.
// Relations built on the CPU hold evaluated arrays, so nothing runs for them
// (and nothing is scheduled from inside another primitive's evaluation).
void host_ready(std::initializer_list<const mx::array*> arrays) {
  std::vector<mx::array> pending;
  for (const mx::array* a : arrays) {
    if (!a->is_available()) {
      pending.push_back(*a);
    }
  }
  if (pending.empty()) {
    return;
  }
  mx::eval(pending);
  for (mx::array& a : pending) {
    a.wait();
  }
}

// Stable counting sort of items [0, n) by key(i) in [0, buckets), in
// parallel over fixed blocks of items: per-block counts, each block's start
// in every bucket, then each block places its items in order. The blocks
// depend on n only, so the result is the serial sort's for any thread
// count. offsets (buckets + 1 entries) as in counting_sort; place(i, pos)
// is called once per item with its position.
template <typename Key, typename Place>
void block_counting_sort(int64_t n, int64_t buckets, Key key, int32_t* offsets, Place place) {
  constexpr int64_t kBlockItems = 1 << 16;
  const int64_t blocks = std::clamp<int64_t>(n / kBlockItems, 1, 8);
  auto block_begin = [&](int64_t b) { return n * b / blocks; };
  // counts[b * buckets + k]: items of block b in bucket k, then block b's
  // next position in bucket k.
  std::vector<int32_t> counts(blocks * buckets, 0);
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int32_t* c = counts.data() + b * buckets;
      for (int64_t i = block_begin(b); i < block_begin(b + 1); ++i) {
        ++c[key(i)];
      }
    }
  });
  offsets[0] = 0;
  for (int64_t k = 0; k < buckets; ++k) {
    int32_t total = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      total += counts[b * buckets + k];
    }
    offsets[k + 1] = offsets[k] + total;
  }
  parallel_for(buckets, kRowGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      int32_t at = offsets[k];
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t c = counts[b * buckets + k];
        counts[b * buckets + k] = at;
        at += c;
      }
    }
  });
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int32_t* cursor = counts.data() + b * buckets;
      for (int64_t i = block_begin(b); i < block_begin(b + 1); ++i) {
        place(i, cursor[key(i)]++);
      }
    }
  });
}

// Rows [0, n) stably sorted by their 64-bit keys: LSD radix sort, 16 bits a
// pass, passes only over the bits in use (`bits`).
std::vector<int32_t> sort_by_key(const std::vector<uint64_t>& key, int64_t bits) {
  const int64_t n = static_cast<int64_t>(key.size());
  std::vector<int32_t> order(n), tmp(n), pos(n);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> count((1 << 16) + 1);
  for (int shift = 0; shift < bits; shift += 16) {
    auto digit = [&](int64_t i) { return (key[order[i]] >> shift) & 0xFFFF; };
    counting_sort(n, int64_t(1) << 16, digit, count.data(), pos.data());
    for (int64_t i = 0; i < n; ++i) {
      tmp[i] = order[pos[i]];
    }
    order.swap(tmp);
  }
  return order;
}

// A CSR view's rows ordered by the offsets of their edges (Relation::
// row_order's key: bit k, or k * 64 / K past 64 offsets).
mx::array offset_set_order(const int32_t* offsets, const int32_t* kidx, int64_t n, int64_t K) {
  std::vector<uint64_t> key(n);
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      uint64_t m = 0;
      for (int32_t j = offsets[r]; j < offsets[r + 1]; ++j) {
        m |= uint64_t(1) << (K <= 64 ? kidx[j] : int64_t(kidx[j]) * 64 / K);
      }
      key[r] = m;
    }
  });
  const std::vector<int32_t> order = sort_by_key(key, std::min<int64_t>(K, 64));
  mx::array a = make_int32(n);
  std::copy(order.begin(), order.end(), a.data<int32_t>());
  return a;
}

} // namespace

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
    host_ready({&out_offsets_});
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
    host_ready({&out_idx(), &in_idx_, &k_idx_});
    const int32_t* out = out_idx().data<int32_t>();
    const int32_t* in = in_idx_.data<int32_t>();
    const int32_t* kk = k_idx_.data<int32_t>();
    mx::array offsets = make_int32(k_ + 1);
    mx::array perm = make_int32(e_);
    mx::array v_in = make_int32(e_);
    mx::array v_out = make_int32(e_);
    // Edges (ordered by (out, k)) stably sorted by offset.
    int32_t* p = perm.data<int32_t>();
    int32_t* vi = v_in.data<int32_t>();
    int32_t* vo = v_out.data<int32_t>();
    block_counting_sort(
        e_, k_, [&](int64_t e) { return kk[e]; }, offsets.data<int32_t>(),
        [&](int64_t e, int32_t j) {
          p[j] = static_cast<int32_t>(e);
          vi[j] = in[e];
          vo[j] = out[e];
        });
    k_view_ = KernelMajor{offsets, perm, v_in, v_out};
  });
  return *k_view_;
}

const Relation::OffsetGroups& Relation::offset_groups(View v) {
  const int i = static_cast<int>(v);
  std::call_once(groups_once_[i], [&] {
    if (v == View::InputMajor && !symmetric_) {
      groups_[i] = input_offset_groups();
      return;
    }
    // The kernel-major view's segments, in reverse for a symmetric
    // relation's input view: its edges of offset k into input p are the
    // edges (p <- q, K - 1 - k), which segment K - 1 - k holds sorted by p.
    const KernelMajor& km = kernel_major();
    host_ready({&km.offsets});
    const int32_t* off = km.offsets.data<int32_t>();
    mx::array segments = make_int32(2 * k_);
    int32_t* s = segments.data<int32_t>();
    for (int64_t k = 0; k < k_; ++k) {
      const int64_t src = v == View::OutputMajor ? k : k_ - 1 - k;
      s[2 * k] = off[src];
      s[2 * k + 1] = off[src + 1];
    }
    groups_[i] = OffsetGroups{segments, km.out_idx, km.in_idx};
  });
  return *groups_[i];
}

// The input-major view (edges by (in, k)) stably sorted by offset: edges by
// (k, in), each with its input row and the output row it gathers.
Relation::OffsetGroups Relation::input_offset_groups() {
  const InputMajor& im = input_major();
  host_ready({&im.offsets, &im.out_idx, &im.k_idx});
  const int32_t* off = im.offsets.data<int32_t>();
  const int32_t* out = im.out_idx.data<int32_t>();
  const int32_t* kk = im.k_idx.data<int32_t>();
  std::vector<int32_t> row(e_);
  parallel_for(n_in_, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::fill(row.begin() + off[r], row.begin() + off[r + 1], static_cast<int32_t>(r));
    }
  });
  std::vector<int32_t> starts(k_ + 1);
  mx::array rows = make_int32(e_);
  mx::array gather = make_int32(e_);
  int32_t* vr = rows.data<int32_t>();
  int32_t* vg = gather.data<int32_t>();
  block_counting_sort(
      e_, k_, [&](int64_t j) { return kk[j]; }, starts.data(),
      [&](int64_t j, int32_t dst) {
        vr[dst] = row[j];
        vg[dst] = out[j];
      });
  mx::array segments = make_int32(2 * k_);
  int32_t* s = segments.data<int32_t>();
  for (int64_t k = 0; k < k_; ++k) {
    s[2 * k] = starts[k];
    s[2 * k + 1] = starts[k + 1];
  }
  return OffsetGroups{segments, rows, gather};
}

const Relation::InputMajor& Relation::input_major() {
  std::call_once(in_once_, [&] {
    if (symmetric_ && k_ <= 256) {  // ranks within a row fit a byte
      in_view_ = mirrored_input_major();
      return;
    }
    // Stable counting sort of the (k, out)-ordered view by input row gives
    // edges ordered by (in, k).
    const KernelMajor& km = kernel_major();
    host_ready({&km.perm, &km.in_idx, &km.out_idx, &k_idx_});
    const int32_t* kp = km.perm.data<int32_t>();
    const int32_t* kin = km.in_idx.data<int32_t>();
    const int32_t* kout = km.out_idx.data<int32_t>();
    const int32_t* kk = k_idx_.data<int32_t>();
    mx::array offsets = make_int32(n_in_ + 1);
    mx::array perm = make_int32(e_);
    mx::array v_out = make_int32(e_);
    mx::array v_k = make_int32(e_);
    int32_t* p = perm.data<int32_t>();
    int32_t* vo = v_out.data<int32_t>();
    int32_t* vk = v_k.data<int32_t>();
    block_counting_sort(
        e_, n_in_, [&](int64_t j) { return kin[j]; }, offsets.data<int32_t>(),
        [&](int64_t j, int32_t dst) {
          const int32_t e = kp[j];
          p[dst] = e;
          vo[dst] = kout[j];
          vk[dst] = kk[e];
        });
    in_view_ = InputMajor{offsets, perm, v_out, v_k};
  });
  return *in_view_;
}

// A symmetric relation's edges into input p are CSR row p's entries read
// backwards: entry (in q, k') of row p is the edge (q <- p, K - 1 - k'), and
// descending k' is ascending k, the order of the view. Its edge number is
// q's row start plus its rank among row q's entries, taken from a table of
// ranks by (row, offset) made in one pass over the CSR.
Relation::InputMajor Relation::mirrored_input_major() {
  host_ready({&out_offsets_, &in_idx_, &k_idx_});
  const int32_t* off = out_offsets_.data<int32_t>();
  const int32_t* in = in_idx_.data<int32_t>();
  const int32_t* kk = k_idx_.data<int32_t>();
  const int64_t n = n_out_, K = k_;
  std::vector<uint8_t> rank(std::max<int64_t>(n * K, 1));
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      for (int32_t j = off[q]; j < off[q + 1]; ++j) {
        rank[q * K + kk[j]] = static_cast<uint8_t>(j - off[q]);
      }
    }
  });
  mx::array perm = make_int32(e_);
  mx::array v_out = make_int32(e_);
  mx::array v_k = make_int32(e_);
  int32_t* p = perm.data<int32_t>();
  int32_t* vo = v_out.data<int32_t>();
  int32_t* vk = v_k.data<int32_t>();
  parallel_for(n, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int32_t j = off[r], src = off[r + 1] - 1; src >= off[r]; ++j, --src) {
        const int32_t q = in[src];
        const int32_t k = static_cast<int32_t>(K - 1 - kk[src]);
        vo[j] = q;
        vk[j] = k;
        p[j] = off[q] + rank[int64_t(q) * K + k];
      }
    }
  });
  return InputMajor{out_offsets_, perm, v_out, v_k};
}

void Relation::set_neighbor_map(mx::array nmap) {
  std::call_once(nmap_once_, [&] { nmap_ = std::move(nmap); });
}

void Relation::set_out_idx(mx::array out_idx) {
  std::call_once(out_once_, [&] { out_idx_ = std::move(out_idx); });
}

void Relation::set_kernel_major(KernelMajor view) {
  std::call_once(k_once_, [&] { k_view_ = std::move(view); });
}

void Relation::set_input_major(InputMajor view) {
  std::call_once(in_once_, [&] { in_view_ = std::move(view); });
}

void Relation::set_input_neighbor_map(mx::array map) {
  std::call_once(in_nmap_once_, [&] { in_nmap_ = std::move(map); });
}

void Relation::set_sorted_plan(SortedPlan plan) {
  std::call_once(plan_once_, [&] { plan_ = std::move(plan); });
}

const mx::array& Relation::neighbor_map() {
  std::call_once(nmap_once_, [&] {
    mx::array a = make_int32(n_out_, k_);
    host_ready({&out_offsets_, &in_idx_, &k_idx_});
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
    host_ready({&neighbor_map()});
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
    const std::vector<int32_t> order = sort_by_key(mask, k_);
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

const mx::array& Relation::row_order(View v) {
  const int i = static_cast<int>(v);
  std::call_once(order_once_[i], [&] {
    // From the CSR alone: the same key and stable sort as the sorted plan
    // (so the same order as its reorder_rows), without building the
    // neighbour map and the plan's two copies of it.
    if (v == View::OutputMajor) {
      host_ready({&out_offsets_, &k_idx_});
      order_[i] = offset_set_order(
          out_offsets_.data<int32_t>(), k_idx_.data<int32_t>(), n_out_, k_);
    } else {
      const InputMajor& im = input_major();
      host_ready({&im.offsets, &im.k_idx});
      order_[i] = offset_set_order(im.offsets.data<int32_t>(), im.k_idx.data<int32_t>(), n_in_, k_);
    }
  });
  return *order_[i];
}

void Relation::set_row_order(View v, mx::array order) {
  std::call_once(order_once_[static_cast<int>(v)], [&] {
    order_[static_cast<int>(v)] = std::move(order);
  });
}

int64_t Relation::max_neighbors() const {
  host_ready({&out_offsets_});
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
    host_ready({&im.offsets, &im.out_idx, &im.k_idx});
    mx::array a = make_int32(n_in_, k_);
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
