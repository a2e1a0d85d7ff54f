// <metal_logging> (Metal 3.2): os_log. Messages go nowhere on the host (a Mac
// build shows them only with -fmetal-enable-logging).
#pragma once

namespace metal {

enum class os_log_type : int { debug, info, default_, error, fault };

struct os_log {
  constexpr os_log(const char*, const char*) {}
  template <class... A>
  void log_with_type(os_log_type, const char*, A...) const {}
  template <class... A>
  void log(const char*, A...) const {}
  template <class... A>
  void log_debug(const char*, A...) const {}
  template <class... A>
  void log_info(const char*, A...) const {}
  template <class... A>
  void log_error(const char*, A...) const {}
  template <class... A>
  void log_fault(const char*, A...) const {}
};

} // namespace metal
