// Metal math, common, integer, geometric and relational functions, as_type
// and the usual constants, laid out as Apple's <metal_stdlib> lays them out:
// compiler built-ins (__metal_fabs(x, mode), __metal_simd_sum(x), ...) that
// sources may call directly (MLX's bf16_math.h does), and the metal::,
// metal::fast:: and metal::precise:: functions over them.
//
// The library is Apple's, not a superset of it: floating functions take
// float and half scalars and vectors (the specification's T), bfloat only by
// converting to float (MSL's one implicit conversion of bfloat), so
// `bfloat y = exp(x)` does not compile here either; there are no bfloat
// overloads for a source to collide with when it defines its own. half
// functions compute in float and round back.
#pragma once

#include "mh/space.h"
#include "mh/vec.h"

// Math modes of the built-ins (Apple's compiler predefines the first four;
// <metal_math> picks the default one).
#define __METAL_FAST_MATH__ 0
#define __METAL_HALF_MATH__ 1
#define __METAL_NATIVE_MATH__ 2
#define __METAL_PRECISE_MATH__ 3
// Fast math is Metal's default.
#define __METAL_MAYBE_FAST_MATH__ __METAL_FAST_MATH__

namespace metal {

// <metal_type_traits>'s vector and address-space traits.
template <class T>
struct is_vector : std::bool_constant<detail::vinfo<std::remove_cv_t<T>>::is_vec> {};
template <class T>
inline constexpr bool is_vector_v = is_vector<T>::value;
template <class T>
struct vec_elements : std::integral_constant<int, detail::vinfo<std::remove_cv_t<T>>::n> {};
template <class T>
inline constexpr int vec_elements_v = vec_elements<T>::value;
template <class T>
struct remove_address_space {
  using type = ::mh::remove_address_space_t<T>;
};
template <class T>
using remove_address_space_t = typename remove_address_space<T>::type;
template <class T>
using remove_addrspace = remove_address_space<T>;
template <class T>
using remove_addrspace_t = remove_address_space_t<T>;

// uniform<T>: a value the same in every thread (MSL's uniform type); here a
// wrapper that converts to and from T.
template <class T>
struct uniform {
  T mh_value;
  uniform() = default;
  constexpr uniform(T v) : mh_value(v) {}
  constexpr operator T() const { return mh_value; }
};
template <class T>
constexpr uniform<T> make_uniform(T v) {
  return uniform<T>(v);
}

namespace detail {

template <class V>
using elem_t = typename vinfo<::mh::bare_t<V>>::elem;

// The specification's floating types: float and half (bfloat is not one of
// the library's argument types).
template <class T>
inline constexpr bool lib_float_v = std::is_same_v<T, float> || std::is_same_v<T, half>;
template <class T>
inline constexpr bool lib_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

template <class V>
inline constexpr bool float_vec_v = is_vecish_v<V> && lib_float_v<elem_t<V>>;
template <class V>
inline constexpr bool int_vec_v = is_vecish_v<V> && lib_int_v<elem_t<V>>;
template <class V>
inline constexpr bool num_vec_v = float_vec_v<V> || int_vec_v<V>;

// Element-wise application over vectors (swizzles evaluated first).
template <class F, class A>
inline auto vmap1(const A& a, F f) {
  auto u = tov(a);
  using R = decltype(u);
  return R::map([&](int i) { return f(u[i]); });
}

// The vector type of a call mixing vectors and scalars (the first vector).
template <class... X>
struct first_vec;
template <class X, class... R>
struct first_vec<X, R...> {
  using type = std::conditional_t<is_vecish_v<X>, vec_of<X>, typename first_vec<R...>::type>;
};
template <>
struct first_vec<> {
  using type = void;
};
template <class... X>
using first_vec_t = typename first_vec<std::remove_cvref_t<X>...>::type;

template <class R, class X>
inline R as_vec(const X& x) {
  if constexpr (is_vecish_v<X>) {
    return R(tov(x));
  } else {
    return R(static_cast<typename R::value_type>(x));
  }
}

// A scalar or vector type that MSL reinterprets with as_type.
template <class T>
inline constexpr bool reinterpretable_v = (is_scalar_v<T> && !std::is_same_v<T, bool>) ||
    (vinfo<T>::is_vec && is_scalar_v<typename vinfo<T>::elem> && !std::is_same_v<typename vinfo<T>::elem, bool>) ||
    packed_info<T>::is_packed;

} // namespace detail

// as_type<T>(x): the bits of a scalar or vector as another of the same size;
// neither may be bool (Reinterpreting data, MSL 2.x).
template <class To, class From>
inline To as_type(const From& from) {
  using F = ::mh::bare_t<decltype(detail::tov(from))>;
  static_assert(sizeof(To) == sizeof(F), "[as-type] as_type<T>(x) needs sizeof(T) == sizeof(x)");
  static_assert(detail::reinterpretable_v<To> && detail::reinterpretable_v<F>,
                "[as-type] as_type reinterprets scalars and vectors of arithmetic types other than bool");
  const F f = detail::tov(from);
  To to;
  std::memcpy(static_cast<void*>(&to), static_cast<const void*>(&f), sizeof(To));
  return to;
}

} // namespace metal

// ---------------------------------------------------------------- built-ins
// __metal_<name>(x, ..., mode): float and half scalars and vectors; the mode
// (fast, precise) changes nothing on the host.

namespace mh::math {
inline float fract(float x) { return __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f); }
inline float sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x != x ? 0.0f : x)); }
inline float median3(float a, float b, float c) {
  return __builtin_fmaxf(__builtin_fminf(a, b), __builtin_fminf(__builtin_fmaxf(a, b), c));
}
} // namespace mh::math

#define MH_BUILTIN_UNARY(name, expr)                                          \
  inline float __metal_##name(float x, int = __METAL_MAYBE_FAST_MATH__) {     \
    return expr;                                                              \
  }                                                                           \
  inline half __metal_##name(half x, int m = __METAL_MAYBE_FAST_MATH__) {     \
    return half(__metal_##name(float(x), m));                                 \
  }                                                                           \
  template <class V>                                                          \
    requires metal::detail::float_vec_v<V>                                    \
  inline auto __metal_##name(const V& v, int m = __METAL_MAYBE_FAST_MATH__) { \
    return metal::detail::vmap1(v, [&](auto s) { return __metal_##name(s, m); }); \
  }
#define MH_BUILTIN_BINARY(name, expr)                                         \
  inline float __metal_##name(float x, float y, int = __METAL_MAYBE_FAST_MATH__) { \
    return expr;                                                              \
  }                                                                           \
  inline half __metal_##name(half x, half y, int m = __METAL_MAYBE_FAST_MATH__) { \
    return half(__metal_##name(float(x), float(y), m));                       \
  }                                                                           \
  template <class V>                                                          \
    requires metal::detail::float_vec_v<V>                                    \
  inline V __metal_##name(const V& a, const V& b, int m = __METAL_MAYBE_FAST_MATH__) { \
    return V::map([&](int i) { return __metal_##name(a[i], b[i], m); });      \
  }
#define MH_BUILTIN_TERNARY(name, expr)                                        \
  inline float __metal_##name(float x, float y, float z, int = __METAL_MAYBE_FAST_MATH__) { \
    return expr;                                                              \
  }                                                                           \
  inline half __metal_##name(half x, half y, half z, int m = __METAL_MAYBE_FAST_MATH__) { \
    return half(__metal_##name(float(x), float(y), float(z), m));             \
  }                                                                           \
  template <class V>                                                          \
    requires metal::detail::float_vec_v<V>                                    \
  inline V __metal_##name(const V& a, const V& b, const V& c, int m = __METAL_MAYBE_FAST_MATH__) { \
    return V::map([&](int i) { return __metal_##name(a[i], b[i], c[i], m); }); \
  }

#define MH_UNARY_FUNCTIONS(M)                                                 \
  M(acos, __builtin_acosf(x)) M(acosh, __builtin_acoshf(x))                   \
  M(asin, __builtin_asinf(x)) M(asinh, __builtin_asinhf(x))                   \
  M(atan, __builtin_atanf(x)) M(atanh, __builtin_atanhf(x))                   \
  M(ceil, __builtin_ceilf(x)) M(cos, __builtin_cosf(x))                       \
  M(cosh, __builtin_coshf(x)) M(cospi, __builtin_cosf(x * 3.14159265358979f)) \
  M(exp, __builtin_expf(x)) M(exp2, __builtin_exp2f(x))                       \
  M(exp10, __builtin_powf(10.0f, x)) M(fabs, __builtin_fabsf(x))              \
  M(floor, __builtin_floorf(x)) M(fract, ::mh::math::fract(x))                \
  M(log, __builtin_logf(x)) M(log2, __builtin_log2f(x))                       \
  M(log10, __builtin_log10f(x)) M(rint, __builtin_rintf(x))                   \
  M(round, __builtin_roundf(x)) M(rsqrt, 1.0f / __builtin_sqrtf(x))           \
  M(sin, __builtin_sinf(x)) M(sinh, __builtin_sinhf(x))                       \
  M(sinpi, __builtin_sinf(x * 3.14159265358979f)) M(sqrt, __builtin_sqrtf(x)) \
  M(tan, __builtin_tanf(x)) M(tanh, __builtin_tanhf(x))                       \
  M(tanpi, __builtin_tanf(x * 3.14159265358979f)) M(trunc, __builtin_truncf(x)) \
  M(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))                \
  M(sign, ::mh::math::sign(x))
#define MH_BINARY_FUNCTIONS(M)                                                \
  M(atan2, __builtin_atan2f(x, y)) M(copysign, __builtin_copysignf(x, y))     \
  M(divide, x / y) M(fdim, __builtin_fdimf(x, y))                             \
  M(fmax, __builtin_fmaxf(x, y)) M(fmin, __builtin_fminf(x, y))               \
  M(fmod, __builtin_fmodf(x, y)) M(pow, __builtin_powf(x, y))                 \
  M(powr, __builtin_powf(x, y)) M(nextafter, __builtin_nextafterf(x, y))      \
  M(step, y < x ? 0.0f : 1.0f)
#define MH_TERNARY_FUNCTIONS(M)                                               \
  M(fmax3, __builtin_fmaxf(__builtin_fmaxf(x, y), z))                         \
  M(fmin3, __builtin_fminf(__builtin_fminf(x, y), z))                         \
  M(fmedian3, ::mh::math::median3(x, y, z)) M(fma, __builtin_fmaf(x, y, z))   \
  M(mix, x + (y - x) * z)                                                     \
  M(smoothstep, [](float e0, float e1, float v) {                             \
    float t = __builtin_fminf(__builtin_fmaxf((v - e0) / (e1 - e0), 0.0f), 1.0f); \
    return t * t * (3.0f - 2.0f * t);                                         \
  }(x, y, z))

MH_UNARY_FUNCTIONS(MH_BUILTIN_UNARY)
MH_BINARY_FUNCTIONS(MH_BUILTIN_BINARY)
MH_TERNARY_FUNCTIONS(MH_BUILTIN_TERNARY)
#undef MH_BUILTIN_UNARY
#undef MH_BUILTIN_BINARY
#undef MH_BUILTIN_TERNARY

inline float __metal_ldexp(float x, int k, int = __METAL_MAYBE_FAST_MATH__) { return __builtin_ldexpf(x, k); }
inline half __metal_ldexp(half x, int k, int = __METAL_MAYBE_FAST_MATH__) { return half(__builtin_ldexpf(float(x), k)); }
inline float __metal_frexp(float x, int* e) { return __builtin_frexpf(x, e); }
inline half __metal_frexp(half x, int* e) { return half(__builtin_frexpf(float(x), e)); }
inline int __metal_ilogb(float x) { return __builtin_ilogbf(x); }
inline int __metal_ilogb(half x) { return __builtin_ilogbf(float(x)); }
inline bool __metal_isnan(float x) { return __builtin_isnan(x); }
inline bool __metal_isinf(float x) { return __builtin_isinf(x); }
inline bool __metal_isfinite(float x) { return __builtin_isfinite(x); }
inline bool __metal_isnormal(float x) { return __builtin_isnormal(x); }
inline bool __metal_signbit(float x) { return __builtin_signbit(x); }

namespace metal {

// ---------------------------------------------------------------- floating
// The same functions in metal::, metal::fast:: and metal::precise::, each
// calling its built-in with the namespace's mode.

#define MH_LIB_UNARY(name, expr)                                              \
  inline float name(float x) { return ::__metal_##name(x, MH_MODE); }         \
  inline half name(half x) { return ::__metal_##name(x, MH_MODE); }           \
  template <class V>                                                          \
    requires detail::float_vec_v<V>                                           \
  inline auto name(const V& v) {                                              \
    return ::__metal_##name(detail::tov(v), MH_MODE);                         \
  }
// Two and three arguments: scalars of one type, or vectors with vectors or
// scalars of their element type.
#define MH_LIB_BINARY(name, expr)                                             \
  inline float name(float x, float y) { return ::__metal_##name(x, y, MH_MODE); } \
  inline half name(half x, half y) { return ::__metal_##name(x, y, MH_MODE); } \
  template <class A, class B, class R = detail::first_vec_t<A, B>>            \
    requires(detail::float_vec_v<R>)                                          \
  inline R name(const A& a, const B& b) {                                     \
    return ::__metal_##name(detail::as_vec<R>(a), detail::as_vec<R>(b), MH_MODE); \
  }
#define MH_LIB_TERNARY(name, expr)                                            \
  inline float name(float x, float y, float z) { return ::__metal_##name(x, y, z, MH_MODE); } \
  inline half name(half x, half y, half z) { return ::__metal_##name(x, y, z, MH_MODE); } \
  template <class A, class B, class C, class R = detail::first_vec_t<A, B, C>> \
    requires(detail::float_vec_v<R>)                                          \
  inline R name(const A& a, const B& b, const C& c) {                         \
    return ::__metal_##name(detail::as_vec<R>(a), detail::as_vec<R>(b), detail::as_vec<R>(c), MH_MODE); \
  }
#define MH_LIB_OTHERS                                                         \
  inline float ldexp(float x, int k) { return ::__metal_ldexp(x, k, MH_MODE); } \
  inline half ldexp(half x, int k) { return ::__metal_ldexp(x, k, MH_MODE); } \
  inline float frexp(float x, int& e) { return ::__metal_frexp(x, &e); } \
  inline half frexp(half x, int& e) { return ::__metal_frexp(x, &e); }  \
  inline int ilogb(float x) { return ::__metal_ilogb(x); }                    \
  inline int ilogb(half x) { return ::__metal_ilogb(x); }                     \
  inline float modf(float x, float& ip) {                              \
    ip = ::__metal_trunc(x, MH_MODE);                                         \
    return x - ip;                                                            \
  }                                                                           \
  inline half modf(half x, half& ip) {                                 \
    ip = ::__metal_trunc(x, MH_MODE);                                         \
    return half(x - ip);                                                      \
  }                                                                           \
  inline float sincos(float x, float& c) {                             \
    c = ::__metal_cos(x, MH_MODE);                                            \
    return ::__metal_sin(x, MH_MODE);                                         \
  }                                                                           \
  inline half sincos(half x, half& c) {                                \
    c = ::__metal_cos(x, MH_MODE);                                            \
    return ::__metal_sin(x, MH_MODE);                                         \
  }                                                                           \
  inline float pown(float x, int n) { return __builtin_powf(x, float(n)); }   \
  inline half pown(half x, int n) { return half(__builtin_powf(float(x), float(n))); } \
  inline float abs(float x) { return ::__metal_fabs(x, MH_MODE); }            \
  inline half abs(half x) { return ::__metal_fabs(x, MH_MODE); }              \
  template <class V>                                                          \
    requires detail::float_vec_v<V>                                           \
  inline auto abs(const V& v) {                                               \
    return ::__metal_fabs(detail::tov(v), MH_MODE);                           \
  }                                                                           \
  inline float max(float x, float y) { return ::__metal_fmax(x, y, MH_MODE); } \
  inline half max(half x, half y) { return ::__metal_fmax(x, y, MH_MODE); }   \
  inline float min(float x, float y) { return ::__metal_fmin(x, y, MH_MODE); } \
  inline half min(half x, half y) { return ::__metal_fmin(x, y, MH_MODE); }   \
  inline float max3(float x, float y, float z) { return ::__metal_fmax3(x, y, z, MH_MODE); } \
  inline half max3(half x, half y, half z) { return ::__metal_fmax3(x, y, z, MH_MODE); } \
  inline float min3(float x, float y, float z) { return ::__metal_fmin3(x, y, z, MH_MODE); } \
  inline half min3(half x, half y, half z) { return ::__metal_fmin3(x, y, z, MH_MODE); } \
  inline float median3(float x, float y, float z) { return ::__metal_fmedian3(x, y, z, MH_MODE); } \
  inline half median3(half x, half y, half z) { return ::__metal_fmedian3(x, y, z, MH_MODE); } \
  inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); } \
  inline half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); } \
  inline float mad(float a, float b, float c) { return a * b + c; }           \
  inline half mad(half a, half b, half c) { return half(a * b + c); }         \
  template <class A, class B, class C, class R = detail::first_vec_t<A, B, C>> \
    requires(detail::float_vec_v<R>)                                          \
  inline R mad(const A& a, const B& b, const C& c) {                          \
    return detail::as_vec<R>(a) * detail::as_vec<R>(b) + detail::as_vec<R>(c); \
  }

#define MH_LIB_ALL                                                            \
  MH_UNARY_FUNCTIONS(MH_LIB_UNARY)                                            \
  MH_BINARY_FUNCTIONS(MH_LIB_BINARY)                                          \
  MH_TERNARY_FUNCTIONS(MH_LIB_TERNARY)                                        \
  MH_LIB_OTHERS

#define MH_MODE __METAL_MAYBE_FAST_MATH__
MH_LIB_ALL
#undef MH_MODE
namespace fast {
#define MH_MODE __METAL_FAST_MATH__
MH_LIB_ALL
#undef MH_MODE
} // namespace fast
namespace precise {
#define MH_MODE __METAL_PRECISE_MATH__
MH_LIB_ALL
#undef MH_MODE
} // namespace precise
#undef MH_LIB_ALL
#undef MH_LIB_UNARY
#undef MH_LIB_BINARY
#undef MH_LIB_TERNARY
#undef MH_LIB_OTHERS

// ---------------------------------------------------------------- predicates

#define MH_FLOAT_PRED(name)                                                   \
  inline bool name(float x) { return ::__metal_##name(x); }                   \
  inline bool name(half x) { return ::__metal_##name(float(x)); }             \
  template <class V>                                                          \
    requires detail::float_vec_v<V>                                           \
  inline auto name(const V& v) {                                              \
    auto u = detail::tov(v);                                                  \
    return vec<bool, detail::vinfo<decltype(u)>::n>::map(                     \
        [&](int i) { return name(u[i]); });                                   \
  }
MH_FLOAT_PRED(isnan)
MH_FLOAT_PRED(isinf)
MH_FLOAT_PRED(isfinite)
MH_FLOAT_PRED(isnormal)
MH_FLOAT_PRED(signbit)
#undef MH_FLOAT_PRED

inline bool isordered(float x, float y) { return x == x && y == y; }
inline bool isordered(half x, half y) { return isordered(float(x), float(y)); }
inline bool isunordered(float x, float y) { return !isordered(x, y); }
inline bool isunordered(half x, half y) { return !isordered(x, y); }

// ---------------------------------------------------------------- integers
// The specification's integer functions: scalars and vectors of char to
// ulong (not bool).

// Templates, as in Apple's library: a bfloat (which converts to integers
// implicitly) reaches the float functions, not these.
template <class T>
  requires detail::lib_int_v<T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
  requires detail::lib_int_v<T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
  requires detail::lib_int_v<T>
inline T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}
template <class T>
  requires detail::lib_int_v<T>
inline T min3(T a, T b, T c) {
  return min(min(a, b), c);
}
template <class T>
  requires detail::lib_int_v<T>
inline T max3(T a, T b, T c) {
  return max(max(a, b), c);
}
template <class T>
  requires detail::lib_int_v<T>
inline T median3(T a, T b, T c) {
  return max(min(a, b), min(max(a, b), c));
}
template <class T>
  requires detail::lib_int_v<T>
inline T abs(T x) {
  if constexpr (std::is_signed_v<T>) {
    return x < 0 ? static_cast<T>(-x) : x;
  } else {
    return x;
  }
}

// Vector forms of min, max, clamp (with vector or element-type scalar
// arguments) and abs, for integer and floating vectors.
#define MH_VEC_NARY(name, ...)                                                \
  template <class A, class B, class R = detail::first_vec_t<A, B>>            \
    requires(detail::num_vec_v<R>)                                            \
  inline R name(const A& a, const B& b) {                                     \
    R u = detail::as_vec<R>(a), w = detail::as_vec<R>(b);                     \
    return R::map([&](int i) { return name(u[i], w[i]); });                   \
  }
MH_VEC_NARY(min)
MH_VEC_NARY(max)
#undef MH_VEC_NARY
#define MH_VEC_NARY3(name)                                                    \
  template <class A, class B, class C, class R = detail::first_vec_t<A, B, C>> \
    requires(detail::num_vec_v<R>)                                            \
  inline R name(const A& a, const B& b, const C& c) {                         \
    R u = detail::as_vec<R>(a), v = detail::as_vec<R>(b), w = detail::as_vec<R>(c); \
    return R::map([&](int i) { return name(u[i], v[i], w[i]); });             \
  }
MH_VEC_NARY3(clamp)
MH_VEC_NARY3(min3)
MH_VEC_NARY3(max3)
MH_VEC_NARY3(median3)
#undef MH_VEC_NARY3
template <class V>
  requires detail::int_vec_v<V>
inline auto abs(const V& v) {
  return detail::vmap1(v, [](auto s) { return abs(s); });
}

template <class T>
  requires detail::lib_int_v<T>
inline T popcount(T x) {
  using U = std::make_unsigned_t<T>;
  return T(__builtin_popcountll(static_cast<unsigned long long>(static_cast<U>(x))));
}
template <class T>
  requires detail::lib_int_v<T>
inline T clz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = 8 * sizeof(T);
  auto u = static_cast<unsigned long long>(static_cast<U>(x));
  return T(u == 0 ? bits : __builtin_clzll(u) - (64 - bits));
}
template <class T>
  requires detail::lib_int_v<T>
inline T ctz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = 8 * sizeof(T);
  auto u = static_cast<unsigned long long>(static_cast<U>(x));
  return T(u == 0 ? bits : __builtin_ctzll(u));
}
template <class T>
  requires detail::lib_int_v<T>
inline T reverse_bits(T x) {
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(x), r = 0;
  for (unsigned i = 0; i < 8 * sizeof(T); ++i) {
    r = U((r << 1) | ((u >> i) & 1u));
  }
  return T(r);
}
template <class T>
  requires detail::lib_int_v<T>
inline T mulhi(T a, T b) {
  if constexpr (sizeof(T) == 8) {
    using W = std::conditional_t<std::is_signed_v<T>, __int128, unsigned __int128>;
    return T((W(a) * W(b)) >> 64);
  } else {
    using W = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    return T((W(a) * W(b)) >> (8 * sizeof(T)));
  }
}
template <class T>
  requires detail::lib_int_v<T>
inline T madhi(T a, T b, T c) {
  return T(mulhi(a, b) + c);
}
template <class T>
  requires detail::lib_int_v<T>
inline std::make_unsigned_t<T> absdiff(T a, T b) {
  return std::make_unsigned_t<T>(a > b ? a - b : b - a);
}
template <class T>
  requires detail::lib_int_v<T>
inline T addsat(T a, T b) {
  T r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::min()) : r;
}
template <class T>
  requires detail::lib_int_v<T>
inline T subsat(T a, T b) {
  T r;
  if (!__builtin_sub_overflow(a, b, &r)) {
    return r;
  }
  if constexpr (std::is_signed_v<T>) {
    return b < 0 ? std::numeric_limits<T>::max() : std::numeric_limits<T>::min();
  } else {
    return T(0);
  }
}
template <class T>
  requires detail::lib_int_v<T>
inline T madsat(T a, T b, T c) {
  T p;
  if (__builtin_mul_overflow(a, b, &p)) {
    const bool negative = std::is_signed_v<T> && ((a < 0) != (b < 0));
    return negative ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max();
  }
  return addsat(p, c);
}
template <class T>
  requires(std::is_same_v<T, int> || std::is_same_v<T, uint>)
inline T mul24(T a, T b) {
  return T(a * b);
}
template <class T>
  requires(std::is_same_v<T, int> || std::is_same_v<T, uint>)
inline T mad24(T a, T b, T c) {
  return T(a * b + c);
}
template <class T>
  requires detail::lib_int_v<T>
inline T rotate(T x, T k) {
  using U = std::make_unsigned_t<T>;
  constexpr unsigned bits = 8 * sizeof(T);
  unsigned s = static_cast<unsigned>(static_cast<U>(k)) % bits;
  U u = static_cast<U>(x);
  return T(s == 0 ? u : U((u << s) | (u >> (bits - s))));
}
template <class T>
  requires detail::lib_int_v<T>
inline T extract_bits(T x, uint offset, uint bits) {
  using U = std::make_unsigned_t<T>;
  if (bits == 0) {
    return T(0);
  }
  U u = static_cast<U>(static_cast<U>(x) >> offset);
  constexpr uint width = 8 * sizeof(T);
  if (bits >= width) {
    return T(u);
  }
  U mask = U((U(1) << bits) - 1);
  U v = U(u & mask);
  if constexpr (std::is_signed_v<T>) {
    if (v & (U(1) << (bits - 1))) {
      v = U(v | U(~mask));
    }
  }
  return T(v);
}
template <class T>
  requires detail::lib_int_v<T>
inline T insert_bits(T base, T insert, uint offset, uint bits) {
  using U = std::make_unsigned_t<T>;
  constexpr uint width = 8 * sizeof(T);
  U mask = bits >= width ? U(~U(0)) : U((U(1) << bits) - 1);
  mask = U(mask << offset);
  return T((static_cast<U>(base) & U(~mask)) | ((static_cast<U>(insert) << offset) & mask));
}
template <class T>
  requires detail::lib_int_v<T>
inline T hadd(T a, T b) {
  return T((static_cast<__int128>(a) + static_cast<__int128>(b)) >> 1);
}
template <class T>
  requires detail::lib_int_v<T>
inline T rhadd(T a, T b) {
  return T((static_cast<__int128>(a) + static_cast<__int128>(b) + 1) >> 1);
}

#define MH_INT_VEC1(name)                                                     \
  template <class V>                                                          \
    requires detail::int_vec_v<V>                                             \
  inline auto name(const V& v) {                                              \
    return detail::vmap1(v, [](auto s) { return name(s); });                  \
  }
MH_INT_VEC1(popcount)
MH_INT_VEC1(clz)
MH_INT_VEC1(ctz)
MH_INT_VEC1(reverse_bits)
#undef MH_INT_VEC1
#define MH_INT_VEC2(name)                                                     \
  template <class A, class B, class R = detail::first_vec_t<A, B>>            \
    requires detail::int_vec_v<R>                                             \
  inline R name(const A& a, const B& b) {                                     \
    R u = detail::as_vec<R>(a), w = detail::as_vec<R>(b);                     \
    return R::map([&](int i) { return name(u[i], w[i]); });                   \
  }
MH_INT_VEC2(mulhi)
MH_INT_VEC2(addsat)
MH_INT_VEC2(subsat)
MH_INT_VEC2(rotate)
MH_INT_VEC2(hadd)
MH_INT_VEC2(rhadd)
#undef MH_INT_VEC2

// ---------------------------------------------------------------- select

// select(a, b, c): c ? b : a, element-wise for vectors (bool or bool-vector c).
template <class T>
  requires(is_scalar_v<T> && !std::is_same_v<T, bfloat>)
inline T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class V, class W, class C>
  requires(detail::is_vecish_v<V> && !std::is_same_v<detail::elem_t<V>, bfloat>)
inline auto select(const V& a, const W& b, const C& c) {
  using R = detail::vec_of<V>;
  R u = detail::tov(a), v = R(detail::tov(b));
  if constexpr (detail::is_vecish_v<C>) {
    auto m = detail::tov(c);
    static_assert(std::is_same_v<detail::elem_t<decltype(m)>, bool> && detail::vinfo<decltype(m)>::n == detail::vinfo<R>::n,
                  "select(a, b, c) takes a bool vector c of the width of a");
    return R::map([&](int i) { return m[i] ? v[i] : u[i]; });
  } else {
    static_assert(std::is_same_v<C, bool>, "select(a, b, c) takes a bool c");
    return R::map([&](int i) { return c ? v[i] : u[i]; });
  }
}

// ---------------------------------------------------------------- relational

inline bool all(bool b) { return b; }
inline bool any(bool b) { return b; }
template <class V>
  requires(detail::is_vecish_v<V> && std::is_same_v<detail::elem_t<V>, bool>)
inline bool all(const V& v) {
  auto u = detail::tov(v);
  for (int i = 0; i < detail::vinfo<decltype(u)>::n; ++i) {
    if (!u[i]) {
      return false;
    }
  }
  return true;
}
template <class V>
  requires(detail::is_vecish_v<V> && std::is_same_v<detail::elem_t<V>, bool>)
inline bool any(const V& v) {
  auto u = detail::tov(v);
  for (int i = 0; i < detail::vinfo<decltype(u)>::n; ++i) {
    if (u[i]) {
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------- geometric

template <class V, class W>
  requires(detail::float_vec_v<V> && std::is_same_v<detail::vec_of<V>, detail::vec_of<W>>)
inline auto dot(const V& a, const W& b) {
  auto u = detail::tov(a);
  using R = decltype(u);
  R w = detail::tov(b);
  float acc = 0.0f;
  for (int i = 0; i < detail::vinfo<R>::n; ++i) {
    acc += float(u[i]) * float(w[i]);
  }
  return detail::elem_t<R>(acc);
}
template <class V>
  requires detail::float_vec_v<V>
inline auto length_squared(const V& a) {
  return dot(a, a);
}
template <class V>
  requires detail::float_vec_v<V>
inline auto length(const V& a) {
  return sqrt(dot(a, a));
}
template <class V, class W>
  requires(detail::float_vec_v<V> && std::is_same_v<detail::vec_of<V>, detail::vec_of<W>>)
inline auto distance(const V& a, const W& b) {
  return length(detail::tov(a) - detail::tov(b));
}
template <class V, class W>
  requires(detail::float_vec_v<V> && std::is_same_v<detail::vec_of<V>, detail::vec_of<W>>)
inline auto distance_squared(const V& a, const W& b) {
  return length_squared(detail::tov(a) - detail::tov(b));
}
template <class V>
  requires detail::float_vec_v<V>
inline auto normalize(const V& a) {
  auto u = detail::tov(a);
  return u * rsqrt(dot(u, u));
}
template <class V, class W>
  requires(detail::float_vec_v<V> && detail::vinfo<detail::vec_of<V>>::n == 3 &&
           std::is_same_v<detail::vec_of<V>, detail::vec_of<W>>)
inline auto cross(const V& a, const W& b) {
  auto u = detail::tov(a);
  decltype(u) w = detail::tov(b);
  return decltype(u)(u.y * w.z - u.z * w.y, u.z * w.x - u.x * w.z, u.x * w.y - u.y * w.x);
}
template <class V>
  requires detail::float_vec_v<V>
inline auto faceforward(const V& n, const V& i, const V& nref) {
  auto u = detail::tov(n);
  return dot(nref, i) < 0 ? u : -u;
}
template <class V>
  requires detail::float_vec_v<V>
inline auto reflect(const V& i, const V& n) {
  auto u = detail::tov(i);
  auto w = detail::tov(n);
  return u - w * (detail::elem_t<decltype(u)>(2) * dot(w, u));
}

} // namespace metal

#undef MH_UNARY_FUNCTIONS
#undef MH_BINARY_FUNCTIONS
#undef MH_TERNARY_FUNCTIONS

#ifndef MAXFLOAT
#define MAXFLOAT 0x1.fffffep+127f
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef FLT_MAX
#define FLT_MAX 0x1.fffffep+127f
#endif
#ifndef FLT_MIN
#define FLT_MIN 0x1p-126f
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 0x1p-23f
#endif
#include "mh/constants.h"
#ifndef CHAR_BIT
#define CHAR_BIT 8
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef INT_MIN
#define INT_MIN (-2147483647 - 1)
#endif
#ifndef UINT_MAX
#define UINT_MAX 4294967295u
#endif
#ifndef SHRT_MAX
#define SHRT_MAX 32767
#endif
#ifndef USHRT_MAX
#define USHRT_MAX 65535
#endif
#ifndef UCHAR_MAX
#define UCHAR_MAX 255
#endif
