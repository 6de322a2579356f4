// The harness the throughput benchmarks share: a workload is one "round" (every producer
// submits its share, every request completes), run a few times untimed to reach a steady
// state, then once per benchmark iteration; the counters report items per second and
// nanoseconds per item in real time. For benchmarks/bench_*.cpp only.
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace tailbatch::bench {

// Untimed rounds before the timed ones: every batcher is measured in its steady state
// (threads started, queues and pools grown).
inline constexpr int kWarmupRounds = 3;

// Runs round() kWarmupRounds times untimed, then once per iteration of `state`. When round
// returns a number, returns the sum over the timed rounds (0 otherwise).
template <class Round>
double run_rounds(benchmark::State& state, Round&& round) {
  using Result = std::invoke_result_t<Round&>;
  for (int i = 0; i < kWarmupRounds; ++i) (void)round();
  double sum = 0;
  for (auto _ : state) {
    if constexpr (std::is_arithmetic_v<Result>) {
      sum += static_cast<double>(round());
    } else {
      round();
    }
  }
  return sum;
}

// The mean of a per-round sum over the timed rounds.
inline double per_round(const benchmark::State& state, double sum) {
  const auto n = state.iterations() > 0 ? state.iterations() : benchmark::IterationCount{1};
  return sum / static_cast<double>(n);
}

// items_per_second and `counter` (ns per item, real time) for `items_per_round` items in
// each timed round.
inline void set_item_counters(benchmark::State& state, std::uint64_t items_per_round,
                              const char* counter = "ns_per_request") {
  const auto items = static_cast<double>(state.iterations()) * static_cast<double>(items_per_round);
  state.SetItemsProcessed(static_cast<std::int64_t>(items));
  state.counters[counter] =
      benchmark::Counter(items, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Counts completions; the one that reaches `total` wakes the thread waiting in wait_all().
class Completions {
 public:
  explicit Completions(std::uint64_t total) noexcept : total_(total) {}
  void reset() noexcept { count_.store(0, std::memory_order_relaxed); }
  void arrive() noexcept {
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == total_) count_.notify_all();
  }
  void wait_all() noexcept {
    for (auto v = count_.load(std::memory_order_acquire); v < total_;
         v = count_.load(std::memory_order_acquire)) {
      count_.wait(v, std::memory_order_acquire);
    }
  }

 private:
  std::uint64_t total_;
  std::atomic<std::uint64_t> count_{0};
};

// `producers` threads; thread t calls produce(t, i) for i in [0, per_producer), then
// finish(t) (e.g. to wait for its own futures); then all are joined.
template <class Produce, class Finish>
void run_producers(int producers, int per_producer, Produce&& produce, Finish&& finish) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(producers));
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&produce, &finish, t, per_producer] {
      for (int i = 0; i < per_producer; ++i) produce(t, i);
      finish(t);
    });
  }
  for (auto& th : threads) th.join();
}

template <class Produce>
void run_producers(int producers, int per_producer, Produce&& produce) {
  run_producers(producers, per_producer, std::forward<Produce>(produce), [](int) {});
}

}  // namespace tailbatch::bench
