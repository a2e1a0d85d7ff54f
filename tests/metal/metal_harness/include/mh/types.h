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
  // MSL's conversions: integers convert to bfloat implicitly; float and half
  // only explicitly ("neither float nor half can be implicitly converted to
  // bfloat"). bfloat converts implicitly to float and to integers, to half
  // only explicitly.
  template <class U>
    requires(std::is_integral_v<U>)
  constexpr bfloat(U v) : bits(from_float(static_cast<float>(v))) {}
  // Assigning an object whose conversion gives an integer or bool: MSL's
  // conversion sequence is that user-defined conversion, then the builtin
  // one to bfloat (MLX's block-masked GEMM assigns a _NoMask to a bfloat);
  // C++ would want two user-defined conversions of this class. (Not a
  // constructor: as one it would join every operator's overloads, where
  // MSL's builtin bfloat loses to the integer ones.)
  template <class U>
    requires(std::is_class_v<std::remove_cvref_t<U>> && !is_bfloat<std::remove_cvref_t<U>>::value &&
             requires(U&& u) { requires std::is_integral_v<decltype(+u)>; })
  constexpr explicit bfloat(U&& u) : bits(from_float(static_cast<float>(+u))) {}  // T(mask) in gemv_masked.h
  template <class U>
    requires(std::is_class_v<std::remove_cvref_t<U>> && !is_bfloat<std::remove_cvref_t<U>>::value &&
             requires(U&& u) { requires std::is_integral_v<decltype(+u)>; })
  constexpr bfloat& operator=(U&& u) {
    bits = from_float(static_cast<float>(+u));
    return *this;
  }
  template <class U>
    requires(std::is_same_v<U, float> || std::is_same_v<U, half> || std::is_same_v<U, double>)
  constexpr explicit bfloat(U v) : bits(from_float(static_cast<float>(v))) {}
  template <class U>
    requires(std::is_same_v<U, float> || std::is_integral_v<U>)
  constexpr operator U() const { return static_cast<U>(to_float(bits)); }
  template <class U>
    requires std::is_same_v<U, half>
  constexpr explicit operator U() const { return static_cast<U>(to_float(bits)); }

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

  constexpr bfloat operator-() const {
    bfloat r{};
    r.bits = static_cast<uint16_t>(bits ^ 0x8000u);
    return r;
  }
  constexpr bfloat operator+() const { return *this; }
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
  bfloat& operator++() { return *this += 1; }
  bfloat& operator--() { return *this -= 1; }
};

// The usual arithmetic conversions with bfloat: with bfloat or an integer it
// stays bfloat; with float it computes in float; with half there is no
// common type (neither converts implicitly to the other).
#define MH_BF_ARITH(op)                                                     \
  constexpr bfloat operator op(bfloat a, bfloat b) {                           \
    return bfloat(float(a) op float(b));                                    \
  }                                                                         \
  template <class U>                                                        \
    requires std::is_integral_v<U>                                          \
  constexpr bfloat operator op(bfloat a, U b) {                             \
    return bfloat(float(a) op float(b));                                    \
  }                                                                         \
  template <class U>                                                        \
    requires std::is_integral_v<U>                                          \
  constexpr bfloat operator op(U a, bfloat b) {                             \
    return bfloat(float(a) op float(b));                                    \
  }                                                                         \
  template <class U>                                                        \
    requires(std::is_same_v<U, float> || std::is_same_v<U, double>)         \
  constexpr U operator op(bfloat a, U b) {                                     \
    return U(float(a)) op b;                                                \
  }                                                                         \
  template <class U>                                                        \
    requires(std::is_same_v<U, float> || std::is_same_v<U, double>)         \
  constexpr U operator op(U a, bfloat b) {                                     \
    return a op U(float(b));                                                \
  }                                                                         \
  void operator op(bfloat, half) = delete;                                  \
  void operator op(half, bfloat) = delete;
MH_BF_ARITH(+)
MH_BF_ARITH(-)
MH_BF_ARITH(*)
MH_BF_ARITH(/)
#undef MH_BF_ARITH

// `x += b` with a scalar x and a bfloat b: b converts (to x's type) as a
// builtin bfloat would, without the ambiguity of the conversion templates.
#define MH_BF_COMPOUND(op)                                                  \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat> && !std::is_same_v<U, half>) \
  constexpr U& operator op##=(U & a, bfloat b) {                            \
    return a = static_cast<U>(float(a) op float(b));                        \
  }
MH_BF_COMPOUND(+)
MH_BF_COMPOUND(-)
MH_BF_COMPOUND(*)
MH_BF_COMPOUND(/)
#undef MH_BF_COMPOUND

#define MH_BF_CMP(op)                                                       \
  constexpr bool operator op(bfloat a, bfloat b) { return float(a) op float(b); } \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat> && !std::is_same_v<U, half>) \
  constexpr bool operator op(bfloat a, U b) {                               \
    return float(a) op b;                                                   \
  }                                                                         \
  template <class U>                                                        \
    requires(is_scalar_v<U> && !std::is_same_v<U, bfloat> && !std::is_same_v<U, half>) \
  constexpr bool operator op(U a, bfloat b) {                               \
    return a op float(b);                                                   \
  }                                                                         \
  bool operator op(bfloat, half) = delete;                                  \
  bool operator op(half, bfloat) = delete;
MH_BF_CMP(==)
MH_BF_CMP(!=)
MH_BF_CMP(<)
MH_BF_CMP(>)
MH_BF_CMP(<=)
MH_BF_CMP(>=)
#undef MH_BF_CMP

// ------------------------------------------------------------- type traits
// <metal_type_traits>: C++14's type traits under metal:: (with the _v
// variables sources use), MSL's meanings of the arithmetic ones (half and
// bfloat are floating-point) and its additions (vectors, address spaces).
// Not C++17's is_empty, void_t, conjunction and kin: MLX defines is_empty
// and void_t in namespace metal itself, and reaches disjunction through
// Apple's internal _disjunction.
using std::add_const;
using std::add_const_t;
using std::add_cv;
using std::add_cv_t;
using std::add_lvalue_reference;
using std::add_lvalue_reference_t;
using std::add_pointer;
using std::add_pointer_t;
using std::add_rvalue_reference;
using std::add_rvalue_reference_t;
using std::add_volatile;
using std::add_volatile_t;
using std::bool_constant;
using std::conditional;
using std::conditional_t;
using std::decay;
using std::decay_t;
using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::false_type;
using std::integral_constant;
using std::is_array;
using std::is_array_v;
using std::is_base_of;
using std::is_base_of_v;
using std::is_class;
using std::is_class_v;
using std::is_const;
using std::is_const_v;
using std::is_convertible;
using std::is_convertible_v;
using std::is_enum;
using std::is_enum_v;
using std::is_function;
using std::is_function_v;
using std::is_integral;
using std::is_integral_v;
using std::is_lvalue_reference;
using std::is_lvalue_reference_v;
using std::is_pointer;
using std::is_pointer_v;
using std::is_reference;
using std::is_reference_v;
using std::is_rvalue_reference;
using std::is_rvalue_reference_v;
using std::is_same;
using std::is_same_v;
using std::is_signed;
using std::is_signed_v;
using std::is_union;
using std::is_union_v;
using std::is_unsigned;
using std::is_unsigned_v;
using std::is_void;
using std::is_void_v;
using std::is_volatile;
using std::is_volatile_v;
using std::make_signed;
using std::make_signed_t;
using std::make_unsigned;
using std::make_unsigned_t;
using std::remove_all_extents;
using std::remove_all_extents_t;
using std::remove_const;
using std::remove_const_t;
using std::remove_cv;
using std::remove_cv_t;
using std::remove_extent;
using std::remove_extent_t;
using std::remove_pointer;
using std::remove_pointer_t;
using std::remove_reference;
using std::remove_reference_t;
using std::remove_volatile;
using std::remove_volatile_t;
using std::true_type;
// Apple's internal spellings, which sources reach under `#pragma METAL
// internals : enable` (MLX's atomic.h).
template <class... B>
using _disjunction = std::disjunction<B...>;
template <class... B>
using _conjunction = std::conjunction<B...>;

template <class T>
struct is_floating_point : std::bool_constant<is_float_v<T>> {};
template <class T>
inline constexpr bool is_floating_point_v = is_float_v<T>;
template <class T>
struct is_arithmetic : std::bool_constant<is_scalar_v<T>> {};
template <class T>
inline constexpr bool is_arithmetic_v = is_scalar_v<T>;
template <class T>
struct is_scalar : std::bool_constant<is_scalar_v<T>> {};

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
