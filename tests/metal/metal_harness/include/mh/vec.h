// metal::vec<T, N> (float4, half2, uint3, ...): Metal sizes and alignments
// (a 3-vector occupies 4 elements), component names x/y/z/w and r/g/b/a,
// multi-letter swizzles (readable; writable when no letter repeats),
// constructors from any mix of scalars and vectors, element-wise operators.
#pragma once

#include "mh/space.h"
#include "mh/swizzles.h"
#include "mh/types.h"

namespace metal {

template <class T, int N>
struct vec;

// Proxy for a multi-letter swizzle: overlays the vector's storage.
template <class T, int S, int... I>
struct swz {
  T e_[S];
  static constexpr int n = sizeof...(I);
  using V = vec<T, n>;

  static constexpr bool writable() {
    constexpr int idx[] = {I...};
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        if (idx[a] == idx[b]) {
          return false;
        }
      }
    }
    return true;
  }

  V val() const { return V(e_[I]...); }
  operator V() const { return val(); }

  swz& operator=(const V& v) {
    static_assert(writable(), "cannot assign to a swizzle that repeats a component");
    constexpr int idx[] = {I...};
    for (int k = 0; k < n; ++k) {
      e_[idx[k]] = v[k];
    }
    return *this;
  }
  swz& operator=(const swz& o) { return *this = o.val(); }
  swz& operator+=(const V& v) { return *this = val() + v; }
  swz& operator-=(const V& v) { return *this = val() - v; }
  swz& operator*=(const V& v) { return *this = val() * v; }
  swz& operator/=(const V& v) { return *this = val() / v; }
  T operator[](int k) const {
    constexpr int idx[] = {I...};
    return e_[idx[k]];
  }
};

namespace detail {

template <class X>
struct vinfo {
  static constexpr int n = 1;
  static constexpr bool is_vec = false;
  static constexpr bool is_swz = false;
  using elem = X;
};
template <class T, int N>
struct vinfo<vec<T, N>> {
  static constexpr int n = N;
  static constexpr bool is_vec = true;
  static constexpr bool is_swz = false;
  using elem = T;
};
template <class T, int S, int... I>
struct vinfo<swz<T, S, I...>> {
  static constexpr int n = sizeof...(I);
  static constexpr bool is_vec = false;
  static constexpr bool is_swz = true;
  using elem = T;
};

// Traits of a value's type without reference, cv or address space (a
// `device float4` operand is a float4).
template <class X>
inline constexpr bool is_swz_v = vinfo<::mh::bare_t<X>>::is_swz;
template <class X>
inline constexpr bool is_vecish_v = vinfo<::mh::bare_t<X>>::is_vec || vinfo<::mh::bare_t<X>>::is_swz;

// A swizzle as its vector value; everything else unchanged.
template <class X>
decltype(auto) tov(const X& x) {
  if constexpr (is_swz_v<X>) {
    return x.val();
  } else {
    return (x);
  }
}

template <class X>
using vec_of = ::mh::bare_t<decltype(tov(std::declval<const X&>()))>;

} // namespace detail

// Vectors wider than 4 (vec<half, 8>: clang's ext_vector_type takes any
// width, and so does Metal's vec) have elements only, aligned as clang
// aligns them (the width rounded up to a power of two).
constexpr int vec_align_elems(int n) {
  int p = 1;
  while (p < n) {
    p *= 2;
  }
  return p;
}
template <class T, int N>
struct alignas(vec_align_elems(N) * sizeof(T)) vstore {
  T e_[N];
};

template <class T>
struct alignas(2 * sizeof(T)) vstore<T, 2> {
  union {
    T e_[2];
    struct {
      T x, y;
    };
    struct {
      T r, g;
    };
    MH_SWIZZLES_2(T, 2)
  };
};

template <class T>
struct alignas(4 * sizeof(T)) vstore<T, 3> {
  union {
    T e_[4];
    struct {
      T x, y, z;
    };
    struct {
      T r, g, b;
    };
    MH_SWIZZLES_3(T, 4)
  };
};

template <class T>
struct alignas(4 * sizeof(T)) vstore<T, 4> {
  union {
    T e_[4];
    struct {
      T x, y, z, w;
    };
    struct {
      T r, g, b, a;
    };
    MH_SWIZZLES_4(T, 4)
  };
};

template <class T, int N>
struct vec : vstore<T, N> {
  static_assert(N >= 2, "vectors have 2 or more components");
  using value_type = T;

  vec() = default;
  vec(const vec& o) = default;
  constexpr vec(T s) {
    for (int i = 0; i < N; ++i) {
      this->e_[i] = s;
    }
  }
  template <class... A>
    requires(sizeof...(A) >= 2 &&
             (detail::vinfo<std::remove_cvref_t<A>>::n + ...) == N)
  constexpr vec(const A&... parts) {
    int k = 0;
    (put(k, parts), ...);
  }
  template <class U>
    requires(!std::is_same_v<U, T>)
  explicit constexpr vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) {
      this->e_[i] = static_cast<T>(o[i]);
    }
  }
  template <class U, int S, int... I>
    requires(sizeof...(I) == N)
  explicit constexpr vec(const swz<U, S, I...>& s) : vec(s.val()) {}

  vec& operator=(const vec& o) {
    std::memcpy(this->e_, o.e_, sizeof(this->e_));
    return *this;
  }

  T& operator[](int i) { return this->e_[i]; }
  const T& operator[](int i) const { return this->e_[i]; }

  template <class A>
  constexpr void put(int& k, const A& a) {
    using I = detail::vinfo<std::remove_cvref_t<A>>;
    if constexpr (I::is_vec || I::is_swz) {
      for (int i = 0; i < I::n; ++i) {
        this->e_[k++] = static_cast<T>(a[i]);
      }
    } else {
      this->e_[k++] = static_cast<T>(a);
    }
  }

  template <class F>
  static vec map(F f) {
    vec r;
    for (int i = 0; i < N; ++i) {
      r.e_[i] = static_cast<T>(f(i));
    }
    return r;
  }

#define MH_VEC_BINARY(op)                                                     \
  friend vec operator op(const vec& a, const vec& b) {                        \
    return map([&](int i) { return a.e_[i] op b.e_[i]; });                    \
  }                                                                           \
  friend vec operator op(const vec& a, T b) {                                 \
    return map([&](int i) { return a.e_[i] op b; });                          \
  }                                                                           \
  friend vec operator op(T a, const vec& b) {                                 \
    return map([&](int i) { return a op b.e_[i]; });                          \
  }                                                                           \
  vec& operator op##=(const vec& b) { return *this = *this op b; }            \
  vec& operator op##=(T b) { return *this = *this op b; }
  MH_VEC_BINARY(+)
  MH_VEC_BINARY(-)
  MH_VEC_BINARY(*)
  MH_VEC_BINARY(/)
  MH_VEC_BINARY(%)
  MH_VEC_BINARY(&)
  MH_VEC_BINARY(|)
  MH_VEC_BINARY(^)
  MH_VEC_BINARY(<<)
  MH_VEC_BINARY(>>)
#undef MH_VEC_BINARY

#define MH_VEC_COMPARE(op)                                                    \
  friend vec<bool, N> operator op(const vec& a, const vec& b) {               \
    return vec<bool, N>::map([&](int i) { return a.e_[i] op b.e_[i]; });      \
  }                                                                           \
  friend vec<bool, N> operator op(const vec& a, T b) {                        \
    return vec<bool, N>::map([&](int i) { return a.e_[i] op b; });            \
  }                                                                           \
  friend vec<bool, N> operator op(T a, const vec& b) {                        \
    return vec<bool, N>::map([&](int i) { return a op b.e_[i]; });            \
  }
  MH_VEC_COMPARE(==)
  MH_VEC_COMPARE(!=)
  MH_VEC_COMPARE(<)
  MH_VEC_COMPARE(>)
  MH_VEC_COMPARE(<=)
  MH_VEC_COMPARE(>=)
  MH_VEC_COMPARE(&&)
  MH_VEC_COMPARE(||)
#undef MH_VEC_COMPARE

  friend vec operator-(const vec& a) {
    return map([&](int i) { return -a.e_[i]; });
  }
  friend vec operator+(const vec& a) { return a; }
  friend vec operator~(const vec& a) {
    return map([&](int i) { return ~a.e_[i]; });
  }
  friend vec<bool, N> operator!(const vec& a) {
    return vec<bool, N>::map([&](int i) { return !a.e_[i]; });
  }
  vec& operator++() { return *this += T(1); }
  vec& operator--() { return *this -= T(1); }
};

// Operators with a swizzle on either side: evaluate the swizzle, then use the
// vector operators above.
#define MH_SWZ_BINARY(op)                                                     \
  template <class A, class B>                                                 \
    requires(detail::is_swz_v<A> || detail::is_swz_v<B>)                      \
  auto operator op(const A& a, const B& b) {                                  \
    return detail::tov(a) op detail::tov(b);                                  \
  }
MH_SWZ_BINARY(+)
MH_SWZ_BINARY(-)
MH_SWZ_BINARY(*)
MH_SWZ_BINARY(/)
MH_SWZ_BINARY(%)
MH_SWZ_BINARY(&)
MH_SWZ_BINARY(|)
MH_SWZ_BINARY(^)
MH_SWZ_BINARY(<<)
MH_SWZ_BINARY(>>)
MH_SWZ_BINARY(==)
MH_SWZ_BINARY(!=)
MH_SWZ_BINARY(<)
MH_SWZ_BINARY(>)
MH_SWZ_BINARY(<=)
MH_SWZ_BINARY(>=)
#undef MH_SWZ_BINARY

template <class A>
  requires detail::is_swz_v<A>
auto operator-(const A& a) {
  return -a.val();
}
template <class A>
  requires detail::is_swz_v<A>
auto operator!(const A& a) {
  return !a.val();
}
template <class A>
  requires detail::is_swz_v<A>
auto operator~(const A& a) {
  return ~a.val();
}

// packed_float3 and friends: tightly packed, convertible to and from vec.
template <class T, int N>
struct pstore;
template <class T>
struct pstore<T, 2> {
  union {
    T e_[2];
    struct {
      T x, y;
    };
  };
};
template <class T>
struct pstore<T, 3> {
  union {
    T e_[3];
    struct {
      T x, y, z;
    };
  };
};
template <class T>
struct pstore<T, 4> {
  union {
    T e_[4];
    struct {
      T x, y, z, w;
    };
  };
};

template <class T, int N>
struct packed_vec : pstore<T, N> {
  packed_vec() = default;
  packed_vec(const vec<T, N>& v) {
    for (int i = 0; i < N; ++i) {
      this->e_[i] = v[i];
    }
  }
  template <class... A>
    requires(sizeof...(A) == N)
  packed_vec(A... a) {
    T v[N] = {static_cast<T>(a)...};
    for (int i = 0; i < N; ++i) {
      this->e_[i] = v[i];
    }
  }
  operator vec<T, N>() const {
    return vec<T, N>::map([&](int i) { return this->e_[i]; });
  }
  T& operator[](int i) { return this->e_[i]; }
  const T& operator[](int i) const { return this->e_[i]; }
};

namespace detail {
template <class X>
struct packed_info {
  static constexpr bool is_packed = false;
};
template <class T, int N>
struct packed_info<packed_vec<T, N>> {
  static constexpr bool is_packed = true;
};
} // namespace detail

#define MH_VEC_NAMES(T)                \
  using T##2 = vec<T, 2>;              \
  using T##3 = vec<T, 3>;              \
  using T##4 = vec<T, 4>;              \
  using packed_##T##2 = packed_vec<T, 2>; \
  using packed_##T##3 = packed_vec<T, 3>; \
  using packed_##T##4 = packed_vec<T, 4>;
MH_VEC_NAMES(bool)
MH_VEC_NAMES(char)
MH_VEC_NAMES(uchar)
MH_VEC_NAMES(short)
MH_VEC_NAMES(ushort)
MH_VEC_NAMES(int)
MH_VEC_NAMES(uint)
MH_VEC_NAMES(long)
MH_VEC_NAMES(ulong)
MH_VEC_NAMES(half)
MH_VEC_NAMES(float)
MH_VEC_NAMES(bfloat)
#undef MH_VEC_NAMES

static_assert(sizeof(vec<float, 3>) == 16 && alignof(vec<float, 3>) == 16);
static_assert(sizeof(vec<half, 3>) == 8 && sizeof(vec<half, 2>) == 4);
static_assert(sizeof(packed_vec<float, 3>) == 12);

} // namespace metal

#define MH_GLOBAL_VEC(T)              \
  using metal::T##2;                  \
  using metal::T##3;                  \
  using metal::T##4;                  \
  using metal::packed_##T##2;         \
  using metal::packed_##T##3;         \
  using metal::packed_##T##4;
MH_GLOBAL_VEC(bool)
MH_GLOBAL_VEC(char)
MH_GLOBAL_VEC(uchar)
MH_GLOBAL_VEC(short)
MH_GLOBAL_VEC(ushort)
MH_GLOBAL_VEC(int)
MH_GLOBAL_VEC(uint)
MH_GLOBAL_VEC(long)
MH_GLOBAL_VEC(ulong)
MH_GLOBAL_VEC(half)
MH_GLOBAL_VEC(float)
MH_GLOBAL_VEC(bfloat)
#undef MH_GLOBAL_VEC
