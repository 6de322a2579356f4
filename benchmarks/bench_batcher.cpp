// The Pipeline's overhead per request, against batchers written here and measured in the
// same run:
//   BM_Pipeline_NoopModel      4 producers submit with callback completion into a
//                              Pipeline (FixedWindow max_batch 32, one host lane), a model
//                              that does nothing; items_per_second in real time, and
//                              queued_at_end: requests still queued when the producers
//                              had submitted all (mean over rounds).
//   BM_Pipeline_NoopModel_Options   the same, every request with a deadline and a
//                              priority (the three take turns).
//   BM_Pipeline_NoopModel_Futures   the same with a future per request instead of a
//                              callback: the naive baseline's completion style.
//   BM_Baseline_NaiveBatcher   the same workload on a naive batcher: std::mutex +
//                              std::deque + std::condition_variable, one std::promise per
//                              request, a notify per submit.
//   BM_Baseline_SwapBatcher    the same workload on a minimal swap-the-queue batcher with
//                              callback completion and none of the Pipeline's features
//                              (no deadlines, priorities, cancellation, admission,
//                              outcomes, shutdown): the floor of this design.
//   BM_Window_DispatchLag      the lag between a window's expiry and the model call, for
//                              2 ms and 5 ms windows: p50 and p99 counters in microseconds.
//   BM_Clock_SteadyNow         one std::chrono::steady_clock::now(): what an arrival stamp
//                              costs a submit that reads the clock (docs/pipeline.md,
//                              "Threads"); a baseline for the cycle-counter stamps.
//
// What this does not show: a real model's cost (the batcher's overhead matters only
// relative to it), behaviour across NUMA nodes, or latency under open-loop load (see
// tailbatch-load for that).
#include <tailbatch/pipeline.hpp>

#include <benchmark/benchmark.h>

#include "round_harness.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

constexpr int kProducers = 4;
constexpr int kPerProducer = 50000;
constexpr std::size_t kMaxBatch = 32;
constexpr std::uint64_t kTotal = std::uint64_t{kProducers} * kPerProducer;

using bench::Completions;
using bench::per_round;
using bench::run_rounds;
using bench::set_item_counters;

// Every producer submits its share with `submit(x)`.
template <class Submit>
void run_producers(Submit&& submit) {
  bench::run_producers(kProducers, kPerProducer, [&submit](int t, int i) { submit(t * kPerProducer + i); });
}

// Every producer submits its share with `submit(x)`, keeping the futures, then waits for them.
template <class Future, class Submit>
void run_producers_with_futures(std::vector<std::vector<Future>>& futures, Submit&& submit) {
  bench::run_producers(
      kProducers, kPerProducer,
      [&](int t, int i) {
        auto& mine = futures[static_cast<std::size_t>(t)];
        if (i == 0) mine.clear();
        mine.push_back(submit(t * kPerProducer + i));
      },
      [&](int t) {
        for (auto& f : futures[static_cast<std::size_t>(t)]) benchmark::DoNotOptimize(f.get());
      });
}

void BM_Pipeline_NoopModel(benchmark::State& state) {
  Completions done(kTotal);
  Pipeline<int, int> p([](std::span<const int>, std::span<int>, HostLane&) {}, FixedWindow{kMaxBatch, 50us},
                       {.queue_capacity = 1 << 20});
  auto round = [&] {
    done.reset();
    run_producers([&](int x) { p.submit(x, [&done](Outcome<int>&&) noexcept { done.arrive(); }); });
    const auto queued = static_cast<double>(p.queued_approx());  // how far the producers got ahead
    done.wait_all();
    return queued;
  };
  state.counters["queued_at_end"] = per_round(state, run_rounds(state, round));
  p.shutdown();  // stats are exact once shut down
  const PipelineStats s = p.stats();
  if (s.count(Status::ok) != s.submitted) state.SkipWithError("some requests did not complete ok");
  set_item_counters(state, kTotal);
  state.counters["mean_batch"] = static_cast<double>(s.batched_requests) / static_cast<double>(std::max<std::uint64_t>(1, s.batches()));
}
BENCHMARK(BM_Pipeline_NoopModel)->UseRealTime()->Unit(benchmark::kMillisecond);

// As BM_Pipeline_NoopModel, with per-request options in use: every request has a deadline
// (a 10 s timeout, so none expires) and the three priorities take turns.
void BM_Pipeline_NoopModel_Options(benchmark::State& state) {
  Completions done(kTotal);
  Pipeline<int, int> p([](std::span<const int>, std::span<int>, HostLane&) {}, FixedWindow{kMaxBatch, 50us},
                       {.queue_capacity = 1 << 20});
  auto round = [&] {
    done.reset();
    run_producers([&](int x) {
      p.submit(x, {.timeout = 10s, .priority = static_cast<Priority>(x % 3)},
               [&done](Outcome<int>&&) noexcept { done.arrive(); });
    });
    done.wait_all();
  };
  run_rounds(state, round);
  p.shutdown();
  const PipelineStats s = p.stats();
  if (s.count(Status::ok) != s.submitted) state.SkipWithError("some requests did not complete ok");
  set_item_counters(state, kTotal);
}
BENCHMARK(BM_Pipeline_NoopModel_Options)->UseRealTime()->Unit(benchmark::kMillisecond);

// The naive baseline's completion style on the Pipeline: one future per request, waited
// on by its producer after it has submitted all of its own.
void BM_Pipeline_NoopModel_Futures(benchmark::State& state) {
  Pipeline<int, int> p([](std::span<const int>, std::span<int>, HostLane&) {}, FixedWindow{kMaxBatch, 50us},
                       {.queue_capacity = 1 << 20});
  std::vector<std::vector<std::future<Outcome<int>>>> futures(kProducers);
  for (auto& f : futures) f.reserve(kPerProducer);
  run_rounds(state, [&] { run_producers_with_futures(futures, [&p](int x) { return p.submit(x); }); });
  set_item_counters(state, kTotal);
}
BENCHMARK(BM_Pipeline_NoopModel_Futures)->UseRealTime()->Unit(benchmark::kMillisecond);

// The naive batcher: what one writes first.
class NaiveBatcher {
 public:
  NaiveBatcher() : worker_([this] { run(); }) {}
  ~NaiveBatcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  std::future<int> submit(int x) {
    std::promise<int> p;
    std::future<int> f = p.get_future();
    {
      std::lock_guard lock(mu_);
      q_.push_back(Item{x, std::move(p)});
    }
    cv_.notify_one();
    return f;
  }

 private:
  struct Item {
    int x;
    std::promise<int> p;
  };
  void run() {
    std::vector<Item> batch;
    std::vector<int> in;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
        if (stop_ && q_.empty()) return;
        while (!q_.empty() && batch.size() < kMaxBatch) {
          batch.push_back(std::move(q_.front()));
          q_.pop_front();
        }
      }
      in.clear();
      for (auto& it : batch) in.push_back(it.x);
      benchmark::DoNotOptimize(in.data());  // the no-op model
      for (auto& it : batch) it.p.set_value(it.x);
      batch.clear();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  bool stop_ = false;
  std::thread worker_;
};

void BM_Baseline_NaiveBatcher(benchmark::State& state) {
  NaiveBatcher b;
  std::vector<std::vector<std::future<int>>> futures(kProducers);
  for (auto& f : futures) f.reserve(kPerProducer);
  run_rounds(state, [&] { run_producers_with_futures(futures, [&b](int x) { return b.submit(x); }); });
  set_item_counters(state, kTotal);
}
BENCHMARK(BM_Baseline_NaiveBatcher)->UseRealTime()->Unit(benchmark::kMillisecond);

// A minimal swap-the-queue batcher with callback completion: producers append to a vector
// under a mutex and wake the worker only when it sleeps; the worker swaps the whole
// vector out and runs it in slices of kMaxBatch.
class SwapBatcher {
 public:
  using Callback = void (*)(void*, int);
  SwapBatcher() : worker_([this] { run(); }) {}
  ~SwapBatcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void submit(int x, Callback cb, void* ctx) {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      q_.push_back(Item{x, cb, ctx});
      wake = sleeping_;
    }
    if (wake) cv_.notify_one();
  }

 private:
  struct Item {
    int x;
    Callback cb;
    void* ctx;
  };
  void run() {
    std::vector<Item> mine;
    std::vector<int> in;
    std::vector<int> out;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        sleeping_ = true;
        cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
        sleeping_ = false;
        if (stop_ && q_.empty()) return;
        mine.swap(q_);
      }
      for (std::size_t at = 0; at < mine.size(); at += kMaxBatch) {
        const std::size_t n = std::min(kMaxBatch, mine.size() - at);
        in.clear();
        for (std::size_t i = 0; i < n; ++i) in.push_back(mine[at + i].x);
        out.assign(n, 0);
        benchmark::DoNotOptimize(in.data());  // the no-op model
        for (std::size_t i = 0; i < n; ++i) mine[at + i].cb(mine[at + i].ctx, out[i]);
      }
      mine.clear();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> q_;
  bool sleeping_ = false;
  bool stop_ = false;
  std::thread worker_;
};

void BM_Baseline_SwapBatcher(benchmark::State& state) {
  Completions done(kTotal);
  SwapBatcher b;
  auto round = [&] {
    done.reset();
    run_producers([&](int x) { b.submit(x, [](void* d, int) { static_cast<Completions*>(d)->arrive(); }, &done); });
    done.wait_all();
  };
  run_rounds(state, round);
  set_item_counters(state, kTotal);
}
BENCHMARK(BM_Baseline_SwapBatcher)->UseRealTime()->Unit(benchmark::kMillisecond);

// One request at a time: the window (max_wait) expires with the batch unfilled, and the
// lag is the model call's start minus (submit time + max_wait). Submit time is read
// before submit, so the lag is, if anything, overstated.
void BM_Window_DispatchLag(benchmark::State& state) {
  const auto window = std::chrono::milliseconds(state.range(0));
  std::atomic<std::int64_t> called_at{0};
  Pipeline<int, int> p(
      [&](std::span<const int>, std::span<int>, HostLane&) {
        called_at.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_release);
      },
      FixedWindow{kMaxBatch, window});
  std::vector<double> lags_us;
  lags_us.reserve(static_cast<std::size_t>(state.max_iterations));
  for (auto _ : state) {
    const auto submitted = std::chrono::steady_clock::now();
    auto f = p.submit(1);
    f.wait();
    const auto called = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(called_at.load()));
    lags_us.push_back(std::chrono::duration<double, std::micro>(called - (submitted + window)).count());
  }
  std::sort(lags_us.begin(), lags_us.end());
  auto pct = [&](double q) {
    if (lags_us.empty()) return 0.0;
    const auto i = static_cast<std::size_t>(q * static_cast<double>(lags_us.size() - 1) + 0.5);
    return lags_us[std::min(i, lags_us.size() - 1)];
  };
  state.counters["lag_p50_us"] = pct(0.50);
  state.counters["lag_p99_us"] = pct(0.99);
  state.counters["lag_max_us"] = lags_us.empty() ? 0.0 : lags_us.back();
}
BENCHMARK(BM_Window_DispatchLag)->Arg(2)->Arg(5)->Iterations(300)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

// One steady-clock read, single-threaded: the vDSO's clock_gettime (on a KVM guest, the
// kvm-clock page).
void BM_Clock_SteadyNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_Clock_SteadyNow);

BENCHMARK_MAIN();
