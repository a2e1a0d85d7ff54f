#include "cpu/allocator.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mlx_lattice::cpu {

namespace {

std::string& status() {
  static std::string s = "not applied";
  return s;
}

#if defined(__GLIBC__)
// glibc's largest mmap threshold on 64-bit hosts (half its arena heap size):
// blocks up to this size come from the heap and are reused across steps.
constexpr int kMmapThreshold = 32 * 1024 * 1024;

// The value of glibc.malloc.hugetlb in GLIBC_TUNABLES ("" when absent).
std::string hugetlb_tunable() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  const char* key = "glibc.malloc.hugetlb=";
  const char* p = t ? std::strstr(t, key) : nullptr;
  if (!p) {
    return "";
  }
  p += std::strlen(key);
  return std::string(p, std::strcspn(p, ":"));
}

// Names of the environment settings through which a user configures glibc's
// malloc thresholds; when one is present, the heap is left as configured.
// glibc.malloc.hugetlb (huge pages for the heap) is not one: it combines
// with the thresholds below.
const char* user_malloc_setting() {
  static const char* const kVars[] = {
      "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
      "MALLOC_MMAP_MAX_"};
  for (const char* v : kVars) {
    if (std::getenv(v)) {
      return v;
    }
  }
  const char* t = std::getenv("GLIBC_TUNABLES");
  for (const char* p = t; p && (p = std::strstr(p, "glibc.malloc.")); ++p) {
    if (std::strncmp(p, "glibc.malloc.hugetlb=", 21) != 0) {
      return "GLIBC_TUNABLES (glibc.malloc.*)";
    }
  }
  return nullptr;
}
#endif

} // namespace

const std::string& malloc_tuning() {
  return status();
}

void tune_malloc_from_env() {
  const char* env = std::getenv("MLX_LATTICE_MALLOC_TUNING");
  if (env && *env && std::strcmp(env, "0") != 0 && std::strcmp(env, "1") != 0) {
    throw std::invalid_argument(
        std::string("MLX_LATTICE_MALLOC_TUNING=") + env + ": expected 0 or 1");
  }
  if (env && std::strcmp(env, "0") == 0) {
    status() = "off (MLX_LATTICE_MALLOC_TUNING=0)";
    return;
  }
#if defined(__GLIBC__)
  if (const char* user = user_malloc_setting()) {
    status() = std::string("left as configured (") + user + " is set)";
    return;
  }
  // Freed blocks up to the threshold stay in the heap (no trimming at all,
  // as mallopt documents for -1), so a step reuses the previous step's pages.
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 ||
      mallopt(M_TRIM_THRESHOLD, -1) != 1) {
    status() = "not applied (mallopt refused the settings)";
    return;
  }
  status() = "glibc: blocks up to 32 MiB from the heap, freed memory kept (no trimming)";
  const std::string thp = hugetlb_tunable();
  if (!thp.empty() && thp != "0") {
    status() += "; transparent huge pages for the heap (glibc.malloc.hugetlb=" + thp + ")";
  }
#else
  status() = "not applied (not glibc)";
#endif
}

} // namespace mlx_lattice::cpu
