// MSL's library as the strict pass's OpenCL front end sees it (opencl.py:
// clang in C++-for-OpenCL mode, C++17, with device / constant / threadgroup
// / thread mapped onto __global / __constant / __local / __private). Types
// are exact (sizes; vectors as clang's ext_vector_type; atomics, packed
// vectors and simdgroup matrices as structs); functions are declared
// loosely, one template per name whose result is its first argument's
// type: type checking library calls is the other front end's job
// (mh/all.h). Rules of MSL's library that OpenCL does not have are
// static_asserts tagged [rule]. Every static data member here is
// `constant`: OpenCL and MSL put no other variable at program scope.
#pragma once
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
// Functions as template arguments (MLX's FFT codelets); the pointers and
// references MSL refuses are analysis.py's to report.
#pragma OPENCL EXTENSION __cl_clang_function_pointers : enable

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
// bfloat: clang's __bf16 (17 and later take it for SPIR): a 16-bit float to
// and from which half does not convert implicitly, as in MSL. clang 16 has
// no __bf16 there: _Float16, distinct from half but convertible.
#if __clang_major__ >= 17
typedef __bf16 bfloat;
#else
typedef _Float16 bfloat;
#endif
typedef unsigned long size_t;
typedef long ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef long intptr_t;
typedef unsigned long uintptr_t;

#define MH_VECTORS(T)                                   \
  typedef T T##2 __attribute__((ext_vector_type(2)));   \
  typedef T T##3 __attribute__((ext_vector_type(3)));   \
  typedef T T##4 __attribute__((ext_vector_type(4)));   \
  namespace metal { using ::T##2; using ::T##3; using ::T##4; }
MH_VECTORS(char)
MH_VECTORS(uchar)
MH_VECTORS(short)
MH_VECTORS(ushort)
MH_VECTORS(int)
MH_VECTORS(uint)
MH_VECTORS(long)
MH_VECTORS(ulong)
MH_VECTORS(half)
MH_VECTORS(float)
MH_VECTORS(bfloat)
#undef MH_VECTORS
namespace metal {
// vec<T, N>: any width, as clang's ext_vector_type (vec<half, 8> is valid).
template <class T, int N> using vec = T __attribute__((ext_vector_type(N)));
}
namespace mh {
// vec<bool, N> as the boolN below (MLX's attention loads bool mask
// fragments): opencl.py writes ::mh::vec_any where clang reports a bool
// vector (T and N are not deduced through it, as they are through vec).
template <class T> struct vec_elem { using type = T; };
template <> struct vec_elem<bool> { using type = signed char; };
template <class T, int N> using vec_any = typename vec_elem<T>::type __attribute__((ext_vector_type(N)));
template <class T> struct shape;
// V's width with T's elements (V an alias template's vector of float).
template <class V, class T> using rebind_vec = vec_any<T, shape<V>::n>;
}
// OpenCL has no bool vectors: bytes of another type than charN, sized as MSL's.
typedef signed char bool2 __attribute__((ext_vector_type(2)));
typedef signed char bool3 __attribute__((ext_vector_type(3)));
typedef signed char bool4 __attribute__((ext_vector_type(4)));

// Packed vectors: MSL's sizes (no padding), members and conversions only.
template <class T, int N> struct packed_vec;
#define MH_PACKED(N, ...)                                                   \
  template <class T> struct packed_vec<T, N> {                             \
    T __VA_ARGS__;                                                         \
    packed_vec() = default;                                                \
    template <class... A> packed_vec(A...);                                \
    operator T __attribute__((ext_vector_type(N)))() const;                \
    T& operator[](int);                                                    \
    const T& operator[](int) const;                                        \
  };
MH_PACKED(2, x, y)
MH_PACKED(3, x, y, z)
MH_PACKED(4, x, y, z, w)
#undef MH_PACKED
#define MH_PACKED(T)                        \
  typedef packed_vec<T, 2> packed_##T##2;   \
  typedef packed_vec<T, 3> packed_##T##3;   \
  typedef packed_vec<T, 4> packed_##T##4;
MH_PACKED(char) MH_PACKED(uchar) MH_PACKED(short) MH_PACKED(ushort) MH_PACKED(int) MH_PACKED(uint)
MH_PACKED(long) MH_PACKED(ulong) MH_PACKED(half) MH_PACKED(float) MH_PACKED(bfloat)
#undef MH_PACKED

// MSL's constants (metal_math, metal_limits).
#define MAXFLOAT 0x1.fffffep+127f
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#include "mh/constants.h"
#define CHAR_BIT 8
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define SHRT_MAX 32767
#define USHRT_MAX 65535
#define UCHAR_MAX 255

namespace mh {
enum { kThread = 0, kDevice = 1, kConstant = 2, kThreadgroup = 3, kGeneric = 4 };

// The address space of a type, and the type without it.
template <class T> struct space { static constexpr __constant int value = kThread; using type = T; };
template <class T> struct space<__global T> { static constexpr __constant int value = kDevice; using type = T; };
template <class T> struct space<__constant T> { static constexpr __constant int value = kConstant; using type = T; };
template <class T> struct space<__local T> { static constexpr __constant int value = kThreadgroup; using type = T; };
template <class T> struct space<__generic T> { static constexpr __constant int value = kGeneric; using type = T; };
template <class T> struct space<__private T> { static constexpr __constant int value = kThread; using type = T; };

template <class T> struct bare { using type = T; };
template <class T> struct bare<const T> : bare<T> {};
template <class T> struct bare<volatile T> : bare<T> {};
template <class T> struct bare<T&> : bare<T> {};
template <class T> struct bare<T&&> : bare<T> {};
template <class T> using bare_t = typename bare<typename space<typename bare<T>::type>::type>::type;

// Element type and width of a scalar or vector.
template <class T> struct shape { using elem = T; static constexpr __constant int n = 1; };
template <class T, int N> struct shape<T __attribute__((ext_vector_type(N)))> {
  using elem = T;
  static constexpr __constant int n = N;
};
template <class T> using elem_t = typename shape<bare_t<T>>::elem;

// A vector built from scalars and vectors (MSL's float4(a, b) and kin; clang's
// vectors take no constructor syntax, so opencl.py rewrites the calls here);
// constexpr, as MSL's vector constructors are.
template <class V, class A> constexpr void make_put(V& out, int& k, A a) {
  if constexpr (shape<A>::n == 1) {
    out[k++] = typename shape<V>::elem(a);
  } else {
    for (int i = 0; i < shape<A>::n; ++i) {
      out[k++] = typename shape<V>::elem(a[i]);
    }
  }
}
// An operand of a vector operation: a scalar beside a vector becomes the
// vector's element type, as MSL converts it (`0.5f * h` with h a half2;
// clang's OpenCL refuses a scalar of greater rank than the elements, and
// opencl.py wraps the operands where it does).
template <class Other, class X> constexpr auto operand(X x) {
  if constexpr (shape<bare_t<Other>>::n > 1 && shape<bare_t<X>>::n == 1) {
    return typename shape<bare_t<Other>>::elem(x);
  } else {
    return x;
  }
}
// An object that converts to an integer, as that integer (a pointer's
// offset; opencl.py wraps it where clang's OpenCL finds no built-in
// pointer arithmetic through the conversion).
template <class X> constexpr auto integral(X x) { return +x; }
template <class V, class... A> constexpr V make(A... a) {
  V out{};
  int k = 0;
  (make_put<V>(out, k, a), ...);
  if (k == 1) {  // one scalar: every element
    for (int i = 1; i < shape<V>::n; ++i) {
      out[i] = out[0];
    }
  }
  return out;
}
// A cast between vectors of one width: element by element (MSL's
// static_cast<float4>(i4) and (float4)s4; clang's OpenCL refuses the one and
// reads the other as a bit cast; opencl.py writes this where it refuses).
template <class T, class X> constexpr T convert(X x) {
  if constexpr (shape<bare_t<X>>::n > 1 && shape<bare_t<T>>::n > 1) {
    static_assert(shape<bare_t<X>>::n == shape<bare_t<T>>::n, "a cast between vectors keeps the number of components");
    return make<T>(x);
  } else {
    return static_cast<T>(x);
  }
}
// A vector comparison's result as MSL types it: a bool vector (clang's
// OpenCL gives a vector of integers, -1 for true; opencl.py writes this
// where one initialises or is assigned to a boolN).
template <class X> constexpr vec_any<bool, shape<bare_t<X>>::n> truth(X x) {
  return make<vec_any<bool, shape<bare_t<X>>::n>>(x);
}
} // namespace mh

namespace metal {
// ---------------------------------------------------------------- traits
template <class T, T v> struct integral_constant {
  static constexpr __constant T value = v;
  constexpr operator T() const { return v; }
};
template <bool B> using bool_constant = integral_constant<bool, B>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;
template <class A, class B> struct is_same : false_type {};
template <class A> struct is_same<A, A> : true_type {};
template <class A, class B> constexpr __constant bool is_same_v = is_same<A, B>::value;
template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { using type = T; };
template <bool B, class T = void> using enable_if_t = typename enable_if<B, T>::type;
template <bool B, class T, class F> struct conditional { using type = T; };
template <class T, class F> struct conditional<false, T, F> { using type = F; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;
template <class T> struct remove_cv { using type = T; };
template <class T> struct remove_cv<const T> { using type = T; };
template <class T> struct remove_cv<volatile T> { using type = T; };
template <class T> struct remove_cv<const volatile T> { using type = T; };
template <class T> using remove_cv_t = typename remove_cv<T>::type;
template <class T> struct remove_reference { using type = T; };
template <class T> struct remove_reference<T&> { using type = T; };
template <class T> struct remove_reference<T&&> { using type = T; };
template <class T> using remove_reference_t = typename remove_reference<T>::type;
template <class T> using remove_cvref_t = remove_cv_t<remove_reference_t<T>>;
template <class T> struct remove_address_space { using type = typename mh::space<T>::type; };
template <class T> using remove_address_space_t = typename remove_address_space<T>::type;
template <class T> using remove_addrspace = remove_address_space<T>;
template <class T> using remove_addrspace_t = remove_address_space_t<T>;
template <class T> T&& declval();
template <class T> constexpr __constant bool is_integral_v = __is_integral(T);  // bool too, as in C++
template <class T> constexpr __constant bool is_floating_point_v =
    is_same_v<remove_cv_t<T>, float> || is_same_v<remove_cv_t<T>, half> || is_same_v<remove_cv_t<T>, bfloat>;
template <class T> constexpr __constant bool is_arithmetic_v = __is_integral(T) || is_floating_point_v<T>;
template <class T> constexpr __constant bool is_scalar_v = is_arithmetic_v<T>;
template <class T> constexpr __constant bool is_signed_v = is_arithmetic_v<T> && T(-1) < T(0);
template <class T> constexpr __constant bool is_unsigned_v = __is_integral(T) && T(0) < T(-1);
template <class T> constexpr __constant bool is_const_v = !is_same_v<T, remove_cv_t<T>> ;
template <class T> constexpr __constant bool is_pointer_v = __is_pointer(T);
template <class T> constexpr __constant bool is_reference_v = __is_reference(T);
template <class T> struct is_integral : bool_constant<is_integral_v<T>> {};
template <class T> struct is_floating_point : bool_constant<is_floating_point_v<T>> {};
template <class T> struct is_arithmetic : bool_constant<is_arithmetic_v<T>> {};
template <class T> struct is_signed : bool_constant<is_signed_v<T>> {};
template <class T> struct is_unsigned : bool_constant<is_unsigned_v<T>> {};
template <class T> struct make_unsigned { using type = __make_unsigned(T); };
template <class T> using make_unsigned_t = typename make_unsigned<T>::type;
template <class T> struct make_signed { using type = __make_signed(T); };
template <class T> using make_signed_t = typename make_signed<T>::type;
template <class F, class T> constexpr __constant bool is_convertible_v = __is_convertible_to(F, T);
template <class F, class T> struct is_convertible : bool_constant<is_convertible_v<F, T>> {};
template <class T> constexpr __constant bool is_class_v = __is_class(T);
template <class B, class D> constexpr __constant bool is_base_of_v = __is_base_of(B, D);
template <class T> struct is_pointer : bool_constant<is_pointer_v<T>> {};
template <class T> struct is_const : bool_constant<is_const_v<T>> {};
template <class T> struct decay { using type = __decay(T); };
template <class T> using decay_t = typename decay<T>::type;
template <class T> struct remove_pointer { using type = __remove_pointer(T); };
template <class T> using remove_pointer_t = typename remove_pointer<T>::type;
template <class T> struct remove_const { using type = T; };
template <class T> struct remove_const<const T> { using type = T; };
template <class T> using remove_const_t = typename remove_const<T>::type;
template <class... B> struct _disjunction : false_type {};
template <class B, class... R> struct _disjunction<B, R...> : conditional_t<bool(B::value), B, _disjunction<R...>> {};
template <class... B> struct _conjunction : true_type {};
template <class B, class... R> struct _conjunction<B, R...> : conditional_t<bool(B::value), _conjunction<R...>, B> {};
template <class T> struct is_vector : false_type {};
template <class T, int N> struct is_vector<T __attribute__((ext_vector_type(N)))> : true_type {};
template <class T> constexpr __constant bool is_vector_v = is_vector<T>::value;
template <class T> struct uniform {
  T mh_value;
  uniform() = default;
  constexpr uniform(T v) : mh_value(v) {}
  constexpr operator T() const { return mh_value; }
};
template <class T> constexpr uniform<T> make_uniform(T v) { return uniform<T>(v); }
template <class T> bool is_function_constant_defined(T);
// <metal_logging> (3.2): os_log, its strings in constant memory.
struct os_log {
  constexpr os_log(__constant const char*, __constant const char*) {}
  template <class... A> void log_debug(__constant const char*, A...) const {}
  template <class... A> void log_info(__constant const char*, A...) const {}
  template <class... A> void log_error(__constant const char*, A...) const {}
  template <class... A> void log_fault(__constant const char*, A...) const {}
  template <class... A> void log(__constant const char*, A...) const {}
};

// numeric_limits with values: sources use them in constant expressions.
template <class T> struct numeric_limits {
  static constexpr __constant bool is_specialized = true;
  static constexpr __constant bool is_integer = __is_integral(T);
  static constexpr __constant bool is_signed = is_signed_v<T>;
  static constexpr __constant int digits = int(sizeof(T) * 8) - (is_signed_v<T> ? 1 : 0);
  static constexpr T max() {
    return is_signed_v<T> ? T(~(make_unsigned_t<T>(1) << (sizeof(T) * 8 - 1))) : T(~T(0));
  }
  static constexpr T min() { return is_signed_v<T> ? T(-max() - 1) : T(0); }
  static constexpr T lowest() { return min(); }
  static constexpr T epsilon() { return T(0); }
  static constexpr T infinity() { return T(0); }
  static constexpr T quiet_NaN() { return T(0); }
};
template <> struct numeric_limits<bool> {
  static constexpr __constant bool is_specialized = true;
  static constexpr __constant bool is_integer = true;
  static constexpr __constant bool is_signed = false;
  static constexpr bool max() { return true; }
  static constexpr bool min() { return false; }
  static constexpr bool lowest() { return false; }
};
#define MH_FLOAT_LIMITS(T, MAX, MIN, EPS, DIGITS)                           \
  template <> struct numeric_limits<T> {                                   \
    static constexpr __constant bool is_specialized = true;                \
    static constexpr __constant bool is_integer = false;                   \
    static constexpr __constant bool is_signed = true;                     \
    static constexpr __constant bool has_infinity = true;                  \
    static constexpr __constant int digits = DIGITS;                       \
    static constexpr T max() { return T(MAX); }                            \
    static constexpr T min() { return T(MIN); }                            \
    static constexpr T lowest() { return T(-(MAX)); }                      \
    static constexpr T epsilon() { return T(EPS); }                        \
    static constexpr T infinity() { return T(__builtin_inff()); }          \
    static constexpr T quiet_NaN() { return T(__builtin_nanf("")); }       \
    static constexpr T denorm_min() { return T(MIN); }                     \
  };
MH_FLOAT_LIMITS(float, 0x1.fffffep+127f, 0x1p-126f, 0x1p-23f, 24)
MH_FLOAT_LIMITS(half, 65504.0f, 6.103515625e-05f, 0.0009765625f, 11)
MH_FLOAT_LIMITS(bfloat, 65504.0f, 6.103515625e-05f, 0.0078125f, 8)
#undef MH_FLOAT_LIMITS

// ---------------------------------------------------------------- arrays
template <class T, size_t N> struct array {
  T mh_elems[N];
  T& operator[](size_t i) { return mh_elems[i]; }
  const T& operator[](size_t i) const { return mh_elems[i]; }
  const __constant T& operator[](size_t i) const __constant { return mh_elems[i]; }
  constexpr size_t size() const { return N; }
};
template <class T, size_t N> struct array_ref {
  template <class... A> array_ref(A...);
  const T& operator[](size_t i) const;
  size_t size() const;
};

// ---------------------------------------------------------------- functions
#define MH_LIKE_FIRST(f) template <class X, class... A> X f(X, A...);
#define MH_SCALAR_OF(f) template <class X, class... A> mh::elem_t<X> f(X, A...);
#define MH_BOOL(f) template <class... A> bool f(A...);
#define MH_MATH(M)                                                                                       \
  M(abs) M(acos) M(acosh) M(asin) M(asinh) M(atan) M(atan2) M(atanh) M(ceil) M(clamp) M(copysign) M(cos) \
  M(cosh) M(cospi) M(divide) M(exp) M(exp10) M(exp2) M(fabs) M(fdim) M(floor) M(fma) M(fmax) M(fmax3)    \
  M(fmedian3) M(fmin) M(fmin3) M(fmod) M(fract) M(frexp) M(ldexp) M(log) M(log10) M(log2) M(max) M(max3) \
  M(median3) M(min) M(min3) M(mix) M(modf) M(pow) M(powr) M(rint) M(round) M(rsqrt) M(saturate) M(sign)  \
  M(sin) M(sincos) M(sinh) M(sinpi) M(smoothstep) M(sqrt) M(step) M(tan) M(tanh) M(tanpi) M(trunc)       \
  M(normalize) M(cross) M(reflect) M(refract) M(faceforward)
MH_MATH(MH_LIKE_FIRST)
namespace fast { MH_MATH(MH_LIKE_FIRST) }
namespace precise { MH_MATH(MH_LIKE_FIRST) }
MH_LIKE_FIRST(absdiff) MH_LIKE_FIRST(addsat) MH_LIKE_FIRST(clz) MH_LIKE_FIRST(ctz) MH_LIKE_FIRST(extract_bits)
MH_LIKE_FIRST(hadd) MH_LIKE_FIRST(insert_bits) MH_LIKE_FIRST(mad24) MH_LIKE_FIRST(madhi) MH_LIKE_FIRST(madsat)
MH_LIKE_FIRST(mul24) MH_LIKE_FIRST(mulhi) MH_LIKE_FIRST(popcount) MH_LIKE_FIRST(reverse_bits)
MH_LIKE_FIRST(rhadd) MH_LIKE_FIRST(rotate) MH_LIKE_FIRST(subsat) MH_LIKE_FIRST(select)
MH_SCALAR_OF(dot) MH_SCALAR_OF(length) MH_SCALAR_OF(length_squared) MH_SCALAR_OF(distance)
MH_SCALAR_OF(distance_squared)
MH_BOOL(all) MH_BOOL(any) MH_BOOL(isfinite) MH_BOOL(isinf) MH_BOOL(isnan) MH_BOOL(isnormal)
MH_BOOL(isordered) MH_BOOL(isunordered) MH_BOOL(signbit)
MH_LIKE_FIRST(ilogb) MH_LIKE_FIRST(pown) MH_LIKE_FIRST(mad) MH_LIKE_FIRST(median3)

// as_type: MSL reinterprets only between types of one size.
template <class T, class U> T as_type(U x) {
  static_assert(sizeof(T) == sizeof(U), "[as-type] as_type<T>(x) needs sizeof(T) == sizeof(x)");
  return __builtin_bit_cast(T, x);
}

// ---------------------------------------------------------------- barriers, simd and quad functions
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4,
                       mem_threadgroup_imageblock = 8, mem_object_data = 16 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags = mem_flags::mem_none);

struct simd_vote {
  using vote_t = ulong;
  explicit constexpr simd_vote(vote_t v = 0) : bits(v) {}
  explicit constexpr operator vote_t() const { return bits; }
  constexpr bool all() const { return bits == ~vote_t(0); }
  constexpr bool any() const { return bits != 0; }
  vote_t bits;
};
#define MH_COLLECTIVES(M)                                                                          \
  M(simd_sum) M(simd_product) M(simd_min) M(simd_max) M(simd_and) M(simd_or) M(simd_xor)          \
  M(simd_prefix_exclusive_sum) M(simd_prefix_inclusive_sum) M(simd_prefix_exclusive_product)     \
  M(simd_prefix_inclusive_product) M(simd_shuffle) M(simd_broadcast) M(simd_broadcast_first)     \
  M(simd_shuffle_xor) M(simd_shuffle_down) M(simd_shuffle_up) M(simd_shuffle_rotate_down)        \
  M(simd_shuffle_rotate_up) M(simd_shuffle_and_fill_down) M(simd_shuffle_and_fill_up)            \
  M(quad_sum) M(quad_product) M(quad_min) M(quad_max) M(quad_and) M(quad_or) M(quad_xor)          \
  M(quad_prefix_exclusive_sum) M(quad_prefix_inclusive_sum) M(quad_shuffle) M(quad_broadcast)    \
  M(quad_broadcast_first) M(quad_shuffle_xor) M(quad_shuffle_down) M(quad_shuffle_up)            \
  M(quad_shuffle_rotate_down) M(quad_shuffle_rotate_up)
MH_COLLECTIVES(MH_LIKE_FIRST)
simd_vote simd_ballot(bool);
simd_vote simd_active_threads_mask();
bool simd_all(bool);
bool simd_any(bool);
bool simd_is_first();
bool simd_is_helper_thread();
bool quad_all(bool);
bool quad_any(bool);
ushort quad_ballot(bool);
} // namespace metal
// Apple's compiler built-ins under <metal_stdlib> (__metal_fabs(x, mode),
// __metal_simd_sum(x), ...), which sources may call too.
#define __METAL_FAST_MATH__ 0
#define __METAL_HALF_MATH__ 1
#define __METAL_NATIVE_MATH__ 2
#define __METAL_PRECISE_MATH__ 3
#define __METAL_MAYBE_FAST_MATH__ __METAL_FAST_MATH__
#define MH_BUILTIN(f) MH_LIKE_FIRST(__metal_##f)
MH_MATH(MH_BUILTIN)
MH_COLLECTIVES(MH_BUILTIN)
MH_BUILTIN(fmedian3) MH_BUILTIN(nextafter) MH_BUILTIN(get_simdgroup_size)
MH_BUILTIN(get_thread_index_in_simdgroup) MH_BUILTIN(select)
#undef MH_BUILTIN
namespace metal {
#undef MH_COLLECTIVES
#undef MH_MATH
#undef MH_LIKE_FIRST
#undef MH_SCALAR_OF
#undef MH_BOOL

// ---------------------------------------------------------------- atomics
enum memory_order { memory_order_relaxed, memory_order_acquire, memory_order_release,
                    memory_order_acq_rel, memory_order_seq_cst };
enum thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup,
                    thread_scope_device };
template <class T> struct atomic {
  static_assert(is_same_v<T, int> || is_same_v<T, uint> || is_same_v<T, bool> || is_same_v<T, float> ||
                    is_same_v<T, long> || is_same_v<T, ulong>,
                "[atomic] MSL's atomic types are atomic_int, _uint, _bool, _float, _long and _ulong");
  T mh_value;
};
// Complete before any kernel names them (clang's OpenCL mode refuses a
// kernel parameter pointing to a specialisation not yet instantiated).
template struct atomic<int>;
template struct atomic<uint>;
template struct atomic<bool>;
template struct atomic<float>;
template struct atomic<long>;
template struct atomic<ulong>;
// MSL's atomic functions take device or threadgroup atomics only.
template <class A> using atomic_t = decltype(mh::bare_t<A>::mh_value);
template <class A> constexpr __constant bool atomic_space_v =
    mh::space<A>::value == mh::kDevice || mh::space<A>::value == mh::kThreadgroup;
#define MH_ATOMIC(f)                                                                                  \
  template <class A, class... R> atomic_t<A> f(A* obj, R...) {                                        \
    static_assert(atomic_space_v<A>, "[atomic] " #f " takes an atomic in device or threadgroup memory"); \
    return {};                                                                                        \
  }
MH_ATOMIC(atomic_load_explicit) MH_ATOMIC(atomic_exchange_explicit) MH_ATOMIC(atomic_fetch_add_explicit)
MH_ATOMIC(atomic_fetch_sub_explicit) MH_ATOMIC(atomic_fetch_and_explicit) MH_ATOMIC(atomic_fetch_or_explicit)
MH_ATOMIC(atomic_fetch_xor_explicit) MH_ATOMIC(atomic_fetch_min_explicit) MH_ATOMIC(atomic_fetch_max_explicit)
#undef MH_ATOMIC
template <class A, class... R> void atomic_store_explicit(A* obj, R...) {
  static_assert(atomic_space_v<A>, "[atomic] atomic_store_explicit takes an atomic in device or threadgroup memory");
}
template <class A, class... R> bool atomic_compare_exchange_weak_explicit(A* obj, R...) {
  static_assert(atomic_space_v<A>,
                "[atomic] atomic_compare_exchange_weak_explicit takes an atomic in device or threadgroup memory");
  return false;
}

// ---------------------------------------------------------------- matrices
// MSL's halfNxM and floatNxM: N columns of M-vectors (their sizes); the
// operations' shapes here, their checks in mh/matrix.h.
template <class T, int C, int R> struct matrix {
  static_assert(is_same_v<T, float> || is_same_v<T, half>, "MSL's matrices hold float or half");
  using column_type = T __attribute__((ext_vector_type(R)));
  column_type columns[C];
  matrix() = default;
  template <class... A> matrix(A...);
  column_type& operator[](int);
  const column_type& operator[](int) const;
  const __constant column_type& operator[](int) const __constant;
};
template <class T, int C, int R, int K> matrix<T, K, R> operator*(matrix<T, C, R>, matrix<T, K, C>);
// Vectors through metal::vec: clang before 17 takes ext_vector_type on typedefs only.
template <class T, int C, int R> metal::vec<T, R> operator*(matrix<T, C, R>, metal::vec<T, C>);
template <class T, int C, int R> metal::vec<T, C> operator*(metal::vec<T, R>, matrix<T, C, R>);
template <class T, int C, int R> matrix<T, C, R> operator*(matrix<T, C, R>, T);
template <class T, int C, int R> matrix<T, C, R> operator*(T, matrix<T, C, R>);
template <class T, int C, int R> matrix<T, C, R> operator/(matrix<T, C, R>, T);
template <class T, int C, int R> matrix<T, C, R> operator+(matrix<T, C, R>, matrix<T, C, R>);
template <class T, int C, int R> matrix<T, C, R> operator-(matrix<T, C, R>, matrix<T, C, R>);
template <class T, int C, int R> matrix<T, C, R> operator-(matrix<T, C, R>);
template <class T, int C, int R> matrix<T, R, C> transpose(matrix<T, C, R>);
template <class T, int N> T determinant(matrix<T, N, N>);
#define MH_MATRIX_NAMES(T)                                                                             \
  typedef matrix<T, 2, 2> T##2x2; typedef matrix<T, 2, 3> T##2x3; typedef matrix<T, 2, 4> T##2x4;     \
  typedef matrix<T, 3, 2> T##3x2; typedef matrix<T, 3, 3> T##3x3; typedef matrix<T, 3, 4> T##3x4;     \
  typedef matrix<T, 4, 2> T##4x2; typedef matrix<T, 4, 3> T##4x3; typedef matrix<T, 4, 4> T##4x4;
MH_MATRIX_NAMES(half)
MH_MATRIX_NAMES(float)
#undef MH_MATRIX_NAMES

// ---------------------------------------------------------------- simdgroup matrices
template <class T, int R, int C> struct simdgroup_matrix {
  static_assert(is_same_v<T, float> || is_same_v<T, half> || is_same_v<T, bfloat>,
                "[simdgroup-matrix] simdgroup_matrix holds float, half or bfloat");
  static_assert(R == 8 && C == 8, "[simdgroup-matrix] simdgroup_matrix is 8x8");
  T mh_elems[2];
  simdgroup_matrix() = default;
  explicit simdgroup_matrix(T);
  // This thread's two elements, in its private memory.
  using mh_elements = T __attribute__((ext_vector_type(2)));
  __private mh_elements& thread_elements() __private;
  const __private mh_elements& thread_elements() const __private;
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <class T, int R, int C = R> simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T);
template <class M, class P, class... A> void simdgroup_load(M&, P*, A...);
template <class M, class P, class... A> void simdgroup_store(const M&, P*, A...);
template <class D, class... A> void simdgroup_multiply(D&, const A&...);
template <class D, class... A> void simdgroup_multiply_accumulate(D&, const A&...);

// ---------------------------------------------------------------- tensors (Metal 4)
// Loose stand-ins: MetalPerformancePrimitives' constraints live in
// mh/tensor.h, which the other front end checks.
constexpr __constant size_t dynamic_extent = size_t(-1);
template <class I, size_t R> struct dextents {
  template <class... A> dextents(A...);
};
template <class I, size_t... E> struct extents {
  template <class... A> extents(A...);
};
struct tensor_inline {};
struct mh_any {
  template <class T> operator T() const;
};
template <class E, class X, class L = tensor_inline> struct tensor {
  using element_type = E;
  template <class... A> tensor(A...);
  template <class... A> mh_any get_extent(A...) const;
  template <class... A> mh_any operator[](A...) const;
  template <size_t... S, class... A> tensor<E, extents<int, S...>, L> slice(A...) const;
};
template <class P, class X> tensor(P*, X) -> tensor<P, X, tensor_inline>;
template <class P, class X, class S> tensor(P*, X, S) -> tensor<P, X, tensor_inline>;
template <int N> struct execution_simdgroups {};
struct execution_simdgroup {};
struct execution_thread {};
} // namespace metal
#define MH_GLOBAL_MATRIX(T)                                                                    \
  using metal::T##2x2; using metal::T##2x3; using metal::T##2x4; using metal::T##3x2;          \
  using metal::T##3x3; using metal::T##3x4; using metal::T##4x2; using metal::T##4x3; using metal::T##4x4;
MH_GLOBAL_MATRIX(half)
MH_GLOBAL_MATRIX(float)
#undef MH_GLOBAL_MATRIX

namespace mpp {
namespace tensor_ops {
// A class as a template argument needs C++20; OpenCL's C++ is C++17, so the
// descriptor passes as a number here.
struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  template <class... A> constexpr matmul2d_descriptor(A...) {}
  constexpr operator long() const { return 0; }
};
template <class T> struct mh_cooperative {
  using element_type = T;
  size_t get_capacity() const;
  T& operator[](size_t);
  template <class... A> void load(A...);
  template <class... A> void store(A...);
  ::metal::array<int, 2> get_multidimensional_index(int) const;
};
template <long D, class Scope> struct matmul2d {
  template <class... A> void run(const A&...);
  template <class L, class R, class T> mh_cooperative<T> get_destination_cooperative_tensor() const;
  template <class L, class R, class T> mh_cooperative<L> get_left_input_cooperative_tensor() const;
  template <class L, class R, class T> mh_cooperative<R> get_right_input_cooperative_tensor() const;
};
} // namespace tensor_ops
} // namespace mpp

// OpenCL C++ declares its own atomic_int and kin (as _Atomic types); MSL's
// are spelled here before clang sees them.
#define atomic_int ::metal::atomic<int>
#define atomic_uint ::metal::atomic<uint>
#define atomic_bool ::metal::atomic<bool>
#define atomic_float ::metal::atomic<float>
#define atomic_long ::metal::atomic<long>
#define atomic_ulong ::metal::atomic<ulong>
// OpenCL keywords that are names in MSL: `half` is a type MSL code may
// shadow (`const int half = n / 2;`), the rest plain identifiers.
typedef half mh_half;
#define half mh_half
#define global mh_name_global
#define local mh_name_local
#define generic mh_name_generic
#define read_only mh_name_read_only
#define write_only mh_name_write_only
#define read_write mh_name_read_write
#define pipe mh_name_pipe
#define METAL_FUNC inline
#define METAL_CONST constexpr __constant
#define device __global
#define constant const __constant  // read-only: a `constant T` is a const T (MSL binds `const constant int` to `constant int&`)
#define threadgroup __local
// thread is private (a `thread` method's `this` too: opencl.py keeps the
// qualifier on methods other than constructors, whose temporaries and
// constant evaluation have no space in OpenCL).
#define thread __private
