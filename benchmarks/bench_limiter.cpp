// The ConcurrencyLimiter's costs, against baselines measured in the same binary.
//
//   BM_Baseline_CountingSemaphore    std::counting_semaphore acquire() + release(), never
//                                    blocking (1024 slots, 1-2 threads)
//   BM_Limiter_AcquireRelease        try_acquire() + success() under StaticLimit{1024}
//   BM_Limiter_AdmitRelease          try_admit() + release(ok): the path a Pipeline takes
//   BM_Limiter_AcquireRelease_Aimd   the same under AimdLimit and GradientLimit: two clock
//   BM_Limiter_AcquireRelease_Gradient  reads and a sample per permit, windows closing
//   BM_Limiter_RejectLatency         a Pipeline behind a ConcurrencyLimiter, offered 3x its
//                                    capacity open-loop: the time from submit() to the
//                                    rejected request's completion callback (p50/p99/max
//                                    counters, microseconds)
//   BM_Limiter_RejectLatency_Standalone  the same load against the limiter alone: the time
//                                    of each rejected try_acquire()
//
// Threaded runs use UseRealTime(), so items_per_second is the aggregate throughput. What
// this does not show: contention between more threads than the machine has cores (the
// development machines have 2), and the blocking paths (acquire_for hand-over), which cost a
// mutex and a wake-up like any queue.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <semaphore>
#include <span>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/pipeline.hpp>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tailbatch::ConcurrencyLimiter;

void BM_Baseline_CountingSemaphore(benchmark::State& state) {
  static std::counting_semaphore<> semaphore(1024);
  for (auto _ : state) {
    semaphore.acquire();
    semaphore.release();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_CountingSemaphore)->Threads(1)->Threads(2)->UseRealTime();

// try_acquire() + success() on `limiter`, shared by the benchmark's threads.
template <class Algorithm>
void acquire_release(benchmark::State& state, ConcurrencyLimiter<Algorithm>& limiter) {
  for (auto _ : state) {
    // The atomic operations cannot be optimised away: no DoNotOptimize needed (the
    // semaphore baseline has none either).
    auto permit = limiter.try_acquire();
    if (permit.ok()) permit.value().success();
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Limiter_AcquireRelease(benchmark::State& state) {
  static ConcurrencyLimiter<> limiter(tailbatch::StaticLimit{1024});
  acquire_release(state, limiter);
}
BENCHMARK(BM_Limiter_AcquireRelease)->Threads(1)->Threads(2)->UseRealTime();

void BM_Limiter_AdmitRelease(benchmark::State& state) {
  static ConcurrencyLimiter<> limiter(tailbatch::StaticLimit{1024});
  for (auto _ : state) {
    auto ticket = limiter.try_admit();
    if (ticket) limiter.release(std::move(*ticket), tailbatch::Status::ok, 1ms);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Limiter_AdmitRelease)->Threads(1)->Threads(2)->UseRealTime();

void BM_Limiter_AcquireRelease_Aimd(benchmark::State& state) {
  static ConcurrencyLimiter<tailbatch::AimdLimit> limiter(
      tailbatch::AimdLimit(tailbatch::AimdLimitConfig{
          .initial_limit = 1024, .min_limit = 1024, .max_limit = 1024, .window = 10ms}));
  acquire_release(state, limiter);
}
BENCHMARK(BM_Limiter_AcquireRelease_Aimd)->Threads(1)->Threads(2)->UseRealTime();

void BM_Limiter_AcquireRelease_Gradient(benchmark::State& state) {
  static ConcurrencyLimiter<tailbatch::GradientLimit> limiter(
      tailbatch::GradientLimit(tailbatch::GradientLimitConfig{.initial_limit = 1024,
                                                         .min_limit = 1024,
                                                         .max_limit = 1024,
                                                         .window = 10ms,
                                                         .probe_concurrency = 0,
                                                         .seed = 1}));
  acquire_release(state, limiter);
}
BENCHMARK(BM_Limiter_AcquireRelease_Gradient)->Threads(1)->Threads(2)->UseRealTime();

// --- rejection latency under 3x overload -------------------------------------------------

// The service: batches of up to 8 take 2 ms on one lane, so capacity is 4000 requests/s.
// Arrivals come every 83 us (12000/s, 3x capacity), paced by the benchmark thread.
constexpr std::size_t kMaxBatch = 8;
constexpr auto kServiceTime = 2ms;
constexpr auto kArrivalGap = std::chrono::nanoseconds(83'333);
constexpr std::uint32_t kLimit = 16;        // two batches: one running, one forming
constexpr std::int64_t kArrivals = 24'000;  // 2 s of arrivals

struct LatencyReport {
  std::vector<std::int64_t> ns;
  void report(benchmark::State& state, std::int64_t offered) {
    if (ns.empty()) return;
    std::sort(ns.begin(), ns.end());
    auto at = [&](double q) {
      const auto i = static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1));
      return static_cast<double>(ns[i]) / 1e3;
    };
    state.counters["reject_p50_us"] = at(0.50);
    state.counters["reject_p99_us"] = at(0.99);
    state.counters["reject_max_us"] = static_cast<double>(ns.back()) / 1e3;
    state.counters["rejected_fraction"] =
        static_cast<double>(ns.size()) / static_cast<double>(std::max<std::int64_t>(offered, 1));
  }
};

// Waits (spinning, yielding) until t: open-loop pacing that keeps to the schedule even
// after falling behind.
void wait_until(std::chrono::steady_clock::time_point t) {
  while (std::chrono::steady_clock::now() < t) std::this_thread::yield();
}

// The timed loop of an open-loop benchmark: one arrival every kArrivalGap, each calling
// arrive(n, start) with its number (from 1) and the time it was made. Returns the number
// offered.
template <class Arrive>
std::int64_t offer_open_loop(benchmark::State& state, Arrive arrive) {
  std::int64_t offered = 0;
  auto next = std::chrono::steady_clock::now();
  for (auto _ : state) {
    wait_until(next);
    next += kArrivalGap;
    ++offered;
    arrive(offered, std::chrono::steady_clock::now());
  }
  return offered;
}

void BM_Limiter_RejectLatency(benchmark::State& state) {
  using Limiter = ConcurrencyLimiter<>;
  using Pipe = tailbatch::Pipeline<int, int, tailbatch::FixedWindow, tailbatch::HostLanes, Limiter>;
  Limiter limiter(tailbatch::StaticLimit{kLimit});
  tailbatch::HostLanes lanes(1, 1);
  Pipe pipeline(
      [](std::span<const int> in, std::span<int> out, tailbatch::HostLanes::Lane&) {
        std::this_thread::sleep_for(kServiceTime);
        std::copy(in.begin(), in.end(), out.begin());
      },
      tailbatch::FixedWindow(kMaxBatch, 1ms), Pipe::Config{}, lanes, limiter);

  LatencyReport rejected;
  rejected.ns.reserve(static_cast<std::size_t>(kArrivals));
  std::atomic<std::int64_t> admitted_done{0};
  const std::int64_t offered =
      offer_open_loop(state, [&](std::int64_t n, std::chrono::steady_clock::time_point start) {
        pipeline.submit(static_cast<int>(n),
                        [&rejected, &admitted_done, start](tailbatch::Outcome<int>&& o) {
                          if (o.status() == tailbatch::Status::rejected) {
                            // A rejected request completes inline, in the submitting
                            // (benchmark) thread.
                            rejected.ns.push_back(
                                (std::chrono::steady_clock::now() - start).count());
                          } else {
                            admitted_done.fetch_add(1, std::memory_order_relaxed);
                          }
                        });
      });
  pipeline.shutdown();  // after the timed loop: not measured
  rejected.report(state, offered);
  state.counters["admitted_per_s"] =
      benchmark::Counter(static_cast<double>(admitted_done.load()), benchmark::Counter::kIsRate);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Limiter_RejectLatency)
    ->Iterations(kArrivals)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_Limiter_RejectLatency_Standalone(benchmark::State& state) {
  // The same load on the limiter alone: 8 permits, each released by a server thread 2 ms
  // after admission, so capacity is again 4000 requests/s against 12000/s offered.
  using Limiter = ConcurrencyLimiter<>;
  Limiter limiter(tailbatch::StaticLimit{static_cast<std::uint32_t>(kMaxBatch)});
  std::mutex mu;
  std::deque<std::pair<std::chrono::steady_clock::time_point, Limiter::Permit>> held;
  std::atomic<bool> stop{false};
  std::thread server([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      std::vector<Limiter::Permit> batch;
      {
        std::lock_guard lock(mu);
        const auto now = std::chrono::steady_clock::now();
        while (!held.empty() && held.front().first <= now) {
          batch.push_back(std::move(held.front().second));
          held.pop_front();
        }
      }
      for (auto& p : batch) p.success();
      std::this_thread::sleep_for(100us);
    }
  });

  LatencyReport rejected;
  rejected.ns.reserve(static_cast<std::size_t>(kArrivals));
  const std::int64_t offered =
      offer_open_loop(state, [&](std::int64_t, std::chrono::steady_clock::time_point start) {
        auto permit = limiter.try_acquire();
        const auto end = std::chrono::steady_clock::now();
        if (permit.ok()) {
          std::lock_guard lock(mu);
          held.emplace_back(end + kServiceTime, std::move(permit).value());
        } else {
          rejected.ns.push_back((end - start).count());
        }
      });
  stop.store(true);
  server.join();
  held.clear();
  rejected.report(state, offered);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Limiter_RejectLatency_Standalone)
    ->Iterations(kArrivals)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
