// Metal atomics. GPU threads switch only at barriers and collectives, so a
// read-modify-write here is indivisible by construction; memory ordering is
// therefore stronger than Metal's relaxed atomics.
#pragma once

#include "mh/space.h"

#include "mh/types.h"

namespace metal {

enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};

enum thread_scope {
  thread_scope_thread,
  thread_scope_simdgroup,
  thread_scope_threadgroup,
  thread_scope_device,
};

template <class T>
struct atomic {
  T value;
};

using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_bool = atomic<bool>;
using atomic_float = atomic<float>;
using atomic_long = atomic<long>;
using atomic_ulong = atomic<ulong>;

namespace detail {
template <class A>
inline auto& atomic_ref(A* obj) {
  auto* g = ::mh::generic(obj);
  using T = decltype(g->value);
  return const_cast<std::remove_cv_t<T>&>(g->value);
}
template <class A>
using atomic_value_t = std::remove_cv_t<decltype(::mh::generic(std::declval<A*>())->value)>;
} // namespace detail

template <class A, class M>
inline void atomic_store_explicit(A* obj, M desired, memory_order = memory_order_relaxed) {
  detail::atomic_ref(obj) = detail::atomic_value_t<A>(desired);
}

template <class A>
inline auto atomic_load_explicit(A* obj, memory_order = memory_order_relaxed) {
  return detail::atomic_value_t<A>(detail::atomic_ref(obj));
}

template <class A, class M>
inline auto atomic_exchange_explicit(A* obj, M desired, memory_order = memory_order_relaxed) {
  auto& v = detail::atomic_ref(obj);
  auto old = v;
  v = detail::atomic_value_t<A>(desired);
  return old;
}

template <class A, class E, class M>
inline bool atomic_compare_exchange_weak_explicit(
    A* obj, E* expected, M desired, memory_order = memory_order_relaxed,
    memory_order = memory_order_relaxed) {
  auto& v = detail::atomic_ref(obj);
  if (v == *expected) {
    v = detail::atomic_value_t<A>(desired);
    return true;
  }
  *expected = v;
  return false;
}

template <class A, class E, class M>
inline bool atomic_compare_exchange_strong_explicit(
    A* obj, E* expected, M desired, memory_order s = memory_order_relaxed,
    memory_order f = memory_order_relaxed) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, s, f);
}

#define MH_ATOMIC_FETCH(name, expr)                                           \
  template <class A, class M>                                                 \
  inline auto atomic_fetch_##name##_explicit(                                 \
      A* obj, M operand, memory_order = memory_order_relaxed) {               \
    using T = detail::atomic_value_t<A>;                                      \
    auto& v = detail::atomic_ref(obj);                                        \
    T old = v;                                                                \
    T b = T(operand);                                                         \
    v = T(expr);                                                              \
    return old;                                                               \
  }
MH_ATOMIC_FETCH(add, old + b)
MH_ATOMIC_FETCH(sub, old - b)
MH_ATOMIC_FETCH(and, old & b)
MH_ATOMIC_FETCH(or, old | b)
MH_ATOMIC_FETCH(xor, old ^ b)
MH_ATOMIC_FETCH(min, b < old ? b : old)
MH_ATOMIC_FETCH(max, old < b ? b : old)
#undef MH_ATOMIC_FETCH

// Without _explicit (memory_order_relaxed is implied on Metal).
template <class A, class M>
inline void atomic_store(A* obj, M desired) {
  atomic_store_explicit(obj, desired);
}
template <class A>
inline auto atomic_load(A* obj) {
  return atomic_load_explicit(obj);
}

} // namespace metal
