// libc++ as a Mac at the deployment target has it: std::to_chars of a
// double is in macOS's libc++ since 13.3, std::from_chars of one only since
// 26.0, so a build for macOS 14 cannot call it.
#include <charconv>

double parse(const char* first, const char* last, char* out) {
  double v = 0;
#if MACBUILD_BAD == 1
  std::from_chars(first, last, v); // MACBUILD-ERROR 1
#else
  (void)first;
  (void)last;
#endif
  std::to_chars(out, out + 32, v);
  return v;
}
