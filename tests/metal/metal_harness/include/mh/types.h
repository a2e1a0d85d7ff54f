// MSL scalar types on the host: half is _Float16 (rounded after every
// operation, as on the GPU); bfloat is a 16-bit struct computing through
// float with round-to-nearest-even.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cstring>
#include <limits>
#include <source_location>
#include <type_traits>
#include <utility>

namespace metal {

using uchar = unsigned char;
using ushort = unsigned short;
using uint = unsigned int;
using ulong = unsigned long;
using half = _Float16;

struct bfloat;

template <class T>
struct is_bfloat : std::false_type {};
template <>
struct is_bfloat<bfloat> : std::true_type {};

// Scalars that MSL arithmetic accepts (std traits do not know _Float16 in
// every libstdc++ version).
template <class T>
inline constexpr bool is_scalar_v = std::is_integral_v<T> ||
    std::is_floating_point_v<T> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat>;

template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> ||
    std::is_same_v<T, half> || std::is_same_v<T, bfloat>;

struct bfloat {
  uint16_t bits;

  bfloat() = default;
  template <class U>
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat>)
  constexpr bfloat(U v) : bits(from_float(static_cast<float>(v))) {}
  constexpr operator float() const { return to_float(bits); }

  static constexpr uint16_t from_float(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      return static_cast<uint16_t>((u >> 16) | 0x40u); // quiet NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static constexpr float to_float(uint16_t b) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16);
  }

  bfloat operator-() const {
    bfloat r;
    r.bits = bits ^ 0x8000u;
    return r;
  }
  bfloat operator+() const { return *this; }
  template <class U>
    requires is_scalar_v<U>
  bfloat& operator+=(U o) { return *this = bfloat(float(*this) + float(o)); }
  template <class U>
    requires is_scalar_v<U>
  bfloat& operator-=(U o) { return *this = bfloat(float(*this) - float(o)); }
  template <class U>
    requires is_scalar_v<U>
  bfloat& operator*=(U o) { return *this = bfloat(float(*this) * float(o)); }
  template <class U>
    requires is_scalar_v<U>
  bfloat& operator/=(U o) { return *this = bfloat(float(*this) / float(o)); }
};

// bfloat op bfloat stays bfloat; bfloat op other scalar computes in float.
#define MH_BF_ARITH(op)                                                     \
  inline bfloat operator op(bfloat a, bfloat b) {                           \
    return bfloat(float(a) op float(b));                                    \
  }                                                                         \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat>)                  \
  inline float operator op(bfloat a, U b) {                                 \
    return float(a) op float(b);                                            \
  }                                                                         \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat>)                  \
  inline float operator op(U a, bfloat b) {                                 \
    return float(a) op float(b);                                            \
  }
MH_BF_ARITH(+)
MH_BF_ARITH(-)
MH_BF_ARITH(*)
MH_BF_ARITH(/)
#undef MH_BF_ARITH

#define MH_BF_CMP(op)                                                       \
  inline bool operator op(bfloat a, bfloat b) { return float(a) op float(b); } \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat>)                  \
  inline bool operator op(bfloat a, U b) {                                  \
    return float(a) op float(b);                                            \
  }                                                                         \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat>)                  \
  inline bool operator op(U a, bfloat b) {                                  \
    return float(a) op float(b);                                            \
  }
MH_BF_CMP(==)
MH_BF_CMP(!=)
MH_BF_CMP(<)
MH_BF_CMP(>)
MH_BF_CMP(<=)
MH_BF_CMP(>=)
#undef MH_BF_CMP

// ------------------------------------------------------------- type traits
// The subset of metal_type_traits kernels tend to use.
using std::conditional;
using std::conditional_t;
using std::enable_if;
using std::enable_if_t;
using std::integral_constant;
using std::is_const_v;
using std::is_integral;
using std::is_integral_v;
using std::is_same;
using std::is_same_v;
using std::is_signed;
using std::is_signed_v;
using std::is_unsigned;
using std::is_unsigned_v;
using std::remove_cv_t;
using std::remove_reference_t;
using std::false_type;
using std::true_type;

template <class T>
struct is_floating_point : std::bool_constant<is_float_v<T>> {};
template <class T>
inline constexpr bool is_floating_point_v = is_float_v<T>;
template <class T>
struct is_arithmetic : std::bool_constant<is_scalar_v<T>> {};
template <class T>
inline constexpr bool is_arithmetic_v = is_scalar_v<T>;

template <class T>
struct numeric_limits : std::numeric_limits<T> {};

template <>
struct numeric_limits<half> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr int digits = 11;
  static constexpr half min() { return half(6.103515625e-05f); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
  static constexpr half epsilon() { return half(0.0009765625f); }
  static constexpr half infinity() { return half(__builtin_inff()); }
  static constexpr half quiet_NaN() { return half(__builtin_nanf("")); }
  static constexpr half denorm_min() { return half(5.9604644775390625e-08f); }
};

template <>
struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr int digits = 8;
  static constexpr bfloat bits(uint16_t b) {
    bfloat r{};
    r.bits = b;
    return r;
  }
  static constexpr bfloat min() { return bits(0x0080); }
  static constexpr bfloat max() { return bits(0x7f7f); }
  static constexpr bfloat lowest() { return bits(0xff7f); }
  static constexpr bfloat epsilon() { return bits(0x3c00); }
  static constexpr bfloat infinity() { return bits(0x7f80); }
  static constexpr bfloat quiet_NaN() { return bits(0x7fc0); }
};

// metal::array: a fixed-size array usable in every address space.
template <class T, size_t N>
struct array {
  T elems[N];
  T& operator[](size_t i) { return elems[i]; }
  const T& operator[](size_t i) const { return elems[i]; }
  static constexpr size_t size() { return N; }
  T* data() { return elems; }
  const T* data() const { return elems; }
};

} // namespace metal

// MSL spells these without a namespace (typedefs, so that identical C
// library typedefs do not conflict).
typedef metal::bfloat bfloat;
typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
