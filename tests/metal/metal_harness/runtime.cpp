// Executor for Metal kernels compiled as C++: runs one threadgroup at a time,
// every GPU thread as a cooperative fiber (ucontext start, _setjmp/_longjmp
// switches) that yields only at barriers and simd-group collectives.
// Buffers live between PROT_NONE guard regions so that out-of-bounds accesses
// fault; the fault handler turns the fault into a launch error.
#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include "mh/rt.h"

#define MH_EXPORT extern "C" __attribute__((visibility("default")))

namespace mh {

ThreadInfo* g_thread = nullptr;

namespace {

// ---------------------------------------------------------------- launch ABI
// Mirrored by ctypes in tests/metal/metal_harness/build.py.

struct BufferDesc {
  void* host;        // copied in before and out after the launch
  uint64_t nbytes;
  const char* name;
  int32_t bound;     // 0: nothing bound at this index
  int32_t alias;     // index of an earlier buffer this one aliases, or -1
};

struct LaunchDesc {
  const char* kernel;
  BufferDesc* buffers;
  uint64_t* tg_sizes;
  int32_t n_buffers;
  int32_t n_tg_buffers;
  uint32_t groups[3];
  uint32_t threads[3];
  uint32_t grid[3];
  int32_t use_grid;  // 1: dispatch_threads(grid, threads); partial edge groups
  int32_t schedule;  // 0 forward, 1 reverse, 2 random
  int32_t strict;    // exited lanes may not skip simd-group collectives
  uint64_t seed;
  double timeout_s;
  uint32_t tg_limit;
  uint32_t max_threads;
  // results
  int32_t status;    // 0 ok, 1 error, 2 fault (pcs valid)
  int32_t n_pcs;
  uint64_t pcs[24];  // fault pc, then return addresses (offsets in this .so)
  char error[4096];
  // accounting
  uint64_t matrix_macs;  // multiply-adds done by simdgroup_multiply_accumulate
  uint64_t tg_bytes;     // the most threadgroup memory one group used
  // function constants: index and 8 bytes of value each
  int32_t n_constants;
  const int32_t* constant_index;
  const uint8_t* constant_data;
};

// ---------------------------------------------------------------- registry

struct Kernel {
  const char* host_name;
  const char* function;
  Invoke invoke;
  int max_threads;
};

std::vector<Kernel>& registry() {
  static std::vector<Kernel> r;
  return r;
}

// ---------------------------------------------------------------- memory

constexpr size_t kPage = 4096;
constexpr size_t kGuard = 1 << 20;      // PROT_NONE on both sides
constexpr size_t kStack = 256 * 1024;   // per GPU thread
constexpr size_t kAltStack = 64 * 1024; // signal handler stack

size_t round_up(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}

// [guard][pages holding the data, which ends at the last page's end][guard]
struct Guarded {
  char* base = nullptr;
  size_t len = 0;
  char* data = nullptr;
  size_t nbytes = 0;

  bool alloc(size_t n, size_t align) {
    size_t span = round_up(n, align);
    size_t pages = round_up(span, kPage);
    len = kGuard + pages + kGuard;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      base = nullptr;
      return false;
    }
    base = static_cast<char*>(p);
    if (pages && mprotect(base + kGuard, pages, PROT_READ | PROT_WRITE) != 0) {
      release();
      return false;
    }
    data = base + kGuard + pages - span;
    nbytes = n;
    // Slack in front of the data (same page, not guarded): poison it so that
    // small negative-index writes are noticed after the launch.
    std::memset(base + kGuard, 0xFF, pages - span);
    return true;
  }
  char* lo_guard_end() const { return base + kGuard; }
  char* hi_guard_begin() const { return base + len - kGuard; }
  bool slack_intact() const {
    for (char* p = lo_guard_end(); p < data; ++p) {
      if (static_cast<unsigned char>(*p) != 0xFF) {
        return false;
      }
    }
    return true;
  }
  void release() {
    if (base) {
      munmap(base, len);
    }
    base = nullptr;
  }
};

struct TgVar {
  int id;
  std::string name;
  Guarded mem;
  uint64_t generation;
};

// ---------------------------------------------------------------- fibers

enum class State : int { ready, waiting, done };

struct Fiber {
  jmp_buf ctx;
  ucontext_t uc;
  bool started;
  State state;
  Sync kind;
  const char* what;
  const char* file;
  unsigned line;
  unsigned column;
  uint32_t generation; // simd collectives passed in this group
  const unsigned char* result;
  uint64_t result_mask;
  ThreadInfo t;
  char* stack_lo;
};

struct SimdGroup {
  alignas(64) unsigned char slots[2][kSimdWidth][kSlotBytes];
  uint64_t mask[2];
};

// Fault details recorded by the signal handler.
struct Fault {
  int sig;
  int code;
  uintptr_t addr;
  uintptr_t pc;
  uint64_t err;
  int n;
  uintptr_t frames[23];
};

// ---------------------------------------------------------------- state

jmp_buf g_sched;
Fiber* g_fiber = nullptr;
LaunchDesc* g_launch = nullptr;
const Kernel* g_kernel = nullptr;
std::vector<Fiber> g_fibers;
std::vector<SimdGroup> g_simd;
std::vector<Guarded> g_buffers;     // by buffer index (aliases share)
std::vector<int> g_buffer_owner;    // index whose Guarded backs this index
std::vector<Guarded> g_tg_buffers;
std::vector<TgVar> g_tg_vars;
uint64_t g_group_generation = 0;
size_t g_tg_used = 0;       // bytes of threadgroup memory in this group
size_t g_tg_fixed = 0;      // bytes of [[threadgroup(n)]] buffers
uint32_t g_group_threads = 0;
char* g_stacks = nullptr;
size_t g_stack_count = 0;
char* g_altstack = nullptr;

volatile sig_atomic_t g_abort = 0; // 1 error message set, 2 fault recorded
volatile sig_atomic_t g_timed_out = 0;
volatile sig_atomic_t g_rt_depth = 0; // >0 while inside allocating runtime code
Fault g_fault;
char g_message[2048];

struct RtScope {
  RtScope() { g_rt_depth = g_rt_depth + 1; }
  ~RtScope() { g_rt_depth = g_rt_depth - 1; }
};

void set_message(const char* fmt, va_list ap) {
  vsnprintf(g_message, sizeof(g_message), fmt, ap);
}

void set_message(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void set_message(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_message(fmt, ap);
  va_end(ap);
}

// Leave the running fiber for good and return to the executor.
[[noreturn]] void abort_to_scheduler(int why) {
  g_abort = why;
  g_rt_depth = 0;
  _longjmp(g_sched, 1);
}

void fiber_main() {
  for (;;) {
    g_kernel->invoke();
    Fiber* f = g_fiber;
    f->state = State::done;
    if (_setjmp(f->ctx) == 0) {
      _longjmp(g_sched, 1);
    }
  }
}

void resume(Fiber* f) {
  g_fiber = f;
  g_thread = &f->t;
  if (_setjmp(g_sched) == 0) {
    if (!f->started) {
      f->started = true;
      setcontext(&f->uc);
    }
    _longjmp(f->ctx, 1);
  }
  g_fiber = nullptr;
  g_thread = nullptr;
}

// ---------------------------------------------------------------- signals

struct sigaction g_old_actions[NSIG];
const int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGVTALRM};

void on_signal(int sig, siginfo_t* si, void* raw) {
  if (sig == SIGVTALRM) {
    g_timed_out = 1;
    if (g_fiber && g_rt_depth == 0) {
      set_message("time limit exceeded (a kernel loop that never reaches a barrier?)");
      abort_to_scheduler(1);
    }
    return;
  }
  if (!g_fiber) {
    // Not kernel code: hand the signal to whoever had it before.
    sigaction(sig, &g_old_actions[sig], nullptr);
    return;
  }
  auto* uc = static_cast<ucontext_t*>(raw);
  g_fault.sig = sig;
  g_fault.code = si->si_code;
  g_fault.addr = reinterpret_cast<uintptr_t>(si->si_addr);
  g_fault.pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  g_fault.err = static_cast<uint64_t>(uc->uc_mcontext.gregs[REG_ERR]);
  g_fault.n = 0;
  // Walk frame pointers on the fiber's stack (kernels keep them).
  auto lo = reinterpret_cast<uintptr_t>(g_fiber->stack_lo);
  auto hi = lo + kStack;
  auto fp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RBP]);
  while (g_fault.n < 23 && fp >= lo && fp + 16 <= hi && (fp & 7) == 0) {
    auto* frame = reinterpret_cast<uintptr_t*>(fp);
    g_fault.frames[g_fault.n++] = frame[1];
    if (frame[0] <= fp) {
      break;
    }
    fp = frame[0];
  }
  abort_to_scheduler(2);
}

struct SignalScope {
  stack_t old_stack{};
  bool ok = true;
  SignalScope(double timeout_s) {
    if (!g_altstack) {
      g_altstack = static_cast<char*>(mmap(nullptr, kAltStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    }
    stack_t ss{};
    ss.ss_sp = g_altstack;
    ss.ss_size = kAltStack;
    sigaltstack(&ss, &old_stack);
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int s : kSignals) {
      sigaction(s, &sa, &g_old_actions[s]);
    }
    sigset_t set;
    sigemptyset(&set);
    for (int s : kSignals) {
      sigaddset(&set, s);
    }
    sigprocmask(SIG_UNBLOCK, &set, nullptr);
    itimerval t{};
    if (timeout_s > 0) {
      t.it_value.tv_sec = static_cast<time_t>(timeout_s);
      t.it_value.tv_usec = static_cast<suseconds_t>((timeout_s - t.it_value.tv_sec) * 1e6);
      t.it_interval.tv_sec = 0;
      t.it_interval.tv_usec = 200000; // keep poking until noticed
    }
    setitimer(ITIMER_VIRTUAL, &t, nullptr);
  }
  ~SignalScope() {
    itimerval t{};
    setitimer(ITIMER_VIRTUAL, &t, nullptr);
    for (int s : kSignals) {
      sigaction(s, &g_old_actions[s], nullptr);
    }
    sigaltstack(&old_stack, nullptr);
  }
};

// ---------------------------------------------------------------- helpers

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  void shuffle(std::vector<uint32_t>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      std::swap(v[i - 1], v[next() % i]);
    }
  }
};

bool same_site(const Fiber& a, const Fiber& b) {
  return a.kind == b.kind && a.line == b.line && a.column == b.column &&
      (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

std::string where(const Fiber& f) {
  char buf[512];
  if (f.state == State::done) {
    return "returned from the kernel";
  }
  snprintf(buf, sizeof(buf), "%s at %s:%u:%u", f.what, f.file, f.line, f.column);
  return buf;
}

std::string group_name(const ThreadInfo& t) {
  char buf[96];
  snprintf(buf, sizeof(buf), "threadgroup (%u,%u,%u)", t.group_pos[0], t.group_pos[1], t.group_pos[2]);
  return buf;
}

// "lanes 0-15 wait at X; lanes 16-31 returned" for the given fibers.
std::string describe(const std::vector<Fiber*>& fs, const char* unit) {
  std::string out;
  std::vector<bool> used(fs.size(), false);
  for (size_t i = 0; i < fs.size(); ++i) {
    if (used[i]) {
      continue;
    }
    std::vector<uint32_t> ids;
    for (size_t j = i; j < fs.size(); ++j) {
      bool same = fs[i]->state == State::done
          ? fs[j]->state == State::done
          : fs[j]->state != State::done && same_site(*fs[i], *fs[j]);
      if (!used[j] && same) {
        used[j] = true;
        ids.push_back(std::strcmp(unit, "lanes") == 0 ? fs[j]->t.lane : fs[j]->t.local_index);
      }
    }
    std::string list;
    for (size_t k = 0; k < ids.size(); ++k) {
      size_t e = k;
      while (e + 1 < ids.size() && ids[e + 1] == ids[e] + 1) {
        ++e;
      }
      list += (list.empty() ? "" : ",") + std::to_string(ids[k]);
      if (e > k) {
        list += "-" + std::to_string(ids[e]);
      }
      k = e;
    }
    if (!out.empty()) {
      out += "; ";
    }
    out += std::string(unit) + " " + list + (fs[i]->state == State::done ? " " : " wait at ") + where(*fs[i]);
  }
  return out;
}

const char* region_of(uintptr_t addr, std::string& desc, long long& offset) {
  auto in = [&](const Guarded& g) {
    auto b = reinterpret_cast<uintptr_t>(g.base);
    return g.base && addr >= b && addr < b + g.len;
  };
  for (size_t i = 0; i < g_buffers.size(); ++i) {
    if (in(g_buffers[i])) {
      const BufferDesc& d = g_launch->buffers[i];
      desc = "buffer(" + std::to_string(i) + ")";
      if (d.name && *d.name) {
        desc += std::string(" '") + d.name + "'";
      }
      offset = static_cast<long long>(addr - reinterpret_cast<uintptr_t>(g_buffers[i].data));
      return "buffer";
    }
  }
  for (size_t i = 0; i < g_tg_buffers.size(); ++i) {
    if (in(g_tg_buffers[i])) {
      desc = "threadgroup(" + std::to_string(i) + ") buffer";
      offset = static_cast<long long>(addr - reinterpret_cast<uintptr_t>(g_tg_buffers[i].data));
      return "buffer";
    }
  }
  for (auto& v : g_tg_vars) {
    if (in(v.mem)) {
      desc = "threadgroup array '" + v.name + "'";
      offset = static_cast<long long>(addr - reinterpret_cast<uintptr_t>(v.mem.data));
      return "buffer";
    }
  }
  auto s = reinterpret_cast<uintptr_t>(g_stacks);
  if (g_stacks && addr >= s && addr < s + g_stack_count * (kStack + kPage)) {
    return "stack";
  }
  return nullptr;
}

void format_fault(const Fiber* f) {
  const ThreadInfo& t = f->t;
  char who[256];
  snprintf(who, sizeof(who), "thread (%u,%u,%u) of threadgroup (%u,%u,%u)",
           t.local_pos[0], t.local_pos[1], t.local_pos[2],
           t.group_pos[0], t.group_pos[1], t.group_pos[2]);
  std::string desc;
  long long offset = 0;
  if (g_fault.sig == SIGSEGV || g_fault.sig == SIGBUS) {
    const char* kind = region_of(g_fault.addr, desc, offset);
    const char* rw = (g_fault.err & 2) ? "write" : "read";
    if (kind && std::strcmp(kind, "buffer") == 0) {
      size_t n = 0;
      for (size_t i = 0; i < g_buffers.size(); ++i) {
        auto b = reinterpret_cast<uintptr_t>(g_buffers[i].base);
        if (g_buffers[i].base && g_fault.addr >= b && g_fault.addr < b + g_buffers[i].len) {
          n = g_buffers[i].nbytes;
        }
      }
      for (auto& v : g_tg_vars) {
        auto b = reinterpret_cast<uintptr_t>(v.mem.base);
        if (v.mem.base && g_fault.addr >= b && g_fault.addr < b + v.mem.len) {
          n = v.mem.nbytes;
        }
      }
      for (auto& g : g_tg_buffers) {
        auto b = reinterpret_cast<uintptr_t>(g.base);
        if (g.base && g_fault.addr >= b && g_fault.addr < b + g.len) {
          n = g.nbytes;
        }
      }
      set_message("out-of-bounds %s of %s at byte offset %lld (size %zu bytes) by %s",
                  rw, desc.c_str(), offset, n, who);
    } else if (kind) {
      set_message("stack overflow in %s (the harness gives each GPU thread %zu KiB)", who, kStack / 1024);
    } else if (g_fault.addr == 0 && g_fault.code == SI_KERNEL) {
      set_message("general protection fault (a misaligned vector access, or a wild pointer) in %s", who);
    } else {
      set_message("invalid memory %s at address 0x%lx by %s", rw, static_cast<unsigned long>(g_fault.addr), who);
    }
  } else if (g_fault.sig == SIGFPE) {
    set_message("arithmetic trap (integer division by zero or overflow) in %s", who);
  } else {
    set_message("signal %d in %s", g_fault.sig, who);
  }
}

// ---------------------------------------------------------------- executor

bool prepare_buffers(LaunchDesc* L) {
  g_buffers.assign(L->n_buffers, Guarded{});
  for (int i = 0; i < L->n_buffers; ++i) {
    BufferDesc& d = L->buffers[i];
    if (!d.bound || d.alias >= 0) {
      continue;
    }
    // The data ends exactly at the guard: its alignment is the largest power of
    // two dividing its size (enough for the element type that fills it).
    if (!g_buffers[i].alloc(d.nbytes, 1)) {
      set_message("cannot map %llu bytes for buffer(%d)", static_cast<unsigned long long>(d.nbytes), i);
      return false;
    }
    if (d.nbytes) {
      std::memcpy(g_buffers[i].data, d.host, d.nbytes);
    }
  }
  g_tg_buffers.assign(L->n_tg_buffers, Guarded{});
  g_tg_fixed = 0;
  for (int i = 0; i < L->n_tg_buffers; ++i) {
    if (L->tg_sizes[i] % 16 != 0) {
      set_message("threadgroup(%d) buffer length %llu is not a multiple of 16 (Metal requires it)",
                  i, static_cast<unsigned long long>(L->tg_sizes[i]));
      return false;
    }
    if (!g_tg_buffers[i].alloc(L->tg_sizes[i], 16)) {
      set_message("cannot map threadgroup(%d) buffer", i);
      return false;
    }
    g_tg_fixed += L->tg_sizes[i];
  }
  return true;
}

void finish_buffers(LaunchDesc* L, bool check_slack) {
  for (int i = 0; i < L->n_buffers; ++i) {
    BufferDesc& d = L->buffers[i];
    if (!d.bound || d.alias >= 0) {
      continue;
    }
    if (d.nbytes) {
      std::memcpy(d.host, g_buffers[i].data, d.nbytes);
    }
    if (check_slack && !g_buffers[i].slack_intact() && g_abort == 0) {
      set_message("out-of-bounds write just before the start of buffer(%d)%s%s%s (detected after the launch)",
                  i, d.name && *d.name ? " '" : "", d.name ? d.name : "", d.name && *d.name ? "'" : "");
      g_abort = 1;
    }
  }
  for (auto& g : g_buffers) {
    g.release();
  }
  for (auto& g : g_tg_buffers) {
    g.release();
  }
  for (auto& v : g_tg_vars) {
    v.mem.release();
  }
  g_buffers.clear();
  g_tg_buffers.clear();
  g_tg_vars.clear();
}

bool prepare_fibers(uint32_t n) {
  size_t per = kStack + kPage;
  if (n > g_stack_count) {
    if (g_stacks) {
      munmap(g_stacks, g_stack_count * per);
    }
    void* p = mmap(nullptr, n * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      g_stacks = nullptr;
      g_stack_count = 0;
      set_message("cannot map fiber stacks");
      return false;
    }
    g_stacks = static_cast<char*>(p);
    g_stack_count = n;
    for (size_t i = 0; i < n; ++i) {
      mprotect(g_stacks + i * per, kPage, PROT_NONE);
    }
  }
  g_fibers.assign(n, Fiber{});
  for (uint32_t i = 0; i < n; ++i) {
    Fiber& f = g_fibers[i];
    f.stack_lo = g_stacks + i * per + kPage;
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack_lo;
    f.uc.uc_stack.ss_size = kStack;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main, 0);
    f.started = false;
  }
  return true;
}

// Releases the threads waiting at a collective or barrier, or reports an
// error. Returns false when the launch must stop.
bool resolve(uint32_t n, bool strict, bool& group_done) {
  group_done = false;
  bool progressed = false;
  uint32_t n_simd = (n + kSimdWidth - 1) / kSimdWidth;
  for (uint32_t s = 0; s < n_simd; ++s) {
    uint32_t lo = s * kSimdWidth;
    uint32_t hi = std::min<uint32_t>(n, lo + kSimdWidth);
    Fiber* first = nullptr;
    bool live = false;
    for (uint32_t i = lo; i < hi; ++i) {
      Fiber& f = g_fibers[i];
      live = live || f.state != State::done;
      if (f.state == State::waiting && f.kind == Sync::simd && !first) {
        first = &f;
      }
    }
    if (!first) {
      continue;
    }
    std::vector<Fiber*> lanes;
    bool ok = true;
    bool exited = false;
    for (uint32_t i = lo; i < hi; ++i) {
      Fiber& f = g_fibers[i];
      lanes.push_back(&f);
      if (f.state == State::done) {
        exited = true;
      } else if (!same_site(f, *first)) {
        ok = false;
      }
    }
    if (!ok || (strict && exited)) {
      set_message("divergent simd-group operation in simdgroup %u of %s: %s", s,
                  group_name(first->t).c_str(), describe(lanes, "lanes").c_str());
      return false;
    }
    uint32_t slot = first->generation & 1;
    SimdGroup& sg = g_simd[s];
    uint64_t mask = 0;
    for (uint32_t lane = 0; lane < kSimdWidth; ++lane) {
      uint32_t i = lo + lane;
      if (i < hi && g_fibers[i].state == State::waiting) {
        mask |= uint64_t(1) << lane;
        g_fibers[i].state = State::ready;
      } else {
        std::memset(sg.slots[slot][lane], 0xFF, kSlotBytes);
      }
    }
    sg.mask[slot] = mask;
    progressed = true;
  }
  if (progressed) {
    return true;
  }
  Fiber* first = nullptr;
  bool exited = false;
  bool ok = true;
  for (uint32_t i = 0; i < n; ++i) {
    Fiber& f = g_fibers[i];
    if (f.state == State::done) {
      exited = true;
    } else if (!first) {
      first = &f;
    } else if (!same_site(f, *first)) {
      ok = false;
    }
  }
  if (!first) {
    group_done = true;
    return true;
  }
  // Threads that returned from the kernel have finished: Apple GPUs release
  // them from threadgroup barriers (MLX's reductions return early and then
  // synchronise the rest), so only live threads at different sites diverge.
  // And they count a barrier per simdgroup: threads waiting at one barrier
  // while the other lanes of their simdgroups wait elsewhere pass it once
  // every simdgroup with live threads has a thread there (MLX's gemv
  // synchronises from the lanes with thrN == 0); those other lanes stay.
  (void)exited;
  if (!ok) {
    for (uint32_t i = 0; i < n; ++i) {
      Fiber& at = g_fibers[i];
      if (at.state != State::waiting || at.kind != Sync::threadgroup) {
        continue;
      }
      bool every = true;
      for (uint32_t lo = 0; lo < n && every; lo += kSimdWidth) {
        bool live = false, here = false;
        for (uint32_t j = lo; j < std::min<uint32_t>(n, lo + kSimdWidth); ++j) {
          live = live || g_fibers[j].state != State::done;
          here = here || (g_fibers[j].state == State::waiting && g_fibers[j].kind == Sync::threadgroup &&
                          same_site(g_fibers[j], at));
        }
        every = !live || here;
      }
      if (every) {
        for (uint32_t j = 0; j < n; ++j) {
          if (g_fibers[j].state == State::waiting && g_fibers[j].kind == Sync::threadgroup &&
              same_site(g_fibers[j], at)) {
            g_fibers[j].state = State::ready;
          }
        }
        return true;
      }
    }
  }
  if (!ok) {
    std::vector<Fiber*> all;
    for (uint32_t i = 0; i < n; ++i) {
      all.push_back(&g_fibers[i]);
    }
    set_message("divergent threadgroup_barrier in %s: %s", group_name(first->t).c_str(),
                describe(all, "threads").c_str());
    return false;
  }
  for (uint32_t i = 0; i < n; ++i) {
    if (g_fibers[i].state == State::waiting) {
      g_fibers[i].state = State::ready;
    }
  }
  return true;
}

bool run_group(LaunchDesc* L, const uint32_t gpos[3], Rng& rng) {
  uint32_t size[3];
  for (int d = 0; d < 3; ++d) {
    size[d] = L->threads[d];
    if (L->use_grid) {
      size[d] = std::min<uint32_t>(L->threads[d], L->grid[d] - gpos[d] * L->threads[d]);
    }
  }
  uint32_t n = size[0] * size[1] * size[2];
  uint32_t n_simd = (n + kSimdWidth - 1) / kSimdWidth;
  g_group_threads = n;
  ++g_group_generation;
  g_tg_used = g_tg_fixed;
  for (auto& g : g_tg_buffers) {
    if (g.nbytes) {
      std::memset(g.data, 0xFF, g.nbytes);
    }
  }
  for (uint32_t s = 0; s < n_simd; ++s) {
    g_simd[s].mask[0] = g_simd[s].mask[1] = 0;
  }
  for (uint32_t i = 0; i < n; ++i) {
    Fiber& f = g_fibers[i];
    ThreadInfo& t = f.t;
    t.local_pos[0] = i % size[0];
    t.local_pos[1] = (i / size[0]) % size[1];
    t.local_pos[2] = i / (size[0] * size[1]);
    for (int d = 0; d < 3; ++d) {
      t.group_pos[d] = gpos[d];
      t.group_size[d] = size[d];
      t.dispatch_size[d] = L->threads[d];
      t.groups[d] = L->groups[d];
      t.grid_size[d] = L->use_grid ? L->grid[d] : L->groups[d] * L->threads[d];
      t.grid_pos[d] = gpos[d] * L->threads[d] + t.local_pos[d];
    }
    t.local_index = i;
    t.lane = i % kSimdWidth;
    t.simd_index = i / kSimdWidth;
    t.simd_count = n_simd;
    f.state = State::ready;
    f.generation = 0;
  }
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) {
    order[i] = L->schedule == 1 ? n - 1 - i : i;
  }
  for (;;) {
    if (L->schedule == 2) {
      rng.shuffle(order);
    }
    for (uint32_t i : order) {
      Fiber* f = &g_fibers[i];
      if (f->state != State::ready) {
        continue;
      }
      resume(f);
      if (g_abort) {
        if (g_abort == 2) {
          format_fault(f);
        }
        return false;
      }
    }
    if (g_timed_out) {
      set_message("time limit exceeded");
      g_abort = 1;
      return false;
    }
    bool done = false;
    if (!resolve(n, L->strict != 0, done)) {
      g_abort = 1;
      return false;
    }
    if (done) {
      return true;
    }
  }
}

int run(LaunchDesc* L) {
  g_abort = 0;
  g_timed_out = 0;
  g_rt_depth = 0;
  g_message[0] = 0;
  L->status = 0;
  L->n_pcs = 0;
  L->error[0] = 0;
  g_kernel = nullptr;
  for (auto& k : registry()) {
    if (std::strcmp(k.host_name, L->kernel) == 0) {
      g_kernel = &k;
    }
  }
  if (!g_kernel) {
    snprintf(L->error, sizeof(L->error), "no kernel named '%s' in this source", L->kernel);
    return L->status = 1;
  }
  uint64_t tpg = uint64_t(L->threads[0]) * L->threads[1] * L->threads[2];
  if (tpg == 0) {
    snprintf(L->error, sizeof(L->error), "threads per threadgroup must be positive");
    return L->status = 1;
  }
  if (tpg > L->max_threads) {
    snprintf(L->error, sizeof(L->error), "%llu threads per threadgroup exceed the limit of %u",
             static_cast<unsigned long long>(tpg), L->max_threads);
    return L->status = 1;
  }
  if (g_kernel->max_threads > 0 && tpg > static_cast<uint64_t>(g_kernel->max_threads)) {
    snprintf(L->error, sizeof(L->error), "%llu threads per threadgroup exceed the kernel's max_total_threads_per_threadgroup(%d)",
             static_cast<unsigned long long>(tpg), g_kernel->max_threads);
    return L->status = 1;
  }
  g_launch = L;
  L->matrix_macs = 0;
  bool ok = prepare_buffers(L) && prepare_fibers(static_cast<uint32_t>(tpg));
  L->tg_bytes = g_tg_fixed;
  if (ok && g_tg_fixed > L->tg_limit) {
    set_message("threadgroup buffers take %zu bytes, over the %u-byte limit", g_tg_fixed, L->tg_limit);
    ok = false;
  }
  if (!ok) {
    g_abort = 1;
  }
  if (ok) {
    g_simd.assign((tpg + kSimdWidth - 1) / kSimdWidth, SimdGroup{});
    uint64_t ng = uint64_t(L->groups[0]) * L->groups[1] * L->groups[2];
    std::vector<uint32_t> order(ng);
    for (uint64_t i = 0; i < ng; ++i) {
      order[i] = static_cast<uint32_t>(L->schedule == 1 ? ng - 1 - i : i);
    }
    Rng rng{L->seed * 0x2545F4914F6CDD1Dull + 1};
    if (L->schedule == 2) {
      rng.shuffle(order);
    }
    SignalScope signals(L->timeout_s);
    for (uint64_t i = 0; i < ng && ok; ++i) {
      uint32_t g = order[i];
      uint32_t gpos[3] = {g % L->groups[0], (g / L->groups[0]) % L->groups[1],
                          g / (L->groups[0] * L->groups[1])};
      ok = run_group(L, gpos, rng);
    }
  }
  if (g_abort == 2) {
    L->status = 2;
    // Offsets inside this shared object, for addr2line; return addresses
    // point after the call, so step back one byte.
    Dl_info self{};
    dladdr(reinterpret_cast<void*>(&run), &self);
    auto add = [&](uintptr_t pc) {
      Dl_info info{};
      if (L->n_pcs < 24 && dladdr(reinterpret_cast<void*>(pc), &info) && info.dli_fbase == self.dli_fbase) {
        L->pcs[L->n_pcs++] = pc - reinterpret_cast<uintptr_t>(self.dli_fbase);
      }
    };
    add(g_fault.pc);
    for (int i = 0; i < g_fault.n; ++i) {
      add(g_fault.frames[i] - 1);
    }
  }
  finish_buffers(L, g_abort == 0);
  g_fibers.clear();
  g_launch = nullptr;
  if (g_abort && L->status == 0) {
    L->status = 1;
  }
  if (L->status) {
    snprintf(L->error, sizeof(L->error), "%s", g_message);
  }
  return L->status;
}

} // namespace

// ---------------------------------------------------------------- shim API

void rt_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_message(fmt, ap);
  va_end(ap);
  if (g_fiber) {
    abort_to_scheduler(1);
  }
  std::fprintf(stderr, "metal harness: %s\n", g_message);
  std::abort();
}

void rt_sync(Sync kind, const char* what, const char* file, unsigned line, unsigned column) {
  Fiber* f = g_fiber;
  if (!f) {
    rt_fail("%s called outside a kernel", what);
  }
  f->state = State::waiting;
  f->kind = kind;
  f->what = what;
  f->file = file;
  f->line = line;
  f->column = column;
  if (_setjmp(f->ctx) == 0) {
    _longjmp(g_sched, 1);
  }
  f = g_fiber;
  if (kind == Sync::simd) {
    uint32_t slot = f->generation & 1;
    f->result = &g_simd[f->t.simd_index].slots[slot][0][0];
    f->result_mask = g_simd[f->t.simd_index].mask[slot];
    ++f->generation;
  }
  if (g_timed_out && g_rt_depth == 0) {
    set_message("time limit exceeded");
    abort_to_scheduler(1);
  }
}

void* rt_simd_slot() {
  Fiber* f = g_fiber;
  return &g_simd[f->t.simd_index].slots[f->generation & 1][f->t.lane][0];
}

const unsigned char* rt_simd_result(uint64_t* active_mask) {
  *active_mask = g_fiber->result_mask;
  return g_fiber->result;
}

void rt_count_matrix_macs(uint64_t n) {
  g_launch->matrix_macs += n;  // fibers share one OS thread: no race
}

void* rt_tg_var(int id, size_t bytes, size_t align, const char* name) {
  RtScope scope;
  TgVar* v = nullptr;
  for (auto& x : g_tg_vars) {
    if (x.id == id) {
      v = &x;
    }
  }
  if (!v) {
    g_tg_vars.push_back(TgVar{id, name, Guarded{}, 0});
    v = &g_tg_vars.back();
    if (!v->mem.alloc(bytes, align)) {
      rt_fail("cannot map threadgroup array '%s'", name);
    }
  }
  if (v->generation != g_group_generation) {
    v->generation = g_group_generation;
    std::memset(v->mem.data, 0xFF, bytes);
    g_tg_used += round_up(bytes, 16);
    g_launch->tg_bytes = std::max<uint64_t>(g_launch->tg_bytes, g_tg_used);
    if (g_tg_used > g_launch->tg_limit) {
      rt_fail("threadgroup memory of %zu bytes (reached at '%s', %zu bytes) exceeds the %u-byte limit",
              g_tg_used, name, bytes, g_launch->tg_limit);
    }
  }
  return v->mem.data;
}

void* rt_buffer(int index, size_t min_bytes, const char* param) {
  LaunchDesc* L = g_launch;
  if (index < 0 || index >= L->n_buffers || !L->buffers[index].bound) {
    rt_fail("kernel parameter '%s' reads buffer(%d), which is not bound", param, index);
  }
  int owner = L->buffers[index].alias >= 0 ? L->buffers[index].alias : index;
  if (L->buffers[index].nbytes < min_bytes) {
    rt_fail("kernel parameter '%s' needs %zu bytes but buffer(%d) has %llu", param, min_bytes, index,
            static_cast<unsigned long long>(L->buffers[index].nbytes));
  }
  return g_buffers[owner].data;
}

void* rt_tg_buffer(int index, const char* param) {
  if (index < 0 || index >= static_cast<int>(g_tg_buffers.size())) {
    rt_fail("kernel parameter '%s' uses threadgroup(%d) memory, but no length was set for it", param, index);
  }
  return g_tg_buffers[index].data;
}

void* rt_absent_buffer() {
  static void* page = [] {
    void* p = mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }();
  return page;
}

bool rt_function_constant(int index, void* out, size_t size) {
  const LaunchDesc* L = g_launch;
  for (int i = 0; L && i < L->n_constants; ++i) {
    if (L->constant_index[i] == index) {
      std::memcpy(out, L->constant_data + 8 * i, size < 8 ? size : 8);
      return true;
    }
  }
  return false;
}

void rt_register(const char* host_name, const char* function, Invoke invoke, int max_threads) {
  registry().push_back(Kernel{host_name, function, invoke, max_threads});
}

} // namespace mh

// ---------------------------------------------------------------- C API

MH_EXPORT int mh_abi_version() {
  return 1;
}

MH_EXPORT int mh_kernel_count() {
  return static_cast<int>(mh::registry().size());
}

MH_EXPORT const char* mh_kernel_name(int i) {
  return mh::registry()[i].host_name;
}

MH_EXPORT const char* mh_kernel_function(int i) {
  return mh::registry()[i].function;
}

MH_EXPORT int mh_run(void* launch) {
  return mh::run(static_cast<mh::LaunchDesc*>(launch));
}
