// What the measuring instruments cost: the load generator's own work per request, and the
// simulator's CPU per simulated request.
//
//   BM_LoadGenerator_PerRequest    run_load() on a ManualClock (virtual time: no sleeping)
//                                  with an asynchronous target that completes at once:
//                                  the schedule, the bookkeeping, the timeline and the
//                                  latency histograms, per request
//   BM_Baseline_ScheduleAndRecord  the bare minimum any open-loop tester does, in the same
//                                  binary: the same arrival schedule and one
//                                  LatencyHistogram::record per request
//   BM_Simulator_FixedWindow       simulate(): 60 s of Poisson traffic at the given rate
//                                  through FixedWindow(16, 8 ms) on two lanes with the
//                                  latency field guide's L(b) = 20 ms + 3 ms x (b - 1); items are
//                                  simulated requests
//
// What this does not show: on the steady clock the generator also sleeps until each send
// time (the kernel's timer slack, tens of microseconds, lands in max_send_lag, not here),
// and a real target's completions run on other threads.
#include <benchmark/benchmark.h>

#include <tailbatch/tools/load_generator.hpp>
#include <tailbatch/tools/simulator.hpp>

#include <chrono>
#include <cstdint>

namespace {

using namespace std::chrono_literals;

constexpr double kRate = 10000.0;  // requests per (virtual) second, 1 s per iteration

void BM_LoadGenerator_PerRequest(benchmark::State& state) {
  std::uint64_t n = 0;
  for (auto _ : state) {
    tailbatch::ManualClock clock;
    tailbatch::LoadConfig o;
    o.profile = tailbatch::LoadProfile::poisson(kRate, 1s);
    auto target = [](std::uint64_t, tailbatch::LoadCompletion done) { done(tailbatch::Status::ok); };
    const tailbatch::LoadResult r = tailbatch::run_load(o, target, clock);
    n += r.due;
    benchmark::DoNotOptimize(r.p95);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(n));
}
BENCHMARK(BM_LoadGenerator_PerRequest)->Unit(benchmark::kMillisecond);

void BM_Baseline_ScheduleAndRecord(benchmark::State& state) {
  std::uint64_t n = 0;
  for (auto _ : state) {
    tailbatch::ManualClock clock;
    tailbatch::LatencyHistogram h;
    tailbatch::ArrivalSchedule s(tailbatch::LoadProfile::poisson(kRate, 1s), 42);
    const auto start = clock.now();
    while (auto t = s.next()) {
      clock.advance_to(start + *t);
      h.record(clock.now() - (start + *t));
      ++n;
    }
    benchmark::DoNotOptimize(h.snapshot().percentile(95.0));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(n));
}
BENCHMARK(BM_Baseline_ScheduleAndRecord)->Unit(benchmark::kMillisecond);

void BM_Simulator_FixedWindow(benchmark::State& state) {
  std::uint64_t n = 0;
  for (auto _ : state) {
    tailbatch::SimulationConfig c;
    c.arrivals = tailbatch::LoadProfile::poisson(static_cast<double>(state.range(0)), 60s);
    c.lanes = 2;
    c.service_time = tailbatch::LinearCost{20ms, 3ms};
    c.network = 5ms;
    const tailbatch::SimulationResult r = tailbatch::simulate(c, tailbatch::FixedWindow(16, 8ms));
    n += r.arrivals;
    benchmark::DoNotOptimize(r.p95);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(n));
}
BENCHMARK(BM_Simulator_FixedWindow)->Arg(100)->Arg(400)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
