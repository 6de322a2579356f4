// The discrete-event simulator: the real Pipeline, BatchPolicy and limiter types stepped on
// the ManualClock with a modelled L(b). Checked against the planner's figures for the
// guide's Example 1 (and where, and why, the two part ways), against Little's law, and for
// the behaviour of the policies and limiters it drives.
#include <tailbatch/tools/simulator.hpp>

#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/tools/planner.hpp>

#include <chrono>
#include <cmath>
#include <memory>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::FixedWindow;
using tailbatch::LinearCost;
using tailbatch::LoadProfile;
using tailbatch::SimulationConfig;
using tailbatch::Status;

namespace {

double ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The latency field guide's Example 1: L(b) = 20 ms + 3 ms × (b − 1), two GPU streams, network 5 ms,
// window 8 ms.
tailbatch::BatchPlan planner_example1(int batch, double tail = 1.2) {
  tailbatch::PlannerConfig c;
  c.profile = tailbatch::LatencyProfile::linear(20.0, 3.0);
  c.network_ms = 5.0;
  c.window_ms = 8.0;
  c.streams = 2;
  c.tail = tail;
  return tailbatch::plan_batch(c, batch);
}

SimulationConfig example1(double rps, std::chrono::nanoseconds duration = 60s, std::uint64_t seed = 1) {
  SimulationConfig c;
  c.arrivals = LoadProfile::poisson(rps, duration);
  c.warmup = 5s;
  c.seed = seed;
  c.lanes = 2;
  c.service_time = LinearCost{20ms, 3ms};
  c.network = 5ms;
  return c;
}

}  // namespace

TEST_CASE("Example 1: the planner's throughput is the simulated saturation throughput of its cycle",
          "[simulator][planner][guide]") {
  // The planner charges every batch window + model + network on its stream. Simulated with
  // exactly that cycle (the lane also held for network + window per batch), a heavily
  // overloaded instance (a short queue sheds the excess) completes what the planner says.
  for (int b : {8, 16}) {
    const auto plan = planner_example1(b);
    auto c = example1(2000.0, 20s);
    c.lane_overhead = 13ms;  // network 5 + window 8
    c.queue_capacity = 4 * static_cast<std::size_t>(b);
    const auto r = tailbatch::simulate(c, FixedWindow(static_cast<std::size_t>(b), 8ms));
    INFO("batch " << b << ": simulated " << r.throughput_rps << " rps, planner " << plan.instance_rps);
    CHECK(r.throughput_rps == Approx(plan.instance_rps).epsilon(0.15));
    CHECK(r.throughput_rps == Approx(plan.instance_rps).epsilon(0.03));  // in fact within 3 %
    CHECK(r.mean_batch_size == Approx(b).epsilon(0.01));                 // every batch full
    CHECK(r.lane_utilization > 0.98);
    CHECK(r.count(tailbatch::RejectReason::queue_full) > 0);
  }
}

TEST_CASE("Example 1: the planner's per-request time is the simulated median at the planner's throughput",
          "[simulator][planner][guide]") {
  // The Pipeline's own behaviour: FixedWindow(b, 8 ms), the network a delay holding no lane,
  // Poisson arrivals at the planner's instance throughput (≈ 296 and ≈ 410 rps).
  for (int b : {8, 16}) {
    const auto plan = planner_example1(b);
    const auto r = tailbatch::simulate(example1(plan.instance_rps), FixedWindow(static_cast<std::size_t>(b), 8ms));
    INFO("batch " << b << ": simulated p50 " << ms(r.p50) << " ms, planner per-request " << plan.request_ms << " ms");
    CHECK(ms(r.p50) == Approx(plan.request_ms).epsilon(0.15));
    CHECK(r.throughput_rps == Approx(plan.instance_rps).epsilon(0.02));  // it keeps up
  }
}

TEST_CASE("Example 1: the planner's p95 estimate holds near its throughput, and is conservative below it",
          "[simulator][planner][guide]") {
  // Agreement condition: Poisson arrivals at 85-100 % of the planner's instance throughput;
  // the simulated p95 then lies within the planner's 1.1-1.3 tail band (±10 %). Well below
  // that load the planner over-estimates p95 (it assumes every batch waits its full window).
  for (int b : {8, 16}) {
    const auto plan = planner_example1(b);
    for (double load : {0.85, 1.0}) {
      const auto r = tailbatch::simulate(example1(load * plan.instance_rps), FixedWindow(static_cast<std::size_t>(b), 8ms));
      const double ratio = ms(r.p95) / plan.request_ms;
      INFO("batch " << b << " at " << load * 100 << " %: simulated p95 " << ms(r.p95) << " ms = " << ratio
                    << " x the planner's per-request time " << plan.request_ms << " ms");
      CHECK(ratio >= 1.1 * 0.9);
      CHECK(ratio <= 1.3 * 1.1);
    }
    const auto light = tailbatch::simulate(example1(0.35 * plan.instance_rps), FixedWindow(static_cast<std::size_t>(b), 8ms));
    CHECK(ms(light.p95) < planner_example1(b, 1.1).p95_ms);
  }
}

TEST_CASE("Where they part: at saturation a dynamic window does not wait, so capacity is streams x b / L(b)",
          "[simulator][planner]") {
  // Once the queue holds a full batch, FixedWindow closes at once: no window is spent, and the
  // network delay holds no lane. Capacity is 2 × 8 / 41 ms ≈ 390 rps and 2 × 16 / 65 ms ≈ 492
  // rps, 32 % and 20 % above the planner's conservative figures.
  for (int b : {8, 16}) {
    const auto plan = planner_example1(b);
    auto c = example1(2000.0, 20s);
    c.queue_capacity = 4 * static_cast<std::size_t>(b);
    const auto r = tailbatch::simulate(c, FixedWindow(static_cast<std::size_t>(b), 8ms));
    const double capacity = 2.0 * b / (plan.model_ms / 1000.0);
    CHECK(r.throughput_rps == Approx(capacity).epsilon(0.03));
    CHECK(r.throughput_rps > 1.15 * plan.instance_rps);
    CHECK(r.batches_by_reason[static_cast<int>(tailbatch::DispatchReason::size)] > 0.95 * static_cast<double>(r.batches));
  }
}

TEST_CASE("Little's law holds in the simulation", "[simulator]") {
  const auto r = tailbatch::simulate(example1(300.0, 30s), FixedWindow(16, 8ms));
  // In flight counts admitted requests until their batch finishes: server-side latency.
  const double server_latency_s = (ms(r.mean) - 5.0) / 1000.0;
  CHECK(r.mean_in_flight == Approx(r.throughput_rps * server_latency_s).epsilon(0.05));
  CHECK(r.max_in_flight >= static_cast<std::uint64_t>(r.mean_in_flight));
}

TEST_CASE("Deterministic for a seed; different seeds differ", "[simulator]") {
  const auto a = tailbatch::simulate(example1(300.0, 10s, 7), FixedWindow(16, 8ms));
  const auto b = tailbatch::simulate(example1(300.0, 10s, 7), FixedWindow(16, 8ms));
  const auto c = tailbatch::simulate(example1(300.0, 10s, 8), FixedWindow(16, 8ms));
  CHECK(a.p95 == b.p95);
  CHECK(a.ok == b.ok);
  CHECK(a.batch_sizes == b.batch_sizes);
  CHECK(a.ok != c.ok);
}

TEST_CASE("Batch sizes: batch 1 without a window, full batches under load", "[simulator]") {
  auto c = example1(30.0, 20s);
  const auto single = tailbatch::simulate(c, FixedWindow(1, 0ms));
  REQUIRE(single.batch_sizes.size() >= 2);
  CHECK(single.batch_sizes[1] == single.batches);
  CHECK(single.mean_batch_size == 1.0);
  // At 30 rps with two lanes of 20 ms, little queueing: p50 is about L(1) + network.
  CHECK(ms(single.p50) == Approx(25.0).epsilon(0.05));

  const auto busy = tailbatch::simulate(example1(380.0, 20s), FixedWindow(8, 8ms));
  CHECK(busy.batch_sizes[8] > busy.batches / 2);
}

TEST_CASE("The same limiter type: a static cap bounds in-flight work and sheds the rest", "[simulator][limiter]") {
  // 3x overload on batch 8, two lanes (capacity ≈ 390 rps). A cap of 24 in flight: 16
  // running, 8 waiting at most. Admitted requests keep a bounded latency; the rest are
  // rejected at once as overloaded.
  tailbatch::ConcurrencyLimiter<tailbatch::StaticLimit, tailbatch::ManualClock> limiter(tailbatch::StaticLimit(24));
  auto c = example1(1200.0, 20s);
  const auto r = tailbatch::simulate(c, FixedWindow(8, 8ms), limiter);
  CHECK(r.max_in_flight <= 24);
  CHECK(r.count(tailbatch::RejectReason::overloaded) > r.arrivals / 2);
  CHECK(r.count(tailbatch::RejectReason::queue_full) == 0);
  CHECK(ms(r.p99) < 2 * 41.0 + 8.0 + 5.0 + 1.0);  // one batch ahead of it, at most
  CHECK(r.throughput_rps == Approx(390.0).epsilon(0.05));
  CHECK(limiter.in_flight_approx() == 0);  // every permit came back

  // A cap below max_batch x lanes could never fill both lanes: refused, as by the Pipeline.
  tailbatch::ConcurrencyLimiter<tailbatch::StaticLimit, tailbatch::ManualClock> tiny(tailbatch::StaticLimit(10));
  CHECK_THROWS_AS(tailbatch::simulate(c, FixedWindow(8, 8ms), tiny), std::invalid_argument);
}

TEST_CASE("A learning limiter reads simulated time and adapts to it", "[simulator][limiter]") {
  SimulationConfig c = example1(1200.0, 30s);
  tailbatch::AimdLimitConfig ac;
  ac.initial_limit = 200;
  ac.min_limit = 16;
  ac.max_limit = 400;
  ac.latency_target = 100ms;
  ac.window = 500ms;
  tailbatch::ConcurrencyLimiter<tailbatch::AimdLimit, tailbatch::ManualClock> limiter(
      tailbatch::AimdLimit(ac), tailbatch::ConcurrencyLimiterConfig{}, c.clock);
  const auto r = tailbatch::simulate(c, FixedWindow(8, 8ms), limiter);
  CHECK(limiter.windows_closed() > 10);  // windows of simulated time
  CHECK(limiter.limit() < 200);          // backed off from the initial limit under overload
  CHECK(r.count(tailbatch::RejectReason::overloaded) > 0);
  CHECK(limiter.in_flight_approx() == 0);
}

TEST_CASE("Other policies and per-request options run through the same Pipeline", "[simulator]") {
  SECTION("PreferredSizes pads to the preferred sizes") {
    auto c = example1(250.0, 10s);
    const auto r = tailbatch::simulate(c, tailbatch::PreferredSizes({4, 8, 16}, 8ms));
    for (std::size_t b = 1; b < r.batch_sizes.size(); ++b)
      if (b != 4 && b != 8 && b != 16) CHECK(r.batch_sizes[b] == 0);
    CHECK(r.ok == r.arrivals);
  }
  SECTION("TokenBudget reads the request cost") {
    auto c = example1(200.0, 10s);
    c.request_cost = [](std::uint64_t i) { return static_cast<std::size_t>(16 + (i % 4) * 32); };
    tailbatch::TokenBudget::Config tc;
    tc.budget = 512;
    tc.max_batch = 16;
    tc.max_wait = 8ms;
    const auto r = tailbatch::simulate(c, tailbatch::TokenBudget(tc));
    CHECK(r.ok == r.arrivals);
    CHECK(r.batches_by_reason[static_cast<int>(tailbatch::DispatchReason::token_budget)] > 0);
  }
  SECTION("Deadlines: overload turns into deadline_exceeded, never late execution") {
    auto c = example1(800.0, 10s);
    c.request_timeout = 60ms;
    c.queue_capacity = 100000;
    const auto r = tailbatch::simulate(c, FixedWindow(8, 8ms));
    CHECK(r.count(Status::deadline_exceeded) > 0);
    // A request starts within 60 ms of arriving, then runs at most L(8) + network.
    CHECK(ms(r.max) <= 60.0 + 41.0 + 5.0 + 0.01);
  }
}

TEST_CASE("Bad configuration throws std::invalid_argument naming the field", "[simulator]") {
  SimulationConfig c;
  CHECK_THROWS_AS(tailbatch::simulate(c, FixedWindow(8, 8ms)), std::invalid_argument);  // no service_time
  c.service_time = LinearCost{1ms, 0ms};
  c.lanes = 0;
  CHECK_THROWS_AS(tailbatch::simulate(c, FixedWindow(8, 8ms)), std::invalid_argument);
  c.lanes = 1;
  c.warmup = 20s;
  CHECK_THROWS_AS(tailbatch::simulate(c, FixedWindow(8, 8ms)), std::invalid_argument);
  c.warmup = 0s;
  tailbatch::TokenBudget::Config tc;
  tc.budget = 64;
  CHECK_THROWS_AS(tailbatch::simulate(c, tailbatch::TokenBudget(tc)), std::invalid_argument);  // no request_cost
}

namespace {

// A FixedWindow that records what the simulator tells it: the lane state in each view, and
// each executed batch (copies share the record, as a learning policy's copies share state).
struct Recorded {
  std::uint64_t views = 0, bad_lane_views = 0, feedbacks = 0, bad_feedbacks = 0, requests = 0;
  std::size_t min_idle = 1000, max_idle = 0;
  // The idle lanes in the view of the latest dispatch decision, and the batches executed
  // on a decision taken with no lane idle.
  std::size_t dispatch_idle = 0;
  std::uint64_t started_without_idle_lane = 0;
};

class RecordingPolicy {
 public:
  RecordingPolicy(std::size_t lanes, std::shared_ptr<Recorded> rec) : lanes_(lanes), rec_(std::move(rec)) {}
  [[nodiscard]] std::size_t max_batch() const noexcept { return inner_.max_batch(); }
  [[nodiscard]] tailbatch::BatchOrder order() const noexcept { return inner_.order(); }
  [[nodiscard]] tailbatch::BatchDecision decide(const tailbatch::BatchView& v) const noexcept {
    ++rec_->views;
    if (v.lanes != lanes_ || v.idle_lanes > v.lanes) ++rec_->bad_lane_views;
    rec_->min_idle = std::min(rec_->min_idle, v.idle_lanes);
    rec_->max_idle = std::max(rec_->max_idle, v.idle_lanes);
    const tailbatch::BatchDecision d = inner_.decide(v);
    if (d.count > 0) rec_->dispatch_idle = v.idle_lanes;
    return d;
  }
  void on_batch_executed(const tailbatch::BatchFeedback& f) const noexcept {
    ++rec_->feedbacks;
    rec_->requests += f.size;
    if (rec_->dispatch_idle < 1) ++rec_->started_without_idle_lane;
    if (f.model_time != LinearCost{20ms, 3ms}(f.padded_size) || f.size < 1 || f.padded_size < f.size ||
        f.lane >= lanes_ || f.failed)
      ++rec_->bad_feedbacks;
  }

 private:
  FixedWindow inner_{16, 8ms};
  std::size_t lanes_;
  std::shared_ptr<Recorded> rec_;
};

}  // namespace

TEST_CASE("Views carry the simulated lanes' state; a learning policy hears of every executed batch",
          "[simulator][adaptive]") {
  SimulationConfig c = example1(300, 10s);
  c.lanes = 3;
  auto rec = std::make_shared<Recorded>();
  static_assert(tailbatch::BatchFeedbackPolicy<RecordingPolicy>);
  const auto r = tailbatch::simulate(c, RecordingPolicy(3, rec));
  CHECK(rec->views > 0);
  CHECK(rec->bad_lane_views == 0);
  // The policy is asked before a lane is leased, so it sees the lanes all busy at times
  // (a dispatch then leaves the batch queued, growing) and all three idle at others; a
  // batch starts only on a decision taken while a lane was idle.
  CHECK(rec->min_idle == 0);
  CHECK(rec->max_idle == 3);
  CHECK(rec->started_without_idle_lane == 0);
  CHECK(rec->feedbacks == r.batches);
  CHECK(rec->bad_feedbacks == 0);
  CHECK(rec->requests == r.arrivals + r.warmup_arrivals);
}

TEST_CASE(
    "Tenants in the simulation: fair scheduling keeps a light tenant's latency, goodput counts "
    "within the SLO",
    "[simulator][tenants]") {
  // Example 1 at 1.6x its capacity: tenant 1 sends 4 of every 5 requests, tenant 2 one; each
  // tenant may queue 500 (its excess is its own quota_exceeded).
  auto run = [](tailbatch::Scheduling s) {
    SimulationConfig c = example1(780.0, 10s);
    c.tenant = [](std::uint64_t i) { return static_cast<tailbatch::TenantId>(i % 5 == 0 ? 2 : 1); };
    c.tenants.scheduling = s;
    c.tenants.defaults.max_queued = 500;
    c.goodput_within = 150ms;
    return tailbatch::simulate(c, FixedWindow(16, 8ms));
  };
  const auto fifo = run(tailbatch::Scheduling::fifo);
  const auto fair = run(tailbatch::Scheduling::fair);
  for (const auto* r : {&fifo, &fair}) {
    REQUIRE(r->tenants.size() == 2);
    CHECK(r->tenants[0].tenant == 1);
    CHECK(r->tenants[1].tenant == 2);
    CHECK(r->tenants[0].arrivals + r->tenants[1].arrivals == r->arrivals);
    CHECK(r->tenants[0].ok + r->tenants[1].ok == r->ok);
    CHECK(r->good == r->tenants[0].good + r->tenants[1].good);
    CHECK(r->good <= r->ok);
    CHECK(r->count(tailbatch::RejectReason::quota_exceeded) > 0);  // tenant 1's excess
    CHECK(r->tenants[1].ok == r->tenants[1].arrivals);             // tenant 2 lost nothing
  }
  // FIFO: the light tenant waits behind the heavy one's queue; fair: it is served next.
  CHECK(ms(fifo.tenants[1].p95) > 500.0);
  CHECK(ms(fair.tenants[1].p95) < 150.0);
  CHECK(fair.tenants[1].good == fair.tenants[1].ok);
  CHECK(fair.goodput_rps > fifo.goodput_rps);
}
