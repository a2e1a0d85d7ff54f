// Address spaces as types. Under g++ the MSL address-space words are empty
// and every pointer is in one space; under the strict pass (mh/strict.h,
// clang) `device`, `constant` and `threadgroup` are address_space(1..3) and
// `thread` the default space. The shim strips the space where it reaches
// into storage (atomics, tensor views) and checks it where MSL does.
#pragma once

#include <type_traits>

namespace mh {

enum Space { kThread = 0, kDevice = 1, kConstant = 2, kThreadgroup = 3 };

template <class T>
struct address_space {
  static constexpr int value = kThread;
  using type = T;
};
#ifdef MH_STRICT
template <class T>
struct address_space<__attribute__((address_space(1))) T> {
  static constexpr int value = kDevice;
  using type = T;
};
template <class T>
struct address_space<__attribute__((address_space(2))) T> {
  static constexpr int value = kConstant;
  using type = T;
};
template <class T>
struct address_space<__attribute__((address_space(3))) T> {
  static constexpr int value = kThreadgroup;
  using type = T;
};
#endif

template <class T>
inline constexpr int address_space_v = address_space<T>::value;
template <class T>
using remove_address_space_t = typename address_space<T>::type;
// The type as MPP's traits see it: no reference, cv or address space.
template <class T>
using bare_t = std::remove_cv_t<remove_address_space_t<std::remove_cv_t<std::remove_reference_t<T>>>>;

// The same storage through a pointer in the default space (an explicit cast,
// as the shim's own plumbing; kernels never get one).
template <class T>
inline remove_address_space_t<T>* generic(T* p) {
  return (remove_address_space_t<T>*)p;
}

} // namespace mh
