#include "core/threadpool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace mlx_lattice {
namespace {

thread_local bool in_worker = false;

int default_threads() {
  if (const char* env = std::getenv("MLX_LATTICE_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) {
      return n;
    }
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

class Pool {
 public:
  Pool() : target_(default_threads()) {}
  ~Pool() {
    stop_workers();
  }

  int size() const {
    return target_;
  }

  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    stop_workers();
    target_ = std::max(1, n);
  }

  void run(int64_t n_chunks, const std::function<void(int64_t)>& chunk_fn) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    ensure_workers();
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = &chunk_fn;
      n_chunks_ = n_chunks;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work() {
    in_worker = true;
    for (;;) {
      int64_t c = next_.fetch_add(1);
      if (c >= n_chunks_) {
        break;
      }
      (*fn_)(c);
    }
    in_worker = false;
  }

  void ensure_workers() {
    int want = target_ - 1;
    while (static_cast<int>(workers_.size()) < want) {
      // The worker starts from the current generation so that it cannot miss
      // the job published right after it is created.
      workers_.emplace_back([this, g = generation_] { loop(g); });
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) {
      t.join();
    }
    workers_.clear();
    stopping_ = false;
  }

  void loop(uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) {
          return;
        }
        seen = generation_;
      }
      work();
      {
        std::lock_guard<std::mutex> lk(m_);
        --active_;
      }
      done_cv_.notify_all();
    }
  }

  int target_;
  std::mutex job_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_chunks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

Pool& pool() {
  static Pool* p = new Pool(); // leaked: workers must outlive static teardown
  return *p;
}

} // namespace

int num_threads() {
  return pool().size();
}

void set_num_threads(int n) {
  pool().resize(n);
}

void parallel_for(
    int64_t n,
    int64_t grain,
    const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) {
    return;
  }
  grain = std::max<int64_t>(grain, 1);
  int64_t n_chunks = (n + grain - 1) / grain;
  if (n_chunks == 1 || in_worker || pool().size() == 1) {
    for (int64_t c = 0; c < n_chunks; ++c) {
      fn(c * grain, std::min(n, (c + 1) * grain));
    }
    return;
  }
  pool().run(n_chunks, [&](int64_t c) {
    fn(c * grain, std::min(n, (c + 1) * grain));
  });
}

} // namespace mlx_lattice
