// bench_histogram: what recording into a LatencyHistogram costs, against one relaxed
// fetch_add on one shared counter measured in the same binary and run.
//
//   BM_Histogram_Record/threads:N          record() inlined into the loop; N threads share one
//                                          histogram (each records into its own shard)
//   BM_Baseline_AtomicIncrement/threads:N  counter.fetch_add(1, relaxed), N threads, one counter
//   BM_Histogram_Percentiles               p50 + p95 + p99 of 10^6 recorded values, one call
//                                          on a snapshot (the snapshot is taken outside)
//   BM_Histogram_Snapshot                  snapshot() of a histogram with one shard
//   BM_Histogram_RecordCall*               one record() per non-inlined call: from this
//                                          executable, and from a -fPIC shared library with the
//                                          default TLS model and with initial-exec, to show
//                                          what thread_local costs inside a shared library
//
// Counters: shard_bytes = heap bytes of one thread's shard at the default options.
// What this does not show: recording into a cold cache (every value here comes from a
// 4096-entry table in L1), or the first record of a thread (it allocates a shard).
#include <benchmark/benchmark.h>

#include <tailbatch/latency_histogram.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "histogram_shared_recorder.hpp"

namespace {

using tailbatch::LatencyHistogram;
using ns = std::chrono::nanoseconds;

constexpr std::size_t table_size = 4096;

// Simulated request latencies: lognormal, median 2 ms, with a slow tail.
const std::array<ns, table_size>& latencies() {
  static const auto table = [] {
    std::array<ns, table_size> t{};
    std::mt19937_64 rng(12345);
    std::lognormal_distribution<double> d(std::log(2e6), 1.0);
    for (auto& v : t) v = ns(static_cast<std::int64_t>(d(rng)));
    return t;
  }();
  return table;
}

LatencyHistogram& shared_histogram() {
  static LatencyHistogram h;
  return h;
}

void BM_Histogram_Record(benchmark::State& state) {
  LatencyHistogram& h = shared_histogram();
  const auto& values = latencies();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  for (auto _ : state) {
    h.record(values[i++ % table_size]);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["shard_bytes"] =
      benchmark::Counter(static_cast<double>(h.shard_bytes()), benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_Histogram_Record)->Threads(1)->Threads(2)->UseRealTime();

std::atomic<std::uint64_t> shared_counter{0};

void BM_Baseline_AtomicIncrement(benchmark::State& state) {
  for (auto _ : state) {
    shared_counter.fetch_add(1, std::memory_order_relaxed);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(BM_Baseline_AtomicIncrement)->Threads(1)->Threads(2)->UseRealTime();

void BM_Histogram_Percentiles(benchmark::State& state) {
  LatencyHistogram h;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> d(std::log(2e6), 1.0);
  for (int i = 0; i < 1'000'000; ++i) h.record(ns(static_cast<std::int64_t>(d(rng))));
  const auto snapshot = h.snapshot();
  const std::array<double, 3> ps = {50.0, 95.0, 99.0};
  std::array<ns, 3> out{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(ps.data());
    snapshot.percentiles(ps, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["p99_ms"] = static_cast<double>(out[2].count()) / 1e6;
  state.counters["shard_bytes"] = static_cast<double>(h.shard_bytes());
}
BENCHMARK(BM_Histogram_Percentiles);

void BM_Histogram_Snapshot(benchmark::State& state) {
  LatencyHistogram h;
  for (const auto v : latencies()) h.record(v);
  for (auto _ : state) {
    auto s = h.snapshot();
    benchmark::DoNotOptimize(s);
  }
  state.counters["buckets"] = static_cast<double>(h.bucket_count());
}
BENCHMARK(BM_Histogram_Snapshot);

[[gnu::noinline]] void record_here(LatencyHistogram& h, ns v) noexcept { h.record(v); }

template <void (*Record)(LatencyHistogram&, ns) noexcept>
void record_call(benchmark::State& state) {
  static LatencyHistogram h;
  const auto& values = latencies();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 977;
  for (auto _ : state) {
    Record(h, values[i++ % table_size]);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_Histogram_RecordCall_Executable(benchmark::State& state) { record_call<record_here>(state); }
void BM_Histogram_RecordCall_SharedLib(benchmark::State& state) { record_call<tailbatch_bench_record_pic>(state); }
void BM_Histogram_RecordCall_SharedLibInitialExec(benchmark::State& state) {
  record_call<tailbatch_bench_record_pic_initial_exec>(state);
}
BENCHMARK(BM_Histogram_RecordCall_Executable)->UseRealTime();
BENCHMARK(BM_Histogram_RecordCall_SharedLib)->UseRealTime();
BENCHMARK(BM_Histogram_RecordCall_SharedLibInitialExec)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
