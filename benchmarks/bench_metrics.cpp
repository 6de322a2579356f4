// The cost of tailbatch's metrics on the paths that run per request, against the plainest
// alternative measured in the same binary: one relaxed fetch_add on one shared atomic.
//
//   BM_Counter_Inc               Counter::inc() (striped over 16 cache lines by thread id)
//   BM_Baseline_AtomicIncrement  one relaxed fetch_add on one shared std::atomic<uint64_t>
//   BM_Gauge_Add                 Gauge::add(+1) then add(-1), as an in-flight gauge is used
//   BM_Prometheus_Exposition     prometheus() on a registry shaped like one pipeline's
//                                metrics (about 30 series, 4 latency histograms of 10^4
//                                samples), /0 as Prometheus histograms (93 buckets each,
//                                the default), /1 as summaries (LatencyExport::summary)
//   BM_LatencyHistogram_Record   LatencyHistogram::record(), the baseline of ...
//   BM_WindowedHistogram_Record  WindowedHistogram::record(): a RollingHistogram's slot
//                                and the cumulative LatencyHistogram behind its buckets
//
// Threaded runs use UseRealTime(), so items_per_second is the aggregate throughput. What
// this does not show: contention between more threads than the machine has cores, and
// the cost of a cache miss when a counter is cold (a server touches it once per request).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <tailbatch/metrics.hpp>

namespace {

tailbatch::MetricsRegistry& shared_registry() {
  static tailbatch::MetricsRegistry registry;
  return registry;
}

void BM_Counter_Inc(benchmark::State& state) {
  auto& c = shared_registry().counter("bench_counter_total", "Benchmark counter.");
  for (auto _ : state) c.inc();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Counter_Inc)->Threads(1)->Threads(2)->UseRealTime();

std::atomic<std::uint64_t> baseline_counter{0};

void BM_Baseline_AtomicIncrement(benchmark::State& state) {
  for (auto _ : state) baseline_counter.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Baseline_AtomicIncrement)->Threads(1)->Threads(2)->UseRealTime();

void BM_Gauge_Add(benchmark::State& state) {
  auto& g = shared_registry().gauge("bench_in_flight", "Benchmark gauge.");
  for (auto _ : state) {
    g.add(1);
    g.add(-1);
  }
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_Gauge_Add)->Threads(1)->Threads(2)->UseRealTime();

void BM_Prometheus_Exposition(benchmark::State& state) {
  using namespace std::chrono_literals;
  tailbatch::MetricsRegistryConfig config;
  if (state.range(0) == 1) config.latency_export = tailbatch::LatencyExport::summary;
  tailbatch::MetricsRegistry r(config);
  const tailbatch::Labels p{{"pipeline", "classifier"}};
  for (const char* status : {"ok", "rejected", "deadline_exceeded", "cancelled", "failed"}) {
    r.counter("tailbatch_requests_total", "Requests by status.",
              tailbatch::join_labels(p, {{"status", status}}))
        .inc();
  }
  for (const char* reason : {"queue_full", "overloaded", "shutting_down", "too_large"}) {
    r.counter("tailbatch_rejected_total", "Rejections by reason.",
              tailbatch::join_labels(p, {{"reason", reason}}))
        .inc();
  }
  for (int size = 1; size <= 32; size *= 2) {
    r.counter("tailbatch_batches_total", "Batches by size.",
              tailbatch::join_labels(p, {{"size", std::to_string(size)}}))
        .inc();
  }
  auto depth = r.gauge_callback("tailbatch_queue_depth", "Queue depth.", p, [] { return 3.0; });
  auto in_flight = r.gauge_callback("tailbatch_in_flight", "In flight.", p, [] { return 7.0; });
  r.gauge("tailbatch_concurrency_limit", "Limit.", p).set(50);
  for (const char* name : {"tailbatch_queue_wait_seconds", "tailbatch_batch_formation_seconds",
                           "tailbatch_model_seconds", "tailbatch_end_to_end_seconds"}) {
    auto& h = r.histogram(name, "Latency.", p);
    for (int i = 0; i < 10000; ++i) h.record(std::chrono::microseconds(100 + (i * 7919) % 50000));
  }
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string text = r.prometheus();
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes"] = static_cast<double>(bytes);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Prometheus_Exposition)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// Durations that walk over a few hundred buckets, as a server's latencies do.
std::chrono::nanoseconds bench_duration(std::uint64_t i) {
  return std::chrono::nanoseconds(100000 + static_cast<std::int64_t>((i * 7919) % 5000000));
}

void BM_LatencyHistogram_Record(benchmark::State& state) {
  auto& h = shared_registry().histogram("bench_plain_seconds", "Benchmark histogram.");
  std::uint64_t i = 0;
  for (auto _ : state) h.record(bench_duration(i++));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LatencyHistogram_Record);

void BM_WindowedHistogram_Record(benchmark::State& state) {
  using namespace std::chrono_literals;
  auto& h = shared_registry().windowed_histogram("bench_windowed_seconds", "Benchmark histogram.", {}, 60s);
  std::uint64_t i = 0;
  for (auto _ : state) h.record(bench_duration(i++));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WindowedHistogram_Record);

}  // namespace

BENCHMARK_MAIN();
