// Metal 4 tensor views and the part of MetalPerformancePrimitives' inline
// tensor operations that the project's kernels use (<metal_tensor>,
// <MetalPerformancePrimitives/MetalPerformancePrimitives.h>).
//
// Emulated, and nothing more:
//  - metal::dynamic_extent, metal::dextents<I, R>, metal::tensor_inline;
//  - metal::tensor<T, dextents<I, R>, tensor_inline>: a non-owning view over
//    a pointer in T's address space (tensor<device half, ...>) made from
//    (pointer, extents), packed, or (pointer, extents, array<int, R>
//    strides). Dimension 0 is the contiguous one: a row-major R x C matrix
//    is a tensor of extents (C, R), and element [i0, i1] sits at
//    pointer + i0 * s0 + i1 * s1. Operations read rank-2 views only.
//  - metal::execution_simdgroups<N>: the operation is shared by the N
//    simdgroups of the threadgroup, which must then have exactly 32 * N
//    threads (a launch with another count fails). execution_thread exists
//    as a type (the checks accept it) but is not emulated.
//  - mpp::tensor_ops::matmul2d_descriptor(m, n, k = dynamic, transpose_left,
//    transpose_right, relaxed_precision, mode) and
//    matmul2d<descriptor, scope>::run(left, right, destination):
//      mode::multiply              C = A * B
//      mode::multiply_accumulate   C = A * B + C
//    with A (m x K), B (K x n) and the m x n tile C. K is the descriptor's k,
//    or with k = dynamic_extent the left operand's K extent. Without
//    transposes A is stored row-major (tensor extents (K, m)) and B too
//    (extents (n, K)); transpose_left / transpose_right mean the tensor
//    holds A^T (extents (m, K)) / B^T (extents (K, n)). The destination is a
//    tensor of extents (n, m) or the op's destination cooperative tensor.
//    Operand elements outside a tensor's extents read as 0 and destination
//    elements outside them are not written (the documented edge checking).
//    Each element is summed in float in k order, starting from C with
//    multiply_accumulate, then converted once to the destination type;
//    relaxed_precision changes nothing here.
//  - the destination cooperative tensor (get_destination_cooperative_tensor
//    <L, R, T>()): get_capacity(), operator[], load(tensor) and
//    store(tensor). Its elements start as NaN (for float and half types): a
//    kernel must initialise them, as on the GPU, where their content is
//    undefined.
//
// Compile-time checks, as Apple's headers make them (messages tagged
// [tensor-ops], reported by the strict pass with the .metal line): load and
// store take a tensor of exactly the cooperative tensor's element type (no
// conversion); operands are rank 2 with int indices, in device, threadgroup
// or thread memory; run() accepts the element-type combinations
// MPPTensorOpsMatMul2d.h lists; the scope is an execution scope; the
// getter's operand types are stripped of reference, cv and address space
// (decltype of a local works) and its element type is unqualified. Address
// spaces are visible only to the clang pass (mh/strict.h); under g++ they
// are empty words.
//
// Threads are not synchronised by run() or store(): each thread computes
// (stores) the destination elements it owns, reading the operands as they
// are when it makes the call. A missing barrier between writing an operand
// and run(), or between run() and overwriting it, therefore changes results
// under the reverse and random schedules, and a thread that skips run()
// leaves its elements unchanged. Ownership: element (m, n) of an m x n tile
// belongs to thread (m * n_cols + n) % (32 * N) of the scope, in slot
// (m * n_cols + n) / (32 * N). The GPU's distribution is implementation
// defined; kernels must not depend on this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mh/rt.h"
#include "mh/simd.h"
#include "mh/space.h"
#include "mh/types.h"

namespace metal {

constexpr size_t dynamic_extent = static_cast<size_t>(-1);

struct tensor_inline {};
struct mh_unset {};  // extents to fill in (a slice's)

template <class IndexType, size_t Rank>
struct dextents {
  static_assert(Rank >= 1, "a tensor has at least one dimension");
  IndexType mh_e[Rank];

  template <class... I>
    requires(sizeof...(I) == Rank)
  constexpr dextents(I... v) : mh_e{static_cast<IndexType>(v)...} {}
  constexpr explicit dextents(mh_unset) : mh_e{} {}
  static constexpr size_t rank() { return Rank; }
  constexpr IndexType extent(size_t r) const { return mh_e[r]; }
};

// Extents fixed at compile time where not dynamic_extent (a tensor's
// slice<E0, E1>(...) has them); the dynamic ones are given, in order.
template <class IndexType, size_t... E>
struct extents {
  static constexpr size_t Rank = sizeof...(E);
  static_assert(Rank >= 1, "a tensor has at least one dimension");
  static constexpr size_t mh_static[Rank] = {E...};
  static constexpr size_t mh_dynamic = ((E == dynamic_extent ? 1 : 0) + ...);
  IndexType mh_e[Rank];

  template <class... I>
    requires(sizeof...(I) == mh_dynamic || sizeof...(I) == Rank)
  constexpr extents(I... v) : mh_e{} {
    const IndexType given[sizeof...(I) + 1] = {static_cast<IndexType>(v)...};
    size_t k = 0;
    for (size_t r = 0; r < Rank; ++r) {
      if (sizeof...(I) == Rank) {
        mh_e[r] = given[r];
      } else {
        mh_e[r] = mh_static[r] == dynamic_extent ? given[k++] : static_cast<IndexType>(mh_static[r]);
      }
    }
  }
  constexpr explicit extents(mh_unset) : mh_e{} {}
  static constexpr size_t rank() { return Rank; }
  static constexpr size_t static_extent(size_t r) { return mh_static[r]; }
  constexpr IndexType extent(size_t r) const { return mh_e[r]; }
};

template <class ElementType, class Extents, class Descriptor = tensor_inline>
struct tensor {
  static_assert(sizeof(ElementType) == 0,
                "the harness emulates tensor<T, dextents<I, R> or extents<I, E...>, tensor_inline> only");
};

// A view of rank R over a pointer in T's address space (T may carry one:
// tensor<device half, ...>), of extents X (dextents<I, R> or extents<I, E...>).
template <class T, class X, class Descriptor>
  requires requires { X::rank(); &X::mh_e; }
struct tensor<T, X, Descriptor> {
  static_assert(std::is_same_v<Descriptor, tensor_inline>,
                "the harness emulates tensor_inline views only");
  using element_type = T;
  using index_type = std::remove_cvref_t<decltype(std::declval<X&>().mh_e[0])>;
  using extents_type = X;
  using I = index_type;
  static constexpr size_t R = X::rank();
  static constexpr size_t mh_rank = R;

  T* mh_data;
  I mh_ext[R];
  long mh_stride[R];

  tensor(T* data, X e) : mh_data(data) {
    long s = 1;
    for (size_t r = 0; r < R; ++r) {
      mh_ext[r] = e.mh_e[r];
      mh_stride[r] = s;
      s *= long(e.mh_e[r]);
    }
  }
  tensor(T* data, X e, array<int, R> strides) : mh_data(data) {
    for (size_t r = 0; r < R; ++r) {
      mh_ext[r] = e.mh_e[r];
      mh_stride[r] = long(strides[r]);
    }
  }

  I get_extent(size_t r) const { return mh_ext[r]; }

  // The view from `offsets` on, of extents S (static, or for
  // dynamic_extent the rest of this view), with this view's strides; none
  // given: every extent dynamic.
  template <size_t... S, class... O>
  auto slice(O... offsets) const {
    static_assert(sizeof...(O) == R, "[tensor-ops] slice takes one offset per dimension");
    static_assert(sizeof...(S) == R || sizeof...(S) == 0, "[tensor-ops] slice takes one extent per dimension");
    const long off[R] = {long(offsets)...};
    using Y = std::conditional_t<sizeof...(S) == 0, dextents<I, R>, extents<I, S...>>;
    T* p = mh_data;
    array<int, R> strides{};
    Y e = mh_slice_extents<Y, S...>(off);
    for (size_t r = 0; r < R; ++r) {
      if (off[r] < 0 || off[r] > long(mh_ext[r])) {
        ::mh::rt_fail("tensor::slice: offset %ld outside extent %ld of dimension %zu", off[r], long(mh_ext[r]), r);
      }
      p += off[r] * mh_stride[r];
      strides[r] = int(mh_stride[r]);
    }
    return tensor<T, Y, tensor_inline>(p, e, strides);
  }
  template <class Y, size_t... S>
  Y mh_slice_extents(const long* off) const {
    constexpr size_t given[R + 1] = {S...};
    Y e{mh_unset{}};
    for (size_t r = 0; r < R; ++r) {
      const size_t s = sizeof...(S) == 0 ? dynamic_extent : given[r];
      e.mh_e[r] = s == dynamic_extent ? I(long(mh_ext[r]) - off[r]) : I(s);
    }
    return e;
  }

  bool mh_inside(long i0, long i1) const {
    return i0 >= 0 && i1 >= 0 && i0 < long(mh_ext[0]) && i1 < long(mh_ext[1]);
  }
  T* mh_at(long i0, long i1) const { return mh_data + i0 * mh_stride[0] + i1 * mh_stride[1]; }
};

template <class T, class I, size_t R>
tensor(T*, dextents<I, R>) -> tensor<T, dextents<I, R>, tensor_inline>;
template <class T, class I, size_t R>
tensor(T*, dextents<I, R>, array<int, R>) -> tensor<T, dextents<I, R>, tensor_inline>;
template <class T, class I, size_t... E>
tensor(T*, extents<I, E...>) -> tensor<T, extents<I, E...>, tensor_inline>;
template <class T, class I, size_t... E>
tensor(T*, extents<I, E...>, array<int, sizeof...(E)>) -> tensor<T, extents<I, E...>, tensor_inline>;

template <size_t N>
struct execution_simdgroups {
  static_assert(N != 0, "execution_simdgroups<0> is not supported");
  static constexpr size_t static_size = N;
  static constexpr size_t size() { return N; }
};
template <size_t N>
struct execution_threads {
  static_assert(N == 1, "only execution_threads<1> (execution_thread) is supported");
  static constexpr size_t static_size = N;
  static constexpr size_t size() { return N; }
};
using execution_simdgroup = execution_simdgroups<1>;
using execution_thread = execution_threads<1>;

} // namespace metal

namespace mh {

// The checks MetalPerformancePrimitives makes at compile time, in our words.
// Each message starts with the rule tag the strict pass reports.
template <class T>
struct TensorTraits : std::false_type {};
template <class T, class X, class D>
  requires requires { metal::tensor<T, X, D>::mh_rank; }
struct TensorTraits<metal::tensor<T, X, D>> : std::true_type {
  using element = bare_t<T>;
  using index = typename metal::tensor<T, X, D>::index_type;
  static constexpr size_t rank = metal::tensor<T, X, D>::mh_rank;
  static constexpr int space = address_space_v<std::remove_cv_t<T>>;
};
template <class T>
inline constexpr bool is_tensor_v = TensorTraits<bare_t<T>>::value;

// A tensor operand of an MPP op: rank 2, int indices, a space run() reads.
template <class View>
constexpr void check_tensor_operand() {
  using Tr = TensorTraits<bare_t<View>>;
  static_assert(Tr::rank == 2, "[tensor-ops] matmul2d operands are rank-2 tensors");
  static_assert(std::is_same_v<typename Tr::index, int>,
                "[tensor-ops] tensor operations index tensors with int (dextents<int32_t, R>); 64-bit extents are not supported");
  static_assert(Tr::space == kDevice || Tr::space == kThreadgroup || Tr::space == kThread,
                "[tensor-ops] tensor operands live in device, threadgroup or thread memory (not constant)");
}

template <class T>
inline constexpr bool emulated_type_v = std::is_same_v<T, float> || std::is_same_v<T, half> ||
    std::is_same_v<T, metal::bfloat>;

// matmul2d's supported (left, right, destination) element types, as listed
// by MPPTensorOpsMatMul2d.h (MacOSX 26.1 SDK).
template <class A, class B, class C>
constexpr bool matmul_types_supported() {
  using metal::bfloat;
  using i8 = int8_t;
  constexpr bool list[] = {
      std::is_same_v<A, half> && std::is_same_v<B, half> && std::is_same_v<C, half>,
      std::is_same_v<A, half> && std::is_same_v<B, i8> && std::is_same_v<C, half>,
      std::is_same_v<A, i8> && std::is_same_v<B, half> && std::is_same_v<C, half>,
      std::is_same_v<A, half> && std::is_same_v<B, half> && std::is_same_v<C, float>,
      std::is_same_v<A, half> && std::is_same_v<B, float> && std::is_same_v<C, float>,
      std::is_same_v<A, half> && std::is_same_v<B, i8> && std::is_same_v<C, float>,
      std::is_same_v<A, float> && std::is_same_v<B, half> && std::is_same_v<C, float>,
      std::is_same_v<A, float> && std::is_same_v<B, float> && std::is_same_v<C, float>,
      std::is_same_v<A, float> && std::is_same_v<B, i8> && std::is_same_v<C, float>,
      std::is_same_v<A, i8> && std::is_same_v<B, half> && std::is_same_v<C, float>,
      std::is_same_v<A, i8> && std::is_same_v<B, float> && std::is_same_v<C, float>,
      std::is_same_v<A, i8> && std::is_same_v<B, i8> && std::is_same_v<C, int32_t>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, bfloat> && std::is_same_v<C, bfloat>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, bfloat> && std::is_same_v<C, float>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, float> && std::is_same_v<C, float>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, i8> && std::is_same_v<C, bfloat>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, i8> && std::is_same_v<C, float>,
      std::is_same_v<A, float> && std::is_same_v<B, bfloat> && std::is_same_v<C, float>,
      std::is_same_v<A, i8> && std::is_same_v<B, bfloat> && std::is_same_v<C, bfloat>,
      std::is_same_v<A, i8> && std::is_same_v<B, bfloat> && std::is_same_v<C, float>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, half> && std::is_same_v<C, bfloat>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, half> && std::is_same_v<C, half>,
      std::is_same_v<A, bfloat> && std::is_same_v<B, half> && std::is_same_v<C, float>,
      std::is_same_v<A, half> && std::is_same_v<B, bfloat> && std::is_same_v<C, bfloat>,
      std::is_same_v<A, half> && std::is_same_v<B, bfloat> && std::is_same_v<C, half>,
      std::is_same_v<A, half> && std::is_same_v<B, bfloat> && std::is_same_v<C, float>,
  };
  for (bool ok : list) {
    if (ok) {
      return true;
    }
  }
  return false;
}

template <class Scope>
struct is_execution_scope : std::false_type {};
template <size_t N>
struct is_execution_scope<metal::execution_simdgroups<N>> : std::true_type {};
template <size_t N>
struct is_execution_scope<metal::execution_threads<N>> : std::true_type {};

// How an R x C matrix held in a cooperative tensor is spread over the
// `Threads` threads of its scope. One simdgroup and 16-element-aligned
// shapes: Apple's 16 x 16 fragments, as MLX's NAX kernels read them
// (steel/gemm/nax.h, BaseNAXFrag::get_coord): fragments in row-major order,
// 8 elements each; lane l holds rows fm and fm + 8 and columns fn to fn + 3
// of each, with q = l / 4, fm = (q & 4) | ((l / 2) & 3), fn = ((q & 2) |
// (l & 1)) * 4, slot 4 * i + j at (fm + 8 i, fn + j). Other scopes and
// shapes (no public layout): element e = slot * Threads + thread, row-major.
template <int R, int C, int Threads>
struct CoopLayout {
  static constexpr int rows = R;
  static constexpr int cols = C;
  static constexpr bool fragments = Threads == 32 && R % 16 == 0 && C % 16 == 0;
  static constexpr int capacity = fragments ? R * C / 32 : (R * C + Threads - 1) / Threads;

  // (row, column) of slot i of thread `owner`; false past the matrix.
  static bool element(int owner, int i, int& r, int& c) {
    if constexpr (fragments) {
      const int frag = i / 8, e = i % 8;
      const int q = owner >> 2;
      r = (frag / (C / 16)) * 16 + ((q & 4) | ((owner >> 1) & 3)) + (e / 4) * 8;
      c = (frag % (C / 16)) * 16 + ((q & 2) | (owner & 1)) * 4 + e % 4;
      return i < capacity;
    } else {
      const int e = i * Threads + owner;
      r = e / C;
      c = e % C;
      return e < R * C;
    }
  }
};

// The roles of matmul2d's cooperative tensors: the destination (m x n) and
// the left (m x k, or k x m transposed) and right (k x n, or n x k) inputs,
// each as its tensor stores it.
template <int M, int N, int Threads>
struct MatmulDestination {
  using layout = CoopLayout<M, N, Threads>;
  static constexpr int threads = Threads;
};
template <int R, int C, int Threads>
struct MatmulLeft {
  using layout = CoopLayout<R, C, Threads>;
  static constexpr int threads = Threads;
};
template <int R, int C, int Threads>
struct MatmulRight {
  using layout = CoopLayout<R, C, Threads>;
  static constexpr int threads = Threads;
};

template <class Scope>
struct ScopeThreads {
  static_assert(sizeof(Scope) == 0, "the harness emulates execution_simdgroups<N> scopes only");
};
template <size_t N>
struct ScopeThreads<metal::execution_simdgroups<N>> {
  static constexpr int value = 32 * int(N);
};

// This thread's index in its scope of `threads` threads: the threadgroup's
// simdgroups form scopes of `threads / 32` consecutive simdgroups (one
// simdgroup each for execution_simdgroup, MLX's NAX tiles); fails the launch
// when the threadgroup's size is not a multiple of the scope's.
inline int scope_thread(int threads, const char* what) {
  const ThreadInfo* t = g_thread;
  const uint32_t n = t->group_size[0] * t->group_size[1] * t->group_size[2];
  if (n % uint32_t(threads) != 0) {
    rt_fail("%s: the operation's scope is execution_simdgroups<%d> (%d threads) but the threadgroup has %u threads",
            what, threads / 32, threads, n);
  }
  return int(t->local_index % uint32_t(threads));
}

template <class T>
inline void poison(T& v) {
  std::memset(static_cast<void*>(&v), 0xFF, sizeof(T));
}

} // namespace mh

namespace metal {

template <class ElementType, class Extents, class Layout>
struct cooperative_tensor;

template <class T, class Role>
struct cooperative_tensor<T, dextents<int, 2>, Role> {
  using layout = typename Role::layout;
  using element_type = T;
  static constexpr int mh_capacity = layout::capacity;
  static constexpr int mh_threads = Role::threads;
  T mh_v[mh_capacity];

  cooperative_tensor() {
    for (int i = 0; i < mh_capacity; ++i) {
      mh::poison(mh_v[i]);
    }
  }
  static constexpr uint16_t get_capacity() { return uint16_t(mh_capacity); }
  T& operator[](int i) { return mh_v[mh_slot(i)]; }
  const T& operator[](int i) const { return mh_v[mh_slot(i)]; }
  static int mh_slot(int i) {
    if (i < 0 || i >= mh_capacity) {
      ::mh::rt_fail("cooperative tensor index %d outside its capacity %d", i, mh_capacity);
    }
    return i;
  }

  // Element (r, c) of slot i of this thread, or false past the matrix.
  static bool mh_element(int owner, int i, int& r, int& c) { return layout::element(owner, i, r, c); }

  // Where slot i of this thread sits, in tensor order: {column, row}.
  array<int, 2> get_multidimensional_index(int i) const {
    const int owner = mh::scope_thread(mh_threads, "cooperative_tensor::get_multidimensional_index");
    int r = 0, c = 0;
    layout::element(owner, mh_slot(i), r, c);
    return array<int, 2>{{c, r}};
  }

  // Apple's headers require the tensor's element type to be the
  // cooperative tensor's (no conversion on load or store).
  template <class View>
  static constexpr void mh_check_view() {
    static_assert(mh::is_tensor_v<View>, "[tensor-ops] a cooperative tensor loads from and stores to a tensor");
    mh::check_tensor_operand<View>();
    static_assert(std::is_same_v<typename mh::TensorTraits<mh::bare_t<View>>::element, T>,
                  "[tensor-ops] Tensor datatype does not match cooperative tensor");
  }

  template <class View>
  void store(const View& dst) const {
    mh_check_view<View>();
    const int owner = mh::scope_thread(mh_threads, "cooperative_tensor::store");
    for (int i = 0; i < mh_capacity; ++i) {
      int r, c;
      if (mh_element(owner, i, r, c) && dst.mh_inside(c, r)) {
        *dst.mh_at(c, r) = mh_v[i];
      }
    }
  }

  // Elements outside the source's extents are left as they are.
  template <class View>
  void load(const View& src) {
    mh_check_view<View>();
    const int owner = mh::scope_thread(mh_threads, "cooperative_tensor::load");
    for (int i = 0; i < mh_capacity; ++i) {
      int r, c;
      if (mh_element(owner, i, r, c) && src.mh_inside(c, r)) {
        mh_v[i] = *src.mh_at(c, r);
      }
    }
  }

  // The whole matrix, as floats (row-major), from every thread's slots: a
  // simd-group exchange at the caller's site (one simdgroup scopes only).
  void mh_gather(float* out, const std::source_location& loc) const {
    static_assert(mh_threads == 32, "cooperative operands of matmul2d are emulated for execution_simdgroup scopes only");
    struct Chunk {
      unsigned char b[::mh::kSlotBytes];
    };
    constexpr int bytes = int(sizeof(mh_v));
    unsigned char mine[(bytes + ::mh::kSlotBytes - 1) / ::mh::kSlotBytes * ::mh::kSlotBytes] = {};
    std::memcpy(mine, static_cast<const void*>(mh_v), bytes);
    unsigned char all[32][sizeof(mine)];  // this fiber's copy: others run between the chunks
    for (int at = 0; at < bytes; at += ::mh::kSlotBytes) {
      Chunk ch;
      std::memcpy(ch.b, mine + at, sizeof(ch.b));
      auto g = detail::gather(ch, "matmul2d::run", loc);
      for (uint l = 0; l < 32; ++l) {
        const Chunk got = g.template at<Chunk>(l);
        std::memcpy(&all[l][at], got.b, sizeof(got.b));
      }
    }
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < mh_capacity; ++i) {
        int r, c;
        if (mh_element(l, i, r, c)) {
          T v;
          std::memcpy(static_cast<void*>(&v), &all[l][i * sizeof(T)], sizeof(T));
          out[r * layout::cols + c] = float(v);
        }
      }
    }
  }
};

} // namespace metal

namespace mh {
template <class D>
struct IsCooperative : std::false_type {};
template <class T, class E, class L>
struct IsCooperative<metal::cooperative_tensor<T, E, L>> : std::true_type {
  using element = T;
};
// Elements (and columns) of a cooperative tensor's whole matrix; 1 for others.
template <class D>
struct CoopSize {
  static constexpr int value = 1;
  static constexpr int cols = 1;
};
template <class T, class E, class L>
struct CoopSize<metal::cooperative_tensor<T, E, L>> {
  static constexpr int value = L::layout::rows * L::layout::cols;
  static constexpr int cols = L::layout::cols;
};
} // namespace mh

namespace mpp::tensor_ops {

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };

  int m, n, k;
  bool transpose_left, transpose_right;
  bool relaxed_precision;
  mode matmul_mode;

  constexpr matmul2d_descriptor(
      int m_,
      int n_,
      int k_ = static_cast<int>(metal::dynamic_extent),
      bool transpose_left_ = false,
      bool transpose_right_ = false,
      bool relaxed_precision_ = false,
      mode matmul_mode_ = mode::multiply)
      : m(m_),
        n(n_),
        k(k_),
        transpose_left(transpose_left_),
        transpose_right(transpose_right_),
        relaxed_precision(relaxed_precision_),
        matmul_mode(matmul_mode_) {}
};

template <matmul2d_descriptor Descriptor, class Scope>
class matmul2d {
  static_assert(mh::is_execution_scope<mh::bare_t<Scope>>::value,
                "[tensor-ops] the Scope template argument is an execution scope (execution_simdgroups<N>, execution_thread)");
  static_assert(Descriptor.m > 0 && Descriptor.n > 0, "matmul2d needs a positive m and n");

 public:
  static constexpr matmul2d_descriptor descriptor = Descriptor;
  using scope = Scope;
  static constexpr int mh_threads = mh::ScopeThreads<Scope>::value;
  static constexpr bool mh_dynamic_k = Descriptor.k == static_cast<int>(metal::dynamic_extent);
  template <class T>
  using mh_destination = metal::cooperative_tensor<
      T, metal::dextents<int, 2>, mh::MatmulDestination<Descriptor.m, Descriptor.n, mh_threads>>;
  // The inputs as their tensors store them (transposed: k x m, n x k).
  template <class T>
  using mh_left = metal::cooperative_tensor<
      T, metal::dextents<int, 2>,
      mh::MatmulLeft<Descriptor.transpose_left ? Descriptor.k : Descriptor.m,
                     Descriptor.transpose_left ? Descriptor.m : Descriptor.k, mh_threads>>;
  template <class T>
  using mh_right = metal::cooperative_tensor<
      T, metal::dextents<int, 2>,
      mh::MatmulRight<Descriptor.transpose_right ? Descriptor.n : Descriptor.k,
                      Descriptor.transpose_right ? Descriptor.k : Descriptor.n, mh_threads>>;

  // The operand types may come from decltype of locals, with references,
  // cv and address spaces: those are stripped, as the headers do.
  template <class LeftOperand, class RightOperand, class ElementType>
  mh_destination<ElementType> get_destination_cooperative_tensor() const {
    static_assert(mh::is_tensor_v<LeftOperand> || mh::IsCooperative<mh::bare_t<LeftOperand>>::value,
                  "[tensor-ops] get_destination_cooperative_tensor takes the left operand's type (a tensor)");
    static_assert(mh::is_tensor_v<RightOperand> || mh::IsCooperative<mh::bare_t<RightOperand>>::value,
                  "[tensor-ops] get_destination_cooperative_tensor takes the right operand's type (a tensor)");
    static_assert(mh::address_space_v<ElementType> == mh::kThread && std::is_same_v<std::remove_cv_t<ElementType>, ElementType>,
                  "[tensor-ops] a cooperative tensor's element type is unqualified (thread space)");
    static_assert(mh::emulated_type_v<ElementType>, "emulated destination types: float, half, bfloat");
    mh::scope_thread(mh_threads, "matmul2d::get_destination_cooperative_tensor");
    return mh_destination<ElementType>();
  }

  // Cooperative left and right inputs, given the element types of the left,
  // right and destination operands (the left's or the right's is the
  // tensor's); a static k.
  template <class LeftType, class RightType, class DestinationType>
  mh_left<LeftType> get_left_input_cooperative_tensor() const {
    mh_check_input_types<LeftType, RightType, DestinationType>();
    mh::scope_thread(mh_threads, "matmul2d::get_left_input_cooperative_tensor");
    return mh_left<LeftType>();
  }
  template <class LeftType, class RightType, class DestinationType>
  mh_right<RightType> get_right_input_cooperative_tensor() const {
    mh_check_input_types<LeftType, RightType, DestinationType>();
    mh::scope_thread(mh_threads, "matmul2d::get_right_input_cooperative_tensor");
    return mh_right<RightType>();
  }

  template <class LeftType, class RightType, class DestinationType>
  static constexpr void mh_check_input_types() {
    static_assert(!mh_dynamic_k, "[tensor-ops] cooperative inputs need the descriptor's static k");
    static_assert(mh::matmul_types_supported<LeftType, RightType, DestinationType>(),
                  "[tensor-ops] matmul2d does not support this combination of left, right and destination element types");
    static_assert(mh::emulated_type_v<LeftType> && mh::emulated_type_v<RightType> && mh::emulated_type_v<DestinationType>,
                  "emulated operand types: float, half, bfloat");
  }

  // C = A B (+ C): tensors or this op's cooperative tensors. Cooperative
  // inputs are exchanged in the simdgroup first (a collective at the call);
  // each thread then computes the destination elements it owns from the
  // operands as they are (no synchronisation beyond that).
  template <class Left, class Right, class D>
  void run(Left& left, Right& right, D& destination, MH_HERE) const {
    using L0 = mh::bare_t<Left>;
    using R0 = mh::bare_t<Right>;
    constexpr bool coop_left = mh::IsCooperative<L0>::value;
    constexpr bool coop_right = mh::IsCooperative<R0>::value;
    static_assert(mh::is_tensor_v<Left> || coop_left, "[tensor-ops] matmul2d's left operand is a tensor or a cooperative tensor");
    static_assert(mh::is_tensor_v<Right> || coop_right, "[tensor-ops] matmul2d's right operand is a tensor or a cooperative tensor");
    if constexpr (!coop_left) {
      mh::check_tensor_operand<Left>();
    } else {
      static_assert(std::is_same_v<L0, mh_left<typename L0::element_type>>,
                    "[tensor-ops] the left cooperative tensor comes from this op's get_left_input_cooperative_tensor");
    }
    if constexpr (!coop_right) {
      mh::check_tensor_operand<Right>();
    } else {
      static_assert(std::is_same_v<R0, mh_right<typename R0::element_type>>,
                    "[tensor-ops] the right cooperative tensor comes from this op's get_right_input_cooperative_tensor");
    }
    using LT = std::conditional_t<coop_left, mh::IsCooperative<L0>, mh::TensorTraits<L0>>::element;
    using RT = std::conditional_t<coop_right, mh::IsCooperative<R0>, mh::TensorTraits<R0>>::element;
    using DT = typename std::conditional_t<mh::IsCooperative<D>::value, mh::IsCooperative<D>,
                                           mh::TensorTraits<mh::bare_t<D>>>::element;
    if constexpr (!mh::IsCooperative<D>::value) {
      mh::check_tensor_operand<D>();
    }
    static_assert(mh::matmul_types_supported<LT, RT, DT>(),
                  "[tensor-ops] matmul2d does not support this combination of left, right and destination element types");
    static_assert(mh::emulated_type_v<LT> && mh::emulated_type_v<RT> && mh::emulated_type_v<DT>,
                  "emulated operand types: float, half, bfloat");
    const int owner = mh::scope_thread(mh_threads, "matmul2d::run");
    int kk = Descriptor.k;
    if constexpr (mh_dynamic_k) {
      static_assert(!coop_left, "[tensor-ops] cooperative inputs need the descriptor's static k");
      kk = int(Descriptor.transpose_left ? left.mh_ext[1] : left.mh_ext[0]);
    }
    // Cooperative inputs, whole, from every lane (stored as their tensors).
    float lbuf[mh::CoopSize<L0>::value];
    float rbuf[mh::CoopSize<R0>::value];
    if constexpr (coop_left) {
      left.mh_gather(lbuf, loc);
    }
    if constexpr (coop_right) {
      right.mh_gather(rbuf, loc);
    }
    auto a = [&](int m, int k) -> float {
      const long r = Descriptor.transpose_left ? k : m;
      const long c = Descriptor.transpose_left ? m : k;
      if constexpr (coop_left) {
        return lbuf[r * mh::CoopSize<L0>::cols + c];
      } else {
        return left.mh_inside(c, r) ? float(*left.mh_at(c, r)) : 0.0f;
      }
    };
    auto b = [&](int k, int n) -> float {
      const long r = Descriptor.transpose_right ? n : k;
      const long c = Descriptor.transpose_right ? k : n;
      if constexpr (coop_right) {
        return rbuf[r * mh::CoopSize<R0>::cols + c];
      } else {
        return right.mh_inside(c, r) ? float(*right.mh_at(c, r)) : 0.0f;
      }
    };
    constexpr bool accumulate = Descriptor.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate;
    if constexpr (mh::IsCooperative<D>::value) {
      static_assert(std::is_same_v<D, mh_destination<typename mh::IsCooperative<D>::element>>,
                    "the destination cooperative tensor comes from this op");
      for (int i = 0; i < D::mh_capacity; ++i) {
        int m, n;
        if (!D::mh_element(owner, i, m, n)) {
          continue;
        }
        ::mh::rt_count_matrix_macs(kk);  // this element's multiply-adds, on the matrix units
        float acc = accumulate ? float(destination[i]) : 0.0f;
        for (int k = 0; k < kk; ++k) {
          acc += a(m, k) * b(k, n);
        }
        destination[i] = static_cast<DT>(acc);
      }
    } else {
      for (int i = 0; i < (Descriptor.m * Descriptor.n + mh_threads - 1) / mh_threads; ++i) {
        const int e = i * mh_threads + owner;
        if (e >= Descriptor.m * Descriptor.n) {
          break;
        }
        const int m = e / Descriptor.n;
        const int n = e % Descriptor.n;
        ::mh::rt_count_matrix_macs(kk);
        if (!destination.mh_inside(n, m)) {
          continue;
        }
        float acc = accumulate ? float(*destination.mh_at(n, m)) : 0.0f;
        for (int k = 0; k < kk; ++k) {
          acc += a(m, k) * b(k, n);
        }
        *destination.mh_at(n, m) = static_cast<DT>(acc);
      }
    }
  }
};

} // namespace mpp::tensor_ops
