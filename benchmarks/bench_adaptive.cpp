// The cost of AdaptiveWindow's feedback path (on_batch_executed, which the Pipeline calls
// on a lane's thread after each model call and after the batch's completions), against
// baselines measured in the same run:
//   BM_AdaptiveWindow_Feedback/0   a steady load: the plan for its rate is in force, a
//                                  call refits the cost table and plans nothing.
//   BM_AdaptiveWindow_Feedback/1   a load that keeps moving (the rate walks up through
//                                  more rate buckets than the plan cache holds, then
//                                  starts again): a plan is in the making at almost every
//                                  call, which advances it by at most one slice of
//                                  simulated requests (1024-8192, sized to the
//                                  reported batch's model time). Counters: max_us (the slowest call
//                                  seen), calls_per_plan.
//   BM_AdaptiveWindow_FullPlan     the baseline: the whole (window, size) grid simulated
//                                  in one call, as the policy planned before plans were
//                                  sliced (each candidate through predict(), the same
//                                  simulation); what one call cost then.
//   BM_FixedWindow_Decide          the baseline's floor: FixedWindow's close decision on a
//                                  16-request view.
//   BM_AdaptiveWindow_Decide       AdaptiveWindow's close decision on the same view,
//                                  no lane idle (the plan's rule alone).
//   BM_AdaptiveWindow_DecideIdle/R one arrival at R requests/s through decide() with the
//                                  lanes idle, as a Pipeline asks when a request comes:
//                                  the plan's rule, and the lookahead (two choices played
//                                  out) wherever that rule would wait or send fewer than
//                                  all queued. Counter: lookahead_closes_per_call (the
//                                  share of calls whose close the lookahead chose).
//   BM_RealClock_AddedPerBatch/P   a real Pipeline on the real clock (one host lane, a
//                                  model that spins 250 us + 25 us x b, an open-loop
//                                  submitter at 1500 requests/s for 2 s), with the
//                                  FixedWindow (P = 0, 0.5 ms window, max batch 32) or the
//                                  AdaptiveWindow (P = 1, p95 target 50 ms, max batch 32):
//                                  the policy's own time per executed batch, timed around
//                                  each call. Counters: added_p99_us and added_mean_us (the
//                                  decide() calls that led to a batch plus its
//                                  on_batch_executed(), per batch), feedback_p99_us,
//                                  decide_calls_per_batch, policy_share (the policy's time
//                                  over the model's).
// The policy learns the latency guide's Example 1 model (L(b) = 20 ms + 3 ms x (b - 1), 2
// lanes, SLO p95 150 ms, max batch 64) from feedback, with arrivals fed through decide()
// on a ManualClock (outside the timed region where marked).
//
// What this does not show: contention on the policy's lock when several lanes report at
// once, or the cost of the decide() calls that count arrivals (see BM_AdaptiveWindow_Decide
// for one).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <mutex>
#include <string>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using namespace tailbatch;

namespace {

const LinearCost example1{20ms, 3ms};

AdaptiveWindowConfig example1_config() {
  AdaptiveWindowConfig c;
  c.slo_p95 = 150ms;
  c.max_batch = 64;
  return c;
}

BatchFeedback feedback(std::size_t size, BatchTime started) {
  BatchFeedback f;
  f.size = size;
  f.padded_size = size;
  f.model_time = example1(size);
  f.started = started;
  return f;
}

// Arrivals at `rate` through decide(): each arrival is shown in a view with the queue, and
// whatever decide() closes leaves it, as in a Pipeline with an idle lane.
struct Driver {
  AdaptiveWindow policy{example1_config()};
  ManualClock clock{};
  std::vector<BatchCandidate> queue{};
  double carry = 0.0;

  void arrive(double rate, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      carry += 1.0 / rate;
      const auto gap =
          std::chrono::duration_cast<BatchDuration>(std::chrono::duration<double>(carry));
      carry -= std::chrono::duration<double>(gap).count();
      clock.advance(gap);
      queue.push_back(BatchCandidate{clock.now(), BatchTime::max(), 1, Priority::normal});
      BatchView v{std::span<const BatchCandidate>(queue), queue.size(), clock.now(), false};
      v.lanes = 2;
      v.idle_lanes = 2;
      const BatchDecision d = policy.decide(v);
      queue.erase(queue.begin(),
                  queue.begin() + static_cast<std::ptrdiff_t>(std::min(d.count, queue.size())));
    }
  }

  // Teaches every size, then settles on `rate` until its plan is in force.
  void warm(double rate) {
    for (int k = 0; k < 4; ++k)
      for (std::size_t b = 1; b <= 64; ++b) policy.on_batch_executed(feedback(b, clock.now()));
    for (int i = 0; i < 400; ++i) {
      arrive(rate, 16);
      policy.on_batch_executed(feedback(16, clock.now()));
    }
  }
};

void BM_AdaptiveWindow_Feedback(benchmark::State& state) {
  const bool moving = state.range(0) != 0;
  Driver d;
  d.warm(300.0);
  double rate = 50.0;
  std::size_t calls = 0, plans = 0;
  double last_plan_rate = d.policy.plan().rate_rps;
  double max_us = 0.0;
  for (auto _ : state) {
    state.PauseTiming();
    if (moving) {
      // Up by 10 % every 25 calls, 50 -> 480 requests/s, then again: about 60 rate
      // buckets per cycle against a cache of 32 plans.
      if (++calls % 25 == 0) rate = rate * 1.1 > 480.0 ? 50.0 : rate * 1.1;
      d.arrive(rate, 8);
    } else {
      d.arrive(300.0, 16);
    }
    const BatchFeedback f = feedback(moving ? 8 : 16, d.clock.now());
    state.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    d.policy.on_batch_executed(f);
    const auto t1 = std::chrono::steady_clock::now();
    state.PauseTiming();
    max_us = std::max(max_us, std::chrono::duration<double, std::micro>(t1 - t0).count());
    const double r = d.policy.plan().rate_rps;
    if (r != last_plan_rate) {
      ++plans;
      last_plan_rate = r;
    }
    state.ResumeTiming();
  }
  state.counters["max_us"] = max_us;
  state.counters["plans"] = static_cast<double>(plans);
  state.counters["calls_per_plan"] =
      plans > 0 ? static_cast<double>(state.iterations()) / static_cast<double>(plans) : 0.0;
}
BENCHMARK(BM_AdaptiveWindow_Feedback)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_AdaptiveWindow_FullPlan(benchmark::State& state) {
  Driver d;
  d.warm(300.0);
  const double c1 = d.policy.estimate_seconds(1);
  std::vector<std::size_t> sizes;
  for (std::size_t p = 1; p <= 64; p *= 2) {
    sizes.push_back(p);
    if (p >= 2 && p + p / 2 <= 64) sizes.push_back(p + p / 2);
  }
  for (auto _ : state) {
    double best = 1e300;
    for (const double wf : detail::AdaptiveState::window_grid) {
      for (const std::size_t b : sizes) {
        const auto w =
            std::chrono::duration_cast<BatchDuration>(std::chrono::duration<double>(wf * c1));
        const AdaptivePlan p = d.policy.predict(300.0, 2, b, w);
        best = std::min(best, p.predicted_p95_s);
      }
    }
    benchmark::DoNotOptimize(best);
  }
  state.counters["candidates"] =
      static_cast<double>(sizes.size() * detail::AdaptiveState::window_grid.size());
}
BENCHMARK(BM_AdaptiveWindow_FullPlan)->Unit(benchmark::kMicrosecond);

std::vector<BatchCandidate> sixteen(BatchTime now) {
  std::vector<BatchCandidate> q;
  for (int i = 0; i < 16; ++i)
    q.push_back(BatchCandidate{now - 1ms * (16 - i), BatchTime::max(), 1, Priority::normal});
  return q;
}

void BM_FixedWindow_Decide(benchmark::State& state) {
  const FixedWindow policy(32, 5ms);
  const BatchTime now = ManualClock::start() + 1s;
  const auto q = sixteen(now);
  BatchView v{std::span<const BatchCandidate>(q), q.size(), now, false};
  for (auto _ : state) benchmark::DoNotOptimize(policy.decide(v));
}
BENCHMARK(BM_FixedWindow_Decide);

void BM_AdaptiveWindow_Decide(benchmark::State& state) {
  Driver d;
  d.warm(300.0);
  const BatchTime now = d.clock.now();
  const auto q = sixteen(now);
  BatchView v{std::span<const BatchCandidate>(q), q.size(), now, false};
  v.lanes = 2;
  v.idle_lanes = 0;  // decided, not acted on: the state does not move between iterations
  for (auto _ : state) benchmark::DoNotOptimize(d.policy.decide(v));
}
BENCHMARK(BM_AdaptiveWindow_Decide);

void BM_AdaptiveWindow_DecideIdle(benchmark::State& state) {
  MetricsRegistry registry;
  AdaptiveWindowConfig c = example1_config();
  c.metrics = &registry;
  Driver d{AdaptiveWindow(c)};
  const auto rate = static_cast<double>(state.range(0));
  d.warm(rate);
  std::size_t calls = 0;
  for (auto _ : state) {
    d.arrive(rate, 1);
    ++calls;
  }
  const std::string text = registry.prometheus();
  const std::string series = "tailbatch_adaptive_closes_total{reason=\"lookahead\"} ";
  const auto at = text.find(series);
  const double closes = at == std::string::npos ? 0.0 : std::stod(text.substr(at + series.size()));
  state.counters["lookahead_closes_per_call"] =
      calls > 0 ? closes / static_cast<double>(calls) : 0.0;
}
BENCHMARK(BM_AdaptiveWindow_DecideIdle)->Arg(300)->Arg(450)->Unit(benchmark::kMicrosecond);

// ---- the real clock ------------------------------------------------------------------

// The policy's own time, timed around each call: the decide() calls since the last batch
// that a lane took, and each on_batch_executed().
struct PolicyTimes {
  std::mutex mu;
  double pending_ns = 0.0;
  std::size_t pending_calls = 0;
  std::vector<double> decide_ns, decide_calls, feedback_ns;
};

template <class P>
class TimedPolicy {
 public:
  TimedPolicy(P p, PolicyTimes* t) : inner_(std::move(p)), t_(t) {}
  [[nodiscard]] std::size_t max_batch() const noexcept { return inner_.max_batch(); }
  [[nodiscard]] BatchOrder order() const noexcept { return inner_.order(); }
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    const auto t0 = std::chrono::steady_clock::now();
    const BatchDecision d = inner_.decide(v);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(t_->mu);
    t_->pending_ns += ns;
    ++t_->pending_calls;
    if (d.count > 0 && v.idle_lanes > 0) {
      t_->decide_ns.push_back(t_->pending_ns);
      t_->decide_calls.push_back(static_cast<double>(t_->pending_calls));
      t_->pending_ns = 0.0;
      t_->pending_calls = 0;
    }
    return d;
  }
  void on_batch_executed(const BatchFeedback& f) const noexcept {
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (BatchFeedbackPolicy<P>) inner_.on_batch_executed(f);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(t_->mu);
    t_->feedback_ns.push_back(ns);
  }

 private:
  P inner_;
  PolicyTimes* t_;
};

template <class P>
void real_clock_run(benchmark::State& state, P policy) {
  PolicyTimes times;
  std::atomic<std::int64_t> model_ns{0};
  auto model = [&model_ns](std::span<const int> in, std::span<int> out, HostLane&) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto until = t0 + 250us + 25us * static_cast<std::int64_t>(in.size());
    while (std::chrono::steady_clock::now() < until) {
    }
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
    model_ns.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count(),
        std::memory_order_relaxed);
  };
  for (auto _ : state) {
    HostLanes lanes(1);
    PipelineConfig<int> pc;
    pc.queue_capacity = 8192;
    Pipeline<int, int, TimedPolicy<P>, HostLanes> pipeline(model, TimedPolicy<P>(policy, &times),
                                                           pc, lanes);
    std::atomic<int> done{0};
    const auto start = std::chrono::steady_clock::now();
    // Open loop, Poisson at 1500/s (a fixed seed) for 2 s.
    std::uint64_t x = 88172645463325252ULL;
    double t = 0.0;
    int sent = 0;
    while (t < 2.0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      t += -std::log((static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0) / 1500.0;
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(t)));
      pipeline.submit(sent++, [&done](Outcome<int>&&) noexcept { done.fetch_add(1); });
    }
    while (done.load() < sent) std::this_thread::sleep_for(1ms);
  }
  std::lock_guard lock(times.mu);
  const std::size_t n = std::min(times.decide_ns.size(), times.feedback_ns.size());
  std::vector<double> added(n), fb = times.feedback_ns;
  double sum = 0.0, calls = 0.0, policy_ns = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    added[i] = times.decide_ns[i] + times.feedback_ns[i];
    sum += added[i];
    calls += times.decide_calls[i];
  }
  for (double v : times.decide_ns) policy_ns += v;
  for (double v : times.feedback_ns) policy_ns += v;
  auto p99 = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(
        v.size() - 1,
        static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(v.size()))) - 1)];
  };
  state.counters["batches"] = static_cast<double>(n);
  state.counters["added_p99_us"] = p99(added) / 1e3;
  state.counters["added_mean_us"] = n ? sum / static_cast<double>(n) / 1e3 : 0.0;
  state.counters["feedback_p99_us"] = p99(fb) / 1e3;
  state.counters["decide_calls_per_batch"] = n ? calls / static_cast<double>(n) : 0.0;
  state.counters["policy_share"] =
      model_ns.load() > 0 ? policy_ns / static_cast<double>(model_ns.load()) : 0.0;
}

void BM_RealClock_AddedPerBatch(benchmark::State& state) {
  if (state.range(0) == 0) {
    real_clock_run(state, FixedWindow(32, 500us));
  } else {
    AdaptiveWindowConfig c;
    c.slo_p95 = 50ms;
    c.max_batch = 32;
    real_clock_run(state, AdaptiveWindow(c));
  }
}
BENCHMARK(BM_RealClock_AddedPerBatch)
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
