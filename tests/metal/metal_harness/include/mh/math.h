// Metal math, integer, geometric and relational functions; as_type; the
// usual constants. half/bfloat functions compute in float and round back.
#pragma once

#include "mh/vec.h"

namespace metal {

template <class To, class From>
inline To as_type(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "[as-type] as_type<T>(x) needs sizeof(T) == sizeof(x)");
  To to;
  std::memcpy(static_cast<void*>(&to), &from, sizeof(To));
  return to;
}

namespace detail {

template <class V>
using elem_t = typename vinfo<std::remove_cvref_t<V>>::elem;

template <class V>
inline constexpr bool float_vec_v = is_vecish_v<V> && is_float_v<elem_t<V>>;
template <class V>
inline constexpr bool int_vec_v = is_vecish_v<V> && std::is_integral_v<elem_t<V>>;

// Element-wise application over vectors (swizzles evaluated first).
template <class F, class A>
inline auto vmap1(const A& a, F f) {
  auto u = tov(a);
  using R = decltype(u);
  return R::map([&](int i) { return f(u[i]); });
}

} // namespace detail

// ---------------------------------------------------------------- float

#define MH_FLOAT_UNARY(name, expr)                                            \
  inline float name(float x) { return expr; }                                 \
  inline half name(half x) { return half(name(float(x))); }                   \
  inline bfloat name(bfloat x) { return bfloat(name(float(x))); }             \
  template <class V>                                                          \
    requires detail::float_vec_v<V>                                           \
  inline auto name(const V& v) {                                              \
    return detail::vmap1(v, [](auto s) { return name(s); });                  \
  }

MH_FLOAT_UNARY(sqrt, __builtin_sqrtf(x))
MH_FLOAT_UNARY(rsqrt, 1.0f / __builtin_sqrtf(x))
MH_FLOAT_UNARY(exp, __builtin_expf(x))
MH_FLOAT_UNARY(exp2, __builtin_exp2f(x))
MH_FLOAT_UNARY(exp10, __builtin_powf(10.0f, x))
MH_FLOAT_UNARY(log, __builtin_logf(x))
MH_FLOAT_UNARY(log2, __builtin_log2f(x))
MH_FLOAT_UNARY(log10, __builtin_log10f(x))
MH_FLOAT_UNARY(sin, __builtin_sinf(x))
MH_FLOAT_UNARY(cos, __builtin_cosf(x))
MH_FLOAT_UNARY(tan, __builtin_tanf(x))
MH_FLOAT_UNARY(asin, __builtin_asinf(x))
MH_FLOAT_UNARY(acos, __builtin_acosf(x))
MH_FLOAT_UNARY(atan, __builtin_atanf(x))
MH_FLOAT_UNARY(sinh, __builtin_sinhf(x))
MH_FLOAT_UNARY(cosh, __builtin_coshf(x))
MH_FLOAT_UNARY(tanh, __builtin_tanhf(x))
MH_FLOAT_UNARY(asinh, __builtin_asinhf(x))
MH_FLOAT_UNARY(acosh, __builtin_acoshf(x))
MH_FLOAT_UNARY(atanh, __builtin_atanhf(x))
MH_FLOAT_UNARY(sinpi, __builtin_sinf(x * 3.14159265358979f))
MH_FLOAT_UNARY(cospi, __builtin_cosf(x * 3.14159265358979f))
MH_FLOAT_UNARY(tanpi, __builtin_tanf(x * 3.14159265358979f))
MH_FLOAT_UNARY(floor, __builtin_floorf(x))
MH_FLOAT_UNARY(ceil, __builtin_ceilf(x))
MH_FLOAT_UNARY(round, __builtin_roundf(x))
MH_FLOAT_UNARY(rint, __builtin_rintf(x))
MH_FLOAT_UNARY(trunc, __builtin_truncf(x))
MH_FLOAT_UNARY(fabs, __builtin_fabsf(x))
MH_FLOAT_UNARY(fract, __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f))
MH_FLOAT_UNARY(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
MH_FLOAT_UNARY(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x != x ? 0.0f : x)))
#undef MH_FLOAT_UNARY

#define MH_FLOAT_PRED(name, expr)                                             \
  inline bool name(float x) { return expr; }                                  \
  inline bool name(half x) { return name(float(x)); }                         \
  inline bool name(bfloat x) { return name(float(x)); }                       \
  template <class V>                                                          \
    requires detail::float_vec_v<V>                                           \
  inline auto name(const V& v) {                                              \
    auto u = detail::tov(v);                                                  \
    return vec<bool, detail::vinfo<decltype(u)>::n>::map(                     \
        [&](int i) { return name(u[i]); });                                   \
  }
MH_FLOAT_PRED(isnan, __builtin_isnan(x))
MH_FLOAT_PRED(isinf, __builtin_isinf(x))
MH_FLOAT_PRED(isfinite, __builtin_isfinite(x))
MH_FLOAT_PRED(isnormal, __builtin_isnormal(x))
MH_FLOAT_PRED(signbit, __builtin_signbit(x))
#undef MH_FLOAT_PRED

// Two-argument functions: scalar overloads, then vectors with a vector or a
// scalar second argument.
#define MH_FLOAT_BINARY(name, expr)                                           \
  inline float name(float x, float y) { return expr; }                        \
  inline half name(half x, half y) { return half(name(float(x), float(y))); } \
  inline bfloat name(bfloat x, bfloat y) {                                    \
    return bfloat(name(float(x), float(y)));                                  \
  }                                                                           \
  template <class V, class W>                                                 \
    requires(detail::float_vec_v<V> || detail::float_vec_v<W>)                \
  inline auto name(const V& a, const W& b) {                                  \
    using R = detail::vec_of<std::conditional_t<detail::float_vec_v<V>, V, W>>; \
    R u = R(detail::tov(a)), w = R(detail::tov(b));                           \
    return R::map([&](int i) { return name(u[i], w[i]); });                   \
  }
MH_FLOAT_BINARY(pow, __builtin_powf(x, y))
MH_FLOAT_BINARY(powr, __builtin_powf(x, y))
MH_FLOAT_BINARY(fmod, __builtin_fmodf(x, y))
MH_FLOAT_BINARY(atan2, __builtin_atan2f(x, y))
MH_FLOAT_BINARY(fmin, __builtin_fminf(x, y))
MH_FLOAT_BINARY(fmax, __builtin_fmaxf(x, y))
MH_FLOAT_BINARY(copysign, __builtin_copysignf(x, y))
MH_FLOAT_BINARY(fdim, __builtin_fdimf(x, y))
MH_FLOAT_BINARY(step, y < x ? 0.0f : 1.0f)
MH_FLOAT_BINARY(divide, x / y)
MH_FLOAT_BINARY(nextafter, __builtin_nextafterf(x, y))
#undef MH_FLOAT_BINARY

inline float ldexp(float x, int k) { return __builtin_ldexpf(x, k); }
inline half ldexp(half x, int k) { return half(__builtin_ldexpf(float(x), k)); }

// ---------------------------------------------------------------- min/max

#define MH_MINMAX_SCALAR(T)                                                   \
  inline T min(T a, T b) { return b < a ? b : a; }                           \
  inline T max(T a, T b) { return a < b ? b : a; }                            \
  inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
MH_MINMAX_SCALAR(char)
MH_MINMAX_SCALAR(signed char)
MH_MINMAX_SCALAR(uchar)
MH_MINMAX_SCALAR(short)
MH_MINMAX_SCALAR(ushort)
MH_MINMAX_SCALAR(int)
MH_MINMAX_SCALAR(uint)
MH_MINMAX_SCALAR(long)
MH_MINMAX_SCALAR(ulong)
MH_MINMAX_SCALAR(long long)
MH_MINMAX_SCALAR(unsigned long long)
MH_MINMAX_SCALAR(bfloat)
#undef MH_MINMAX_SCALAR
// Floating min/max follow fmin/fmax (a NaN operand yields the other one).
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); }
inline half min(half a, half b) { return half(__builtin_fminf(float(a), float(b))); }
inline half max(half a, half b) { return half(__builtin_fmaxf(float(a), float(b))); }
inline half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); }

#define MH_VEC_BINARY_FN(name)                                                \
  template <class V, class W>                                                 \
    requires(detail::is_vecish_v<V> || detail::is_vecish_v<W>)                \
  inline auto name(const V& a, const W& b) {                                  \
    using R = detail::vec_of<std::conditional_t<detail::is_vecish_v<V>, V, W>>; \
    R u = R(detail::tov(a)), w = R(detail::tov(b));                           \
    return R::map([&](int i) { return name(u[i], w[i]); });                   \
  }
MH_VEC_BINARY_FN(min)
MH_VEC_BINARY_FN(max)
#undef MH_VEC_BINARY_FN

template <class V, class L, class H>
  requires detail::is_vecish_v<V>
inline auto clamp(const V& x, const L& lo, const H& hi) {
  auto u = detail::tov(x);
  using R = decltype(u);
  return min(max(u, R(detail::tov(lo))), R(detail::tov(hi)));
}

// ---------------------------------------------------------------- abs

inline float abs(float x) { return __builtin_fabsf(x); }
inline half abs(half x) { return half(__builtin_fabsf(float(x))); }
inline bfloat abs(bfloat x) { return bfloat(__builtin_fabsf(float(x))); }
#define MH_ABS_INT(T)                                                         \
  inline T abs(T x) {                                                         \
    if constexpr (std::is_signed_v<T>) {                                      \
      return x < 0 ? static_cast<T>(-x) : x;                                               \
    } else {                                                                  \
      return x;                                                               \
    }                                                                         \
  }
MH_ABS_INT(char)
MH_ABS_INT(signed char)
MH_ABS_INT(uchar)
MH_ABS_INT(short)
MH_ABS_INT(ushort)
MH_ABS_INT(int)
MH_ABS_INT(uint)
MH_ABS_INT(long)
MH_ABS_INT(ulong)
#undef MH_ABS_INT
template <class V>
  requires detail::is_vecish_v<V>
inline auto abs(const V& v) {
  return detail::vmap1(v, [](auto s) { return abs(s); });
}

// ---------------------------------------------------------------- ternary

inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline half fma(half a, half b, half c) {
  return half(__builtin_fmaf(float(a), float(b), float(c)));
}
inline float mad(float a, float b, float c) { return a * b + c; }
inline half mad(half a, half b, half c) { return half(a * b + c); }
inline float mix(float x, float y, float a) { return x + (y - x) * a; }
inline half mix(half x, half y, half a) { return half(x + (y - x) * a); }
inline float smoothstep(float e0, float e1, float x) {
  float t = clamp((x - e0) / (e1 - e0), 0.0f, 1.0f);
  return t * t * (3.0f - 2.0f * t);
}
inline half smoothstep(half e0, half e1, half x) {
  return half(smoothstep(float(e0), float(e1), float(x)));
}

#define MH_VEC_TERNARY_FN(name)                                               \
  template <class V, class W, class X>                                        \
    requires(detail::float_vec_v<V> || detail::float_vec_v<X>)                \
  inline auto name(const V& a, const W& b, const X& c) {                      \
    using R = std::conditional_t<detail::float_vec_v<V>, detail::vec_of<V>,   \
                                 detail::vec_of<X>>;                          \
    R u = R(detail::tov(a)), v = R(detail::tov(b)), w = R(detail::tov(c));    \
    return R::map([&](int i) { return name(u[i], v[i], w[i]); });             \
  }
MH_VEC_TERNARY_FN(fma)
MH_VEC_TERNARY_FN(mad)
MH_VEC_TERNARY_FN(mix)
MH_VEC_TERNARY_FN(smoothstep)
#undef MH_VEC_TERNARY_FN

// select(a, b, c): c ? b : a, element-wise for vectors.
template <class T>
  requires is_scalar_v<T>
inline T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class V, class W, class C>
  requires detail::is_vecish_v<V>
inline auto select(const V& a, const W& b, const C& c) {
  using R = detail::vec_of<V>;
  R u = detail::tov(a), v = R(detail::tov(b));
  if constexpr (detail::is_vecish_v<C>) {
    auto m = detail::tov(c);
    return R::map([&](int i) { return m[i] ? v[i] : u[i]; });
  } else {
    return R::map([&](int i) { return c ? v[i] : u[i]; });
  }
}

// ---------------------------------------------------------------- relational

inline bool all(bool b) { return b; }
inline bool any(bool b) { return b; }
template <class V>
  requires detail::is_vecish_v<V>
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
  requires detail::is_vecish_v<V>
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
  requires detail::float_vec_v<V>
inline auto dot(const V& a, const W& b) {
  auto u = detail::tov(a);
  using R = decltype(u);
  R w = R(detail::tov(b));
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
  requires detail::float_vec_v<V>
inline auto distance(const V& a, const W& b) {
  auto u = detail::tov(a);
  return length(u - decltype(u)(detail::tov(b)));
}
template <class V>
  requires detail::float_vec_v<V>
inline auto normalize(const V& a) {
  auto u = detail::tov(a);
  return u * rsqrt(dot(u, u));
}
template <class V, class W>
  requires detail::float_vec_v<V>
inline auto cross(const V& a, const W& b) {
  auto u = detail::tov(a);
  decltype(u) w = decltype(u)(detail::tov(b));
  return decltype(u)(u.y * w.z - u.z * w.y, u.z * w.x - u.x * w.z, u.x * w.y - u.y * w.x);
}

// ---------------------------------------------------------------- integer

template <class T>
  requires std::is_integral_v<T>
inline T popcount(T x) {
  using U = std::make_unsigned_t<T>;
  return T(__builtin_popcountll(static_cast<unsigned long long>(static_cast<U>(x))));
}
template <class T>
  requires std::is_integral_v<T>
inline T clz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = 8 * sizeof(T);
  auto u = static_cast<unsigned long long>(static_cast<U>(x));
  return T(u == 0 ? bits : __builtin_clzll(u) - (64 - bits));
}
template <class T>
  requires std::is_integral_v<T>
inline T ctz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = 8 * sizeof(T);
  auto u = static_cast<unsigned long long>(static_cast<U>(x));
  return T(u == 0 ? bits : __builtin_ctzll(u));
}
template <class T>
  requires std::is_integral_v<T>
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
  requires std::is_integral_v<T>
inline std::make_unsigned_t<T> absdiff(T a, T b) {
  return std::make_unsigned_t<T>(a > b ? a - b : b - a);
}
template <class T>
  requires std::is_integral_v<T>
inline T reverse_bits(T x) {
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(x), r = 0;
  for (unsigned i = 0; i < 8 * sizeof(T); ++i) {
    r = U((r << 1) | ((u >> i) & 1u));
  }
  return T(r);
}
template <class T>
  requires std::is_integral_v<T>
inline T rotate(T x, T k) {
  using U = std::make_unsigned_t<T>;
  constexpr unsigned bits = 8 * sizeof(T);
  unsigned s = static_cast<unsigned>(static_cast<U>(k)) % bits;
  U u = static_cast<U>(x);
  return T(s == 0 ? u : U((u << s) | (u >> (bits - s))));
}
template <class T>
  requires std::is_integral_v<T>
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
  requires std::is_integral_v<T>
inline T insert_bits(T base, T insert, uint offset, uint bits) {
  using U = std::make_unsigned_t<T>;
  constexpr uint width = 8 * sizeof(T);
  U mask = bits >= width ? U(~U(0)) : U((U(1) << bits) - 1);
  mask = U(mask << offset);
  return T((static_cast<U>(base) & U(~mask)) | ((static_cast<U>(insert) << offset) & mask));
}
template <class T>
  requires std::is_integral_v<T>
inline T hadd(T a, T b) {
  return T((static_cast<long long>(a) + static_cast<long long>(b)) >> 1);
}
template <class T>
  requires std::is_integral_v<T>
inline T rhadd(T a, T b) {
  return T((static_cast<long long>(a) + static_cast<long long>(b) + 1) >> 1);
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

// fast:: and precise:: spell the same functions here (no fast-math on the
// host; compare with tolerances).
namespace fast {
using namespace ::metal;
}
namespace precise {
using namespace ::metal;
}

} // namespace metal

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
