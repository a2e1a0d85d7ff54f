// Binding of kernel parameters. For each [[host_name]] instantiation the
// source pre-pass emits
//   static const ::mh::Param p[] = {{'b', 0, "x"}, {'@', int(Builtin::...), "tid"}};
//   static ::mh::Registrar<&fn<T>> r{"host_name", "fn<T>", p, n, max_threads};
// kind 'b': [[buffer(n)]], 't': [[threadgroup(n)]], '@': a built-in value.
// The parameter types come from the function pointer.
#pragma once

#include "mh/rt.h"
#include "mh/vec.h"

namespace mh {

struct Param {
  char kind; // 'b', 't' or '@'
  int index; // buffer index or Builtin
  const char* name;
  bool (*enabled)() = nullptr; // [[function_constant(c)]]: the parameter exists where c is true
};

// `constant T name [[function_constant(index)]];`: the value the dispatch
// gives (run_kernel's function_constants); reading one it does not give fails
// the launch, as making such a pipeline fails on a Mac.
template <class T, int Index>
struct FunctionConstant {
  const char* name;
  bool defined() const {
    T v;
    return rt_function_constant(Index, &v, sizeof(T));
  }
  T value() const {
    T v;
    if (!rt_function_constant(Index, &v, sizeof(T))) {
      rt_fail("function constant '%s' ([[function_constant(%d)]]) has no value at this dispatch", name, Index);
    }
    return v;
  }
  operator T() const { return value(); }
};

inline void builtin_value(int which, uint32_t v[3]) {
  const ThreadInfo& t = *g_thread;
  auto set3 = [&](const uint32_t* s) {
    v[0] = s[0];
    v[1] = s[1];
    v[2] = s[2];
  };
  v[0] = v[1] = v[2] = 0;
  switch (Builtin(which)) {
    case Builtin::thread_position_in_grid: set3(t.grid_pos); break;
    case Builtin::threadgroup_position_in_grid: set3(t.group_pos); break;
    case Builtin::thread_position_in_threadgroup: set3(t.local_pos); break;
    case Builtin::threads_per_threadgroup: set3(t.group_size); break;
    case Builtin::threadgroups_per_grid: set3(t.groups); break;
    case Builtin::threads_per_grid: set3(t.grid_size); break;
    case Builtin::thread_index_in_threadgroup: v[0] = t.local_index; break;
    case Builtin::thread_index_in_simdgroup: v[0] = t.lane; break;
    case Builtin::simdgroup_index_in_threadgroup: v[0] = t.simd_index; break;
    case Builtin::simdgroups_per_threadgroup: v[0] = t.simd_count; break;
    case Builtin::threads_per_simdgroup: v[0] = kSimdWidth; break;
    case Builtin::thread_index_in_quadgroup: v[0] = t.lane % 4; break;
    case Builtin::quadgroup_index_in_threadgroup: v[0] = t.local_index / 4; break;
    case Builtin::quadgroups_per_threadgroup:
      v[0] = (t.group_size[0] * t.group_size[1] * t.group_size[2] + 3) / 4;
      break;
    case Builtin::dispatch_threads_per_threadgroup: set3(t.dispatch_size); break;
    case Builtin::dispatch_simdgroups_per_threadgroup:
      v[0] = (t.dispatch_size[0] * t.dispatch_size[1] * t.dispatch_size[2] + kSimdWidth - 1) / kSimdWidth;
      break;
    case Builtin::dispatch_quadgroups_per_threadgroup:
      v[0] = (t.dispatch_size[0] * t.dispatch_size[1] * t.dispatch_size[2] + 3) / 4;
      break;
    case Builtin::grid_origin: break;
    case Builtin::grid_size: set3(t.grid_size); break;
    default: rt_fail("unknown built-in attribute");
  }
}

template <class P>
inline P make_arg(const Param& p) {
  using D = std::remove_cv_t<std::remove_reference_t<P>>;
  if constexpr (std::is_pointer_v<D>) {
    if (p.enabled && !p.enabled()) {
      return reinterpret_cast<D>(rt_absent_buffer());  // absent from this pipeline
    }
    if (p.kind == 'b') {
      return reinterpret_cast<D>(rt_buffer(p.index, 0, p.name));
    }
    if (p.kind == 't') {
      return reinterpret_cast<D>(rt_tg_buffer(p.index, p.name));
    }
    rt_fail("pointer parameter '%s' needs a [[buffer(n)]] or [[threadgroup(n)]] attribute", p.name);
  } else if constexpr (std::is_reference_v<P>) {
    if (p.enabled && !p.enabled()) {
      return *reinterpret_cast<std::remove_reference_t<P>*>(rt_absent_buffer());
    }
    if (p.kind != 'b') {
      rt_fail("reference parameter '%s' needs a [[buffer(n)]] attribute", p.name);
    }
    return *reinterpret_cast<std::remove_reference_t<P>*>(rt_buffer(p.index, sizeof(D), p.name));
  } else {
    if (p.kind != '@') {
      rt_fail("parameter '%s' is passed by value but bound to a buffer", p.name);
    }
    uint32_t v[3];
    builtin_value(p.index, v);
    using I = metal::detail::vinfo<D>;
    if constexpr (I::is_vec) {
      using E = typename I::elem;
      if constexpr (I::n == 2) {
        return D(E(v[0]), E(v[1]));
      } else {
        return D(E(v[0]), E(v[1]), E(v[2]));
      }
    } else {
      return D(v[0]);
    }
  }
}

template <class... P, size_t... I>
inline void call_kernel(void (*f)(P...), const Param* ps, std::index_sequence<I...>) {
  f(make_arg<P>(ps[I])...);
}

template <class... P>
constexpr size_t arity(void (*)(P...)) {
  return sizeof...(P);
}

template <auto F>
struct Registrar {
  static inline const Param* params = nullptr;
  static void invoke() {
    call_kernel(F, params, std::make_index_sequence<arity(F)>{});
  }
  static void mismatch() {
    rt_fail("the harness read a different parameter list than the compiler (pre-pass bug)");
  }
  Registrar(const char* host_name, const char* function, const Param* ps, size_t n, int max_threads) {
    params = ps;
    rt_register(host_name, function, n == arity(F) ? &invoke : &mismatch, max_threads);
  }
};

} // namespace mh

namespace metal {
template <class T, int Index>
inline bool is_function_constant_defined(const ::mh::FunctionConstant<T, Index>& c) {
  return c.defined();
}
} // namespace metal
