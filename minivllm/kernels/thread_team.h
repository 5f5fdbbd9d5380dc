// A team of threads that stays together for a whole computation (minivllm's own).
//
// ATen's `parallel_for` starts an OpenMP region per call.  Between two regions the
// pool's threads spin for a moment (GOMP_SPINCOUNT, which minivllm keeps short so
// that other processes get the cores) and then sleep, so a region that starts
// after a few microseconds of one-thread work has to wake them: ~5-10 us each, and
// a batch-1 decode step of the default model had 150 regions.  `run_team` starts one
// region for the whole computation instead; its phases are separated by
// `Team::sync`, a barrier that spins (then yields the core, so a loaded machine
// still moves) instead of sleeping.

#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

namespace {

// A reusable barrier for `n` threads: the last to arrive starts the next generation.
class SpinBarrier {
 public:
  void reset(int n) {
    n_ = n;
    count_.store(0, std::memory_order_relaxed);
  }

  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.store(gen + 1, std::memory_order_release);
      return;
    }
    // ~4k pauses (a few hundred microseconds at most), then give the core away
    // between checks: a phase rarely takes longer, unless the machine is loaded.
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins < 4096) _mm_pause();
      else std::this_thread::yield();
    }
  }

 private:
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<int> gen_{0};
  int n_ = 1;
};

// One thread's view of the team: its index, the team's size, and the barrier.
struct Team {
  int tid = 0, size = 1;
  SpinBarrier* barrier = nullptr;

  void sync() const {
    if (size > 1) barrier->wait();
  }

  // This thread's share [lo, hi) of `count` items, split in runs of `grain`.
  std::pair<int64_t, int64_t> share(int64_t count, int64_t grain = 1) const {
    const int64_t units = (count + grain - 1) / grain;
    const int64_t per = units / size, extra = units % size;
    const int64_t lo = tid * per + std::min<int64_t>(tid, extra);
    const int64_t hi = lo + per + (tid < extra ? 1 : 0);
    return {std::min(count, lo * grain), std::min(count, hi * grain)};
  }
};

// Runs `body(team)` on ATen's intra-op threads, one OpenMP region for all of it
// (`body` must not throw: check inputs before).  Inside another parallel region,
// or with one thread, it runs on the calling thread alone.
template <typename F>
void run_team(const F& body) {
  const int threads = at::get_num_threads();
  if (threads <= 1 || omp_in_parallel()) {
    body(Team{});
    return;
  }
  SpinBarrier barrier;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    barrier.reset(omp_get_num_threads());  // the team OpenMP gave (its implicit barrier)
    body(Team{omp_get_thread_num(), omp_get_num_threads(), &barrier});
  }
}

}  // namespace
