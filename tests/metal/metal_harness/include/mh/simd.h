// Barriers, simd-group and quad-group functions, simdgroup_matrix<T, 8, 8>.
// Every collective parks the calling GPU thread (mh::rt_sync) until all live
// lanes of its simdgroup arrive at the same call site; the executor reports
// divergence instead of hanging. Each lane deposits its value in a slot and
// computes its own result from the 32 slots (slots of lanes that did not
// take part read as 0xFF bytes, i.e. NaN).
#pragma once

#include "mh/atomic.h"
#include "mh/math.h"
#include "mh/rt.h"

#define MH_HERE std::source_location loc = std::source_location::current()

namespace metal {

enum class mem_flags : int {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(int(a) | int(b));
}
constexpr mem_flags operator&(mem_flags a, mem_flags b) {
  return mem_flags(int(a) & int(b));
}

inline void threadgroup_barrier(mem_flags = mem_flags::mem_none, MH_HERE) {
  mh::rt_sync(mh::Sync::threadgroup, "threadgroup_barrier", loc.file_name(), loc.line(), loc.column());
}

inline void simdgroup_barrier(mem_flags = mem_flags::mem_none, MH_HERE) {
  mh::rt_sync(mh::Sync::simd, "simdgroup_barrier", loc.file_name(), loc.line(), loc.column());
}

inline void atomic_thread_fence(mem_flags, memory_order, thread_scope = thread_scope_device) {}

namespace detail {

struct Gathered {
  const unsigned char* base;
  uint64_t mask;
  uint lane;

  bool active(uint l) const { return l < 32 && ((mask >> l) & 1u); }
  template <class T>
  T at(uint l) const {
    T v;
    if (l >= 32) {
      __builtin_memset(static_cast<void*>(&v), 0xFF, sizeof(T));
    } else {
      __builtin_memcpy(static_cast<void*>(&v), base + l * mh::kSlotBytes, sizeof(T));
    }
    return v;
  }
  uint first() const { return mask ? uint(__builtin_ctzll(mask)) : 32u; }
  uint first_in_quad() const {
    const uint q = lane & ~3u;
    const uint64_t m = (mask >> q) & 0xFu;
    return m ? q + uint(__builtin_ctzll(m)) : lane;
  }
};

template <class T>
inline Gathered gather(const T& v, const char* what, const std::source_location& loc) {
  static_assert(sizeof(T) <= mh::kSlotBytes, "value too large for a simd collective");
  __builtin_memcpy(mh::rt_simd_slot(), static_cast<const void*>(&v), sizeof(T));
  mh::rt_sync(mh::Sync::simd, what, loc.file_name(), loc.line(), loc.column());
  Gathered g;
  g.base = mh::rt_simd_result(&g.mask);
  g.lane = mh::g_thread->lane;
  return g;
}

// Fold over the active lanes in [lo, hi) in lane order.
template <class T, class Op>
inline T fold(const Gathered& g, uint lo, uint hi, T empty, Op op) {
  bool first = true;
  T acc = empty;
  for (uint l = lo; l < hi; ++l) {
    if (g.active(l)) {
      T x = g.template at<T>(l);
      acc = first ? x : T(op(acc, x));
      first = false;
    }
  }
  return acc;
}

struct Add {
  template <class T>
  T operator()(T a, T b) const { return T(a + b); }
};
struct Mul {
  template <class T>
  T operator()(T a, T b) const { return T(a * b); }
};
struct Min {
  template <class T>
  T operator()(T a, T b) const { return min(a, b); }
};
struct Max {
  template <class T>
  T operator()(T a, T b) const { return max(a, b); }
};
// Bitwise folds; the built-ins also take floating values (their bits).
template <class T, class F>
inline T bitwise(T a, T b, F f) {
  if constexpr (std::is_integral_v<T> || vinfo<T>::is_vec && std::is_integral_v<typename vinfo<T>::elem>) {
    return T(f(a, b));
  } else {
    using E = typename vinfo<T>::elem;
    using U = std::conditional_t<sizeof(E) == 2, uint16_t, uint32_t>;
    T r;
    for (int i = 0; i < vinfo<T>::n; ++i) {
      const E x = vinfo<T>::is_vec ? reinterpret_cast<const E*>(&a)[i] : *reinterpret_cast<const E*>(&a);
      const E y = vinfo<T>::is_vec ? reinterpret_cast<const E*>(&b)[i] : *reinterpret_cast<const E*>(&b);
      const U u = U(f(__builtin_bit_cast(U, x), __builtin_bit_cast(U, y)));
      reinterpret_cast<E*>(&r)[i] = __builtin_bit_cast(E, u);
    }
    return r;
  }
}
struct And {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x & y; }); }
};
struct Or {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x | y; }); }
};
struct Xor {
  template <class T>
  T operator()(T a, T b) const { return bitwise(a, b, [](auto x, auto y) { return x ^ y; }); }
};

} // namespace detail

// ------------------------------------------------------------ reductions
// The library's functions are over built-ins (__metal_simd_sum(x), ...) as in
// Apple's <metal_simdgroup>; both take the specification's types: scalars and
// vectors of char to uint, half and float (the bitwise ones integers only).
// bool, long, ulong and bfloat values are not among them (MLX's utils.h and
// bf16_math.h wrap those through uint2, uint and float).

template <class X>
inline constexpr bool simd_value_v = []() {
  using E = detail::elem_t<X>;
  return (detail::lib_float_v<E> || (detail::lib_int_v<E> && sizeof(E) <= 4)) &&
      (detail::is_vecish_v<X> || is_scalar_v<::mh::bare_t<X>>);
}();
template <class X>
inline constexpr bool simd_int_v = simd_value_v<X> && detail::lib_int_v<detail::elem_t<X>>;

} // namespace metal

#define MH_SIMD_REDUCE(name, Op, lo, hi, Kind)                                \
  template <class X>                                                          \
    requires metal::simd_value_v<X>                                           \
  inline auto __metal_##name(const X& x0, MH_HERE) {                          \
    using namespace metal;                                                    \
    using T = detail::vec_of<X>;                                              \
    T x = detail::tov(x0);                                                    \
    auto g = detail::gather(x, #name, loc);                                   \
    return detail::fold<T>(g, lo, hi, T(0), detail::Op{});                    \
  }                                                                           \
  namespace metal {                                                           \
  template <class X>                                                          \
    requires Kind<X>                                                          \
  inline auto name(const X& x, MH_HERE) {                                     \
    return ::__metal_##name(x, loc);                                          \
  }                                                                           \
  }
MH_SIMD_REDUCE(simd_sum, Add, 0, 32, simd_value_v)
MH_SIMD_REDUCE(simd_product, Mul, 0, 32, simd_value_v)
MH_SIMD_REDUCE(simd_min, Min, 0, 32, simd_value_v)
MH_SIMD_REDUCE(simd_max, Max, 0, 32, simd_value_v)
MH_SIMD_REDUCE(simd_and, And, 0, 32, simd_int_v)
MH_SIMD_REDUCE(simd_or, Or, 0, 32, simd_int_v)
MH_SIMD_REDUCE(simd_xor, Xor, 0, 32, simd_int_v)
MH_SIMD_REDUCE(simd_prefix_exclusive_sum, Add, 0, g.lane, simd_value_v)
MH_SIMD_REDUCE(simd_prefix_inclusive_sum, Add, 0, g.lane + 1, simd_value_v)
MH_SIMD_REDUCE(simd_prefix_inclusive_product, Mul, 0, g.lane + 1, simd_value_v)
MH_SIMD_REDUCE(quad_sum, Add, g.lane & ~3u, (g.lane & ~3u) + 4, simd_value_v)
MH_SIMD_REDUCE(quad_product, Mul, g.lane & ~3u, (g.lane & ~3u) + 4, simd_value_v)
MH_SIMD_REDUCE(quad_min, Min, g.lane & ~3u, (g.lane & ~3u) + 4, simd_value_v)
MH_SIMD_REDUCE(quad_max, Max, g.lane & ~3u, (g.lane & ~3u) + 4, simd_value_v)
MH_SIMD_REDUCE(quad_and, And, g.lane & ~3u, (g.lane & ~3u) + 4, simd_int_v)
MH_SIMD_REDUCE(quad_or, Or, g.lane & ~3u, (g.lane & ~3u) + 4, simd_int_v)
MH_SIMD_REDUCE(quad_xor, Xor, g.lane & ~3u, (g.lane & ~3u) + 4, simd_int_v)
MH_SIMD_REDUCE(quad_prefix_exclusive_sum, Add, g.lane & ~3u, g.lane, simd_value_v)
MH_SIMD_REDUCE(quad_prefix_inclusive_sum, Add, g.lane & ~3u, g.lane + 1, simd_value_v)
MH_SIMD_REDUCE(quad_prefix_inclusive_product, Mul, g.lane & ~3u, g.lane + 1, simd_value_v)
#undef MH_SIMD_REDUCE

// An exclusive product starts from 1, not 0.
#define MH_SIMD_EXCLUSIVE_PRODUCT(name, lo)                                   \
  template <class X>                                                          \
    requires metal::simd_value_v<X>                                           \
  inline auto __metal_##name(const X& x0, MH_HERE) {                          \
    using namespace metal;                                                    \
    using T = detail::vec_of<X>;                                              \
    T x = detail::tov(x0);                                                    \
    auto g = detail::gather(x, #name, loc);                                   \
    return detail::fold<T>(g, lo, g.lane, T(1), detail::Mul{});               \
  }                                                                           \
  namespace metal {                                                           \
  template <class X>                                                          \
    requires simd_value_v<X>                                                  \
  inline auto name(const X& x, MH_HERE) {                                     \
    return ::__metal_##name(x, loc);                                          \
  }                                                                           \
  }
MH_SIMD_EXCLUSIVE_PRODUCT(simd_prefix_exclusive_product, 0)
MH_SIMD_EXCLUSIVE_PRODUCT(quad_prefix_exclusive_product, g.lane & ~3u)
#undef MH_SIMD_EXCLUSIVE_PRODUCT

// ------------------------------------------------------------ shuffles

#define MH_SIMD_SHUFFLE(name, src_expr)                                       \
  template <class X>                                                          \
    requires metal::simd_value_v<X>                                           \
  inline auto __metal_##name(const X& x0, ushort k, MH_HERE) {                \
    using namespace metal;                                                    \
    using T = detail::vec_of<X>;                                              \
    T x = detail::tov(x0);                                                    \
    auto g = detail::gather(x, #name, loc);                                   \
    const uint lane = g.lane;                                                 \
    const uint q = lane & ~3u;                                                \
    (void)q;                                                                  \
    const long src = (src_expr);                                              \
    return src < 0 ? x : g.template at<T>(uint(src));                         \
  }                                                                           \
  namespace metal {                                                           \
  template <class X>                                                          \
    requires simd_value_v<X>                                                  \
  inline auto name(const X& x, ushort k, MH_HERE) {                           \
    return ::__metal_##name(x, k, loc);                                       \
  }                                                                           \
  }
// src < 0 keeps the caller's own value (lanes shifted past the edge).
MH_SIMD_SHUFFLE(simd_shuffle, long(k))
MH_SIMD_SHUFFLE(simd_broadcast, long(k))
MH_SIMD_SHUFFLE(simd_shuffle_xor, long(lane ^ k))
MH_SIMD_SHUFFLE(simd_shuffle_down, lane + k < 32 ? long(lane + k) : -1L)
MH_SIMD_SHUFFLE(simd_shuffle_up, k <= lane ? long(lane - k) : -1L)
MH_SIMD_SHUFFLE(simd_shuffle_rotate_down, long((lane + k) % 32))
MH_SIMD_SHUFFLE(simd_shuffle_rotate_up, long((lane + 32 - (k % 32)) % 32))
MH_SIMD_SHUFFLE(quad_shuffle, long(q + (k & 3u)))
MH_SIMD_SHUFFLE(quad_broadcast, long(q + (k & 3u)))
MH_SIMD_SHUFFLE(quad_shuffle_xor, long(q + ((lane ^ k) & 3u)))
MH_SIMD_SHUFFLE(quad_shuffle_down, (lane & 3u) + k < 4 ? long(lane + k) : -1L)
MH_SIMD_SHUFFLE(quad_shuffle_up, k <= (lane & 3u) ? long(lane - k) : -1L)
MH_SIMD_SHUFFLE(quad_shuffle_rotate_down, long(q + ((lane + k) & 3u)))
MH_SIMD_SHUFFLE(quad_shuffle_rotate_up, long(q + ((lane + 4 - (k & 3u)) & 3u)))
#undef MH_SIMD_SHUFFLE

#define MH_SIMD_FIRST(name, first_expr)                                       \
  template <class X>                                                          \
    requires metal::simd_value_v<X>                                           \
  inline auto __metal_##name(const X& x0, MH_HERE) {                          \
    using namespace metal;                                                    \
    using T = detail::vec_of<X>;                                              \
    T x = detail::tov(x0);                                                    \
    auto g = detail::gather(x, #name, loc);                                   \
    return g.template at<T>(first_expr);                                      \
  }                                                                           \
  namespace metal {                                                           \
  template <class X>                                                          \
    requires simd_value_v<X>                                                  \
  inline auto name(const X& x, MH_HERE) {                                     \
    return ::__metal_##name(x, loc);                                          \
  }                                                                           \
  }
MH_SIMD_FIRST(simd_broadcast_first, g.first())
MH_SIMD_FIRST(quad_broadcast_first, g.first_in_quad())
#undef MH_SIMD_FIRST

// data from lane + delta of the `modulo`-lane segment; lanes past its end
// take filling from lane + delta - modulo.
#define MH_SIMD_FILL(name, src_expr)                                          \
  template <class X, class Y>                                                 \
    requires(metal::simd_value_v<X> && std::is_same_v<metal::detail::vec_of<X>, metal::detail::vec_of<Y>>) \
  inline auto __metal_##name(const X& data0, const Y& fill0, ushort delta, ushort modulo, MH_HERE) { \
    using namespace metal;                                                    \
    using T = detail::vec_of<X>;                                              \
    struct Pair {                                                             \
      T data;                                                                 \
      T fill;                                                                 \
    } p{detail::tov(data0), detail::tov(fill0)};                              \
    auto g = detail::gather(p, #name, loc);                                   \
    const uint m = modulo == 0 ? 32u : uint(modulo);                          \
    const uint base = g.lane - g.lane % m, at = g.lane % m;                   \
    (void)base;                                                               \
    return src_expr;                                                          \
  }                                                                           \
  namespace metal {                                                           \
  template <class X, class Y>                                                 \
    requires(simd_value_v<X> && std::is_same_v<detail::vec_of<X>, detail::vec_of<Y>>) \
  inline auto name(const X& data, const Y& fill, ushort delta, MH_HERE) {     \
    return ::__metal_##name(data, fill, delta, ushort(32), loc);              \
  }                                                                           \
  template <class X, class Y>                                                 \
    requires(simd_value_v<X> && std::is_same_v<detail::vec_of<X>, detail::vec_of<Y>>) \
  inline auto name(const X& data, const Y& fill, ushort delta, ushort modulo, MH_HERE) { \
    return ::__metal_##name(data, fill, delta, modulo, loc);                  \
  }                                                                           \
  }
MH_SIMD_FILL(simd_shuffle_and_fill_down,
             at + delta < m ? g.template at<Pair>(base + at + delta).data
                            : g.template at<Pair>(base + at + delta - m).fill)
MH_SIMD_FILL(simd_shuffle_and_fill_up,
             delta <= at ? g.template at<Pair>(base + at - delta).data
                         : g.template at<Pair>(base + at + m - delta).fill)
#undef MH_SIMD_FILL

// The calling thread's lane and its simdgroup's width, as built-ins (MLX's
// NAX fragments read the lane this way).
inline ushort __metal_get_thread_index_in_simdgroup(ushort) {
  return ushort(mh::g_thread->lane);
}
inline uint __metal_get_thread_index_in_simdgroup(uint) {
  return mh::g_thread->lane;
}
inline ushort __metal_get_simdgroup_size(ushort) {
  return ushort(mh::kSimdWidth);
}
inline uint __metal_get_simdgroup_size(uint) {
  return uint(mh::kSimdWidth);
}

namespace metal {

// ------------------------------------------------------------ votes

struct simd_vote {
  using vote_t = ulong;
  vote_t v;
  vote_t active;
  explicit constexpr simd_vote(vote_t bits = 0, vote_t act = 0xffffffffull)
      : v(bits), active(act) {}
  explicit constexpr operator vote_t() const { return v; }
  constexpr bool all() const { return (v & active) == active; }
  constexpr bool any() const { return (v & active) != 0; }
};

inline simd_vote simd_ballot(bool b, MH_HERE) {
  auto g = detail::gather(b, "simd_ballot", loc);
  ulong bits = 0;
  for (uint l = 0; l < 32; ++l) {
    if (g.active(l) && g.template at<bool>(l)) {
      bits |= ulong(1) << l;
    }
  }
  return simd_vote(bits, g.mask);
}

inline simd_vote simd_active_threads_mask(MH_HERE) {
  auto g = detail::gather(true, "simd_active_threads_mask", loc);
  return simd_vote(g.mask, g.mask);
}

inline bool simd_all(bool b, MH_HERE) {
  return simd_ballot(b, loc).all();
}
inline bool simd_any(bool b, MH_HERE) {
  return simd_ballot(b, loc).any();
}
inline bool simd_is_first(MH_HERE) {
  auto g = detail::gather(true, "simd_is_first", loc);
  return g.lane == g.first();
}
inline bool simd_is_helper_thread() {
  return false;
}
inline bool quad_all(bool b, MH_HERE) {
  auto g = detail::gather(b, "quad_all", loc);
  for (uint l = g.lane & ~3u; l < (g.lane & ~3u) + 4; ++l) {
    if (g.active(l) && !g.template at<bool>(l)) {
      return false;
    }
  }
  return true;
}
inline bool quad_any(bool b, MH_HERE) {
  auto g = detail::gather(b, "quad_any", loc);
  for (uint l = g.lane & ~3u; l < (g.lane & ~3u) + 4; ++l) {
    if (g.active(l) && g.template at<bool>(l)) {
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------ matrices

// 8x8 matrices distributed over the 32 lanes, two elements per lane, in the
// layout Apple GPUs use: lane l holds row (l/4 & 4) + (l/2 % 4), columns c and
// c + 1 with c = (l/4 & 2) * 2 + (l % 2) * 2.
namespace detail {
inline void mat_coord(uint lane, uint& row, uint& col) {
  uint q = lane / 4;
  row = (q & 4u) + (lane / 2) % 4;
  col = (q & 2u) * 2 + (lane % 2) * 2;
}
} // namespace detail

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "[simdgroup-matrix] simdgroup_matrix is 8x8");
  vec<T, 2> e;

  simdgroup_matrix() = default;
  // A diagonal matrix with `d` on the diagonal.
  explicit simdgroup_matrix(T d) {
    uint r, c;
    detail::mat_coord(mh::g_thread->lane, r, c);
    e[0] = r == c ? d : T(0);
    e[1] = r == c + 1 ? d : T(0);
  }
  vec<T, 2>& thread_elements() { return e; }
  const vec<T, 2>& thread_elements() const { return e; }
};

using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = simdgroup_matrix<half, 8, 8>;
using simdgroup_bfloat8x8 = simdgroup_matrix<bfloat, 8, 8>;

template <class T, int Cols, int Rows = Cols>
inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.e = vec<T, 2>(v);
  return m;
}

template <class T, class U>
inline void simdgroup_load(
    simdgroup_matrix<T, 8, 8>& d,
    const U* src,
    ulong elements_per_row = 8,
    ulong2 matrix_origin = ulong2(0),
    bool transpose_matrix = false) {
  uint r, c;
  detail::mat_coord(mh::g_thread->lane, r, c);
  for (uint j = 0; j < 2; ++j) {
    ulong row = transpose_matrix ? c + j : r;
    ulong col = transpose_matrix ? r : c + j;
    d.e[j] = T(src[(matrix_origin.y + row) * elements_per_row + matrix_origin.x + col]);
  }
}

template <class T, class U>
inline void simdgroup_store(
    const simdgroup_matrix<T, 8, 8>& a,
    U* dst,
    ulong elements_per_row = 8,
    ulong2 matrix_origin = ulong2(0),
    bool transpose_matrix = false) {
  uint r, c;
  detail::mat_coord(mh::g_thread->lane, r, c);
  for (uint j = 0; j < 2; ++j) {
    ulong row = transpose_matrix ? c + j : r;
    ulong col = transpose_matrix ? r : c + j;
    dst[(matrix_origin.y + row) * elements_per_row + matrix_origin.x + col] = U(a.e[j]);
  }
}

namespace detail {
// d = a * b (+ c): products summed in float in k order, rounded once to T.
template <class T, class TA, class TB, class TC>
inline void mma(
    simdgroup_matrix<T, 8, 8>& d,
    const simdgroup_matrix<TA, 8, 8>& a,
    const simdgroup_matrix<TB, 8, 8>& b,
    const simdgroup_matrix<TC, 8, 8>* c,
    const char* what,
    const std::source_location& loc) {
  struct Pack {
    float a[2];
    float b[2];
  } p{{float(a.e[0]), float(a.e[1])}, {float(b.e[0]), float(b.e[1])}};
  auto g = gather(p, what, loc);
  float A[8][8], B[8][8];
  for (uint l = 0; l < 32; ++l) {
    Pack q = g.template at<Pack>(l);
    uint r, col;
    mat_coord(l, r, col);
    for (uint j = 0; j < 2; ++j) {
      A[r][col + j] = q.a[j];
      B[r][col + j] = q.b[j];
    }
  }
  uint r, col;
  mat_coord(g.lane, r, col);
  ::mh::rt_count_matrix_macs(2 * 8);  // this lane's share of the 8x8x8 product
  vec<T, 2> out;
  for (uint j = 0; j < 2; ++j) {
    float acc = 0.0f;
    for (uint k = 0; k < 8; ++k) {
      acc += A[r][k] * B[k][col + j];
    }
    if (c) {
      acc += float(c->e[j]);
    }
    out[j] = T(acc);
  }
  d.e = out;
}
} // namespace detail

template <class T, class TA, class TB>
inline void simdgroup_multiply(
    simdgroup_matrix<T, 8, 8>& d,
    const simdgroup_matrix<TA, 8, 8>& a,
    const simdgroup_matrix<TB, 8, 8>& b,
    MH_HERE) {
  detail::mma<T, TA, TB, T>(d, a, b, nullptr, "simdgroup_multiply", loc);
}

template <class T, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(
    simdgroup_matrix<T, 8, 8>& d,
    const simdgroup_matrix<TA, 8, 8>& a,
    const simdgroup_matrix<TB, 8, 8>& b,
    const simdgroup_matrix<TC, 8, 8>& c,
    MH_HERE) {
  detail::mma(d, a, b, &c, "simdgroup_multiply_accumulate", loc);
}

} // namespace metal
