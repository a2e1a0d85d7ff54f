// macOS's integer types, not Linux's: int64_t is long long and uint64_t is
// unsigned long long on macOS (long and unsigned long on Linux), while long
// and size_t are long and unsigned long on both. Code that treats int64_t
// as long compiles on Linux and fails on a Mac.
#include <algorithm>
#include <cstddef>
#include <cstdint>

long widest(std::int64_t a, long b) {
#if MACBUILD_BAD == 1
  return std::max(a, b); // MACBUILD-ERROR 1
#else
  return std::max<long>(a, b);
#endif
}

std::size_t total(std::size_t a, std::uint64_t b) {
#if MACBUILD_BAD == 2
  return std::min(a, b); // MACBUILD-ERROR 2
#else
  return std::min<std::size_t>(a, b);
#endif
}

void store(long* out, std::int64_t v) {
#if MACBUILD_BAD == 3
  std::int64_t* p = out; // MACBUILD-ERROR 3
  *p = v;
#else
  *out = static_cast<long>(v);
#endif
}
