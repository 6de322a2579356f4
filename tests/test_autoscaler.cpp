// The Autoscaler and ScalingBehavior on explicit times (the ManualClock's readings): the
// headroom formula, scale-up within one evaluation, HPA's stabilised scale-down and rate
// limits, min/max, the Little's-law check on the inputs, the exported gauges, and
// configuration errors that name the field.
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/metrics.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::AutoscaleDecision;
using tailbatch::Autoscaler;
using tailbatch::AutoscalerConfig;
using tailbatch::ManualClock;
using tailbatch::ReplicaSignals;
using tailbatch::ScaleTrigger;
using tailbatch::ScalingBehavior;
using tailbatch::ScalingBehaviorConfig;
using tailbatch::ScalingPolicy;

namespace {

// 100 requests/s per replica is the measured capacity: at 70 % a replica is planned for 70.
AutoscalerConfig config100() {
  AutoscalerConfig c;
  c.capacity_rps = 100.0;
  c.max_replicas = 50;
  return c;
}

// n replicas sharing total_rps evenly, with a quiet queue and a p95 well under any SLO.
std::vector<ReplicaSignals> fleet(int n, double total_rps, double queue_each = 0.0,
                                  std::chrono::nanoseconds p95 = 40ms) {
  std::vector<ReplicaSignals> v(static_cast<std::size_t>(n));
  for (auto& r : v) {
    r.arrival_rps = total_rps / n;
    r.queue_depth = queue_each;
    r.p95 = p95;
  }
  return v;
}

// The decision recommends `replicas` and, with no behaviour holding it back, desires them,
// for `trigger`.
void check_plan(const AutoscaleDecision& d, int replicas, ScaleTrigger trigger) {
  CHECK(d.recommended_replicas == replicas);
  CHECK(d.desired_replicas == replicas);
  CHECK(d.trigger == trigger);
}

}  // namespace

TEST_CASE("replicas = ceil(rate / (capacity x target utilisation)): 30 % headroom by default") {
  ManualClock clock;
  Autoscaler a(config100());
  // 1000 rps at 70 per replica: 14.3 -> 15.
  const AutoscaleDecision d = a.evaluate(clock.now(), 10, fleet(10, 1000.0));
  check_plan(d, 15, ScaleTrigger::utilization);
  CHECK(d.utilization == Approx(1.0));
  CHECK(d.scale_up());

  // Headroom is configurable: 50 % target utilisation plans 50 rps per replica.
  auto c = config100();
  c.target_utilization = 0.5;
  Autoscaler half(c);
  CHECK(half.evaluate(clock.now(), 10, fleet(10, 1000.0)).desired_replicas == 20);
  // And 100 % plans for exactly the capacity.
  c.target_utilization = 1.0;
  Autoscaler full(c);
  CHECK(full.evaluate(clock.now(), 10, fleet(10, 1000.0)).desired_replicas == 10);
}

TEST_CASE("within the tolerance the current count stands") {
  ManualClock clock;
  Autoscaler a(config100());
  // 10 replicas at 735 rps: utilisation 0.735, 5 % over the 0.7 target, inside 10 %.
  const auto d = a.evaluate(clock.now(), 10, fleet(10, 735.0));
  check_plan(d, 10, ScaleTrigger::none);
}

TEST_CASE("a growing queue scales up within one evaluation") {
  ManualClock clock;
  Autoscaler a(config100());
  // At the target rate (4 replicas x 70 rps): nothing to do.
  CHECK(a.evaluate(clock.now(), 4, fleet(4, 280.0)).desired_replicas == 4);
  clock.advance(5s);
  // Same arrival rate, but 200 requests queued on each replica: 800 queued over the 10 s
  // drain time is 80 rps more demand: (280 + 80) / 70 = 5.14 -> 6, at the next evaluation.
  const auto d = a.evaluate(clock.now(), 4, fleet(4, 280.0, 200.0));
  check_plan(d, 6, ScaleTrigger::queue);
}

TEST_CASE("a p95 near the SLO adds a replica within one evaluation") {
  ManualClock clock;
  auto c = config100();
  c.slo_p95 = 150ms;
  Autoscaler a(c);
  // Rate says 4 is right; the p95 at 125 ms (83 % of the SLO) says it is not.
  const auto d = a.evaluate(clock.now(), 4, fleet(4, 280.0, 0.0, 125ms));
  CHECK(d.trigger == ScaleTrigger::latency);
  CHECK(d.desired_replicas == 5);
  clock.advance(5s);
  // Below 80 % of the SLO: no trigger.
  CHECK(a.evaluate(clock.now(), 5, fleet(5, 350.0, 0.0, 110ms)).trigger == ScaleTrigger::none);
}

TEST_CASE("scale-down waits for the stabilisation window (HPA's 300 s by default)") {
  ManualClock clock;
  Autoscaler a(config100());
  const auto t0 = clock.now();
  CHECK(a.evaluate(t0, 15, fleet(15, 1000.0)).desired_replicas == 15);
  // The load drops to 300 rps (5 replicas' worth). For 300 s the highest recommendation
  // of the window (15) holds the fleet.
  int current = 15;
  for (auto t = 15s; t < 300s; t += 15s) {
    const auto d = a.evaluate(t0 + t, current, fleet(current, 300.0));
    CHECK(d.recommended_replicas == 5);
    CHECK(d.desired_replicas == 15);
    current = d.desired_replicas;
  }
  // 300 s after the last recommendation of 15, the window holds only 5s.
  const auto d = a.evaluate(t0 + 300s, current, fleet(current, 300.0));
  CHECK(d.desired_replicas == 5);
  CHECK(d.scale_down());

  // With a short window it goes sooner.
  auto c = config100();
  c.behavior.scale_down.stabilization_window = 30s;
  Autoscaler quick(c);
  CHECK(quick.evaluate(t0, 15, fleet(15, 1000.0)).desired_replicas == 15);
  CHECK(quick.evaluate(t0 + 15s, 15, fleet(15, 300.0)).desired_replicas == 15);
  CHECK(quick.evaluate(t0 + 30s, 15, fleet(15, 300.0)).desired_replicas == 5);
}

TEST_CASE("a brief dip inside the window sheds nothing") {
  ManualClock clock;
  Autoscaler a(config100());
  const auto t0 = clock.now();
  CHECK(a.evaluate(t0, 10, fleet(10, 700.0)).desired_replicas == 10);
  CHECK(a.evaluate(t0 + 15s, 10, fleet(10, 100.0)).desired_replicas == 10);
  CHECK(a.evaluate(t0 + 30s, 10, fleet(10, 700.0)).desired_replicas == 10);
}

TEST_CASE("min_replicas and max_replicas bound the answer") {
  ManualClock clock;
  auto c = config100();
  c.min_replicas = 3;
  c.max_replicas = 8;
  c.behavior.scale_down.stabilization_window = 0s;
  Autoscaler a(c);
  const auto lo = a.evaluate(clock.now(), 3, fleet(3, 10.0));
  CHECK(lo.desired_replicas == 3);
  CHECK(lo.trigger == ScaleTrigger::min_replicas);
  clock.advance(60s);
  const auto hi = a.evaluate(clock.now(), 8, fleet(8, 5000.0));
  CHECK(hi.recommended_replicas == 8);
  CHECK(hi.desired_replicas == 8);
  CHECK(hi.trigger == ScaleTrigger::max_replicas);
  // No ready replica yet: demand unknown, the minimum stands.
  CHECK(a.evaluate(clock.now() + 5s, 0, {}).desired_replicas == 3);
}

TEST_CASE("scale-up is rate-limited by HPA's default policies: 100 % or 4 pods per 15 s") {
  const auto t0 = ManualClock::start();
  ScalingBehavior b;
  // From 2 the larger of 2 x 2 = 4 and 2 + 4 = 6 wins.
  CHECK(b.apply(t0, 2, 40) == 6);
  // Within the same 15 s period the start of the period is still 2.
  CHECK(b.apply(t0 + 5s, 6, 40) == 6);
  // A new period starts from 6: 12 (100 %) beats 10 (4 pods).
  CHECK(b.apply(t0 + 16s, 6, 40) == 12);

  ScalingBehaviorConfig only_pods;
  only_pods.scale_up.policies = {ScalingPolicy{ScalingPolicy::Type::pods, 1, 60s}};
  ScalingBehavior slow(only_pods);
  CHECK(slow.apply(t0, 2, 10) == 3);
  CHECK(slow.apply(t0 + 30s, 3, 10) == 3);
  CHECK(slow.apply(t0 + 61s, 3, 10) == 4);
}

TEST_CASE("scale-down policies limit how fast replicas go") {
  const auto t0 = ManualClock::start();
  ScalingBehaviorConfig c;
  c.scale_down.stabilization_window = 0s;
  c.scale_down.policies = {ScalingPolicy{ScalingPolicy::Type::pods, 2, 60s},
                           ScalingPolicy{ScalingPolicy::Type::percent, 10, 60s}};
  c.scale_down.select = tailbatch::SelectPolicy::min;  // from 20 both allow 2 fewer
  ScalingBehavior b(c);
  CHECK(b.apply(t0, 20, 1) == 18);
  CHECK(b.apply(t0 + 30s, 18, 1) == 18);
  // A new period from 18: 2 pods would make 16, 10 % makes 17; `min` takes the smaller change.
  CHECK(b.apply(t0 + 61s, 18, 1) == 17);
  c.scale_down.select = tailbatch::SelectPolicy::disabled;
  ScalingBehavior never(c);
  CHECK(never.apply(t0, 20, 1) == 20);
}

TEST_CASE("a scale-up stabilisation window waits for the lowest recommendation to rise") {
  const auto t0 = ManualClock::start();
  ScalingBehaviorConfig c;
  c.scale_up.stabilization_window = 30s;
  ScalingBehavior b(c);
  CHECK(b.apply(t0, 4, 4) == 4);
  CHECK(b.apply(t0 + 15s, 4, 8) == 4);   // 4 is still in the window
  CHECK(b.apply(t0 + 31s, 4, 8) == 8);   // only 8s left
}

TEST_CASE("lead_time projects a rising arrival rate over a replica's start-up") {
  const auto t0 = ManualClock::start();
  auto c = config100();
  c.behavior.scale_up.policies.clear();  // no rate limit: the formula alone
  Autoscaler now_only(c);
  c.lead_time = 30s;
  c.trend_window = 30s;
  Autoscaler ahead(c);
  // The rate rises by 10 rps per second.
  int cur_a = 4, cur_n = 4;
  for (int i = 0; i <= 2; ++i) {
    const double rps = 280.0 + 10.0 * 10.0 * i;
    const auto t = t0 + std::chrono::seconds(10 * i);
    cur_a = ahead.evaluate(t, cur_a, fleet(cur_a, rps)).desired_replicas;
    cur_n = now_only.evaluate(t, cur_n, fleet(cur_n, rps)).desired_replicas;
  }
  // At 480 rps now: 7 replicas for the present, 12 for 480 + 10 x 30 = 780 rps.
  CHECK(cur_n == 7);
  CHECK(cur_a == 12);
  CHECK(ahead.last().trigger == ScaleTrigger::trend);
  CHECK(ahead.last().projected_rps == Approx(780.0));
}

TEST_CASE("a projected rise inside the tolerance orders nothing") {
  const auto t0 = ManualClock::start();
  auto c = config100();
  c.lead_time = 35s;
  c.trend_window = 10s;
  Autoscaler a(c);
  // 280 -> 284 rps in 10 s is noise: projected 284 + 0.4 x 35 = 298 rps is 1.06 x the
  // target on 4 replicas, inside the 10 % tolerance, although ceil(298 / 70) = 5.
  CHECK(a.evaluate(t0, 4, fleet(4, 280.0)).desired_replicas == 4);
  const auto d = a.evaluate(t0 + 10s, 4, fleet(4, 284.0));
  CHECK(d.projected_rps == Approx(298.0));
  CHECK(d.trigger == ScaleTrigger::none);
  CHECK(d.desired_replicas == 4);
}

TEST_CASE("the Little's-law check flags inputs that cannot all be true") {
  ManualClock clock;
  tailbatch::MetricsRegistry registry;
  auto c = config100();
  c.metrics = &registry;
  Autoscaler a(c);
  // 4 replicas x 70 rps x 50 ms = 14 requests inside, as reported: consistent.
  auto ok = fleet(4, 280.0);
  for (auto& r : ok) {
    r.mean_latency = 50ms;
    r.in_flight = 3.0;
    r.queue_depth = 0.5;
  }
  const auto good = a.evaluate(clock.now(), 4, ok);
  CHECK(good.inputs_consistent);
  CHECK(good.littles_law.predicted_in_flight == Approx(14.0));
  CHECK(registry.prometheus().find("tailbatch_autoscaler_inputs_consistent 1") != std::string::npos);
  // 40 requests inside each replica at that rate and latency: 160 vs 14 predicted.
  auto bad = ok;
  for (auto& r : bad) r.in_flight = 40.0;
  clock.advance(5s);
  const auto d = a.evaluate(clock.now(), 4, bad);
  CHECK_FALSE(d.inputs_consistent);
  CHECK_THAT(d.littles_law.explanation, ContainsSubstring("hidden queue suspected"));
  CHECK(registry.prometheus().find("tailbatch_autoscaler_inputs_consistent 0") != std::string::npos);
  // Without a mean latency there is nothing to check.
  clock.advance(5s);
  CHECK(a.evaluate(clock.now(), 4, fleet(4, 280.0)).inputs_consistent);
}

TEST_CASE("requests refused at the door count in the demand but not in the Little's-law check") {
  ManualClock clock;
  Autoscaler a(config100());
  // 4 replicas each offered 200 rps and refusing 150 of them: 50 rps admitted x 100 ms
  // = 5 requests inside each. The refused ones spend no time inside; counting them in the
  // arrival rate would predict 4 x 200 x 0.1 = 80 inside against 20 and flag a hidden queue.
  auto shedding = fleet(4, 800.0);
  for (auto& r : shedding) {
    r.rejected_rps = 150.0;
    r.mean_latency = 100ms;
    r.queue_depth = 4.0;
    r.in_flight = 1.0;
  }
  const auto d = a.evaluate(clock.now(), 4, shedding);
  INFO(d.littles_law.explanation);
  CHECK(d.inputs_consistent);
  CHECK_FALSE(d.littles_law.hidden_queue_suspected);
  CHECK(d.littles_law.throughput_per_s == Approx(200.0));
  CHECK(d.littles_law.predicted_in_flight == Approx(20.0));
  CHECK(d.littles_law.measured_in_flight == Approx(20.0));
  // The demand is what arrived, refused or not: 800 rps at 70 per replica wants 12.
  CHECK(d.arrival_rps == Approx(800.0));
  CHECK(d.recommended_replicas == 12);

  // A real hidden queue still shows while shedding: 30 inside each against 5 predicted.
  for (auto& r : shedding) r.queue_depth = 29.0;
  clock.advance(5s);
  const auto hidden = a.evaluate(clock.now(), 4, shedding);
  CHECK_FALSE(hidden.inputs_consistent);
  CHECK_THAT(hidden.littles_law.explanation, ContainsSubstring("hidden queue suspected"));

  // More refused than arrived cannot be true.
  auto bad = fleet(1, 10.0);
  bad[0].rejected_rps = 11.0;
  clock.advance(5s);
  CHECK_INVALID((void)a.evaluate(clock.now(), 1, bad), "rejected_rps must be <= arrival_rps");
}

TEST_CASE("the decision and its inputs are exported to the registry") {
  ManualClock clock;
  tailbatch::MetricsRegistry registry;
  auto c = config100();
  c.metrics = &registry;
  c.metric_labels = {{"service", "classifier"}};
  Autoscaler a(c);
  (void)a.evaluate(clock.now(), 10, fleet(10, 1000.0, 1.0, 120ms));
  const std::string text = registry.prometheus();
  check_contains_all(text, {"tailbatch_autoscaler_desired_replicas{service=\"classifier\"} 15",
                            "tailbatch_autoscaler_current_replicas{service=\"classifier\"} 10",
                            "tailbatch_autoscaler_arrival_rate{service=\"classifier\"} 1000",
                            "tailbatch_autoscaler_queue_depth{service=\"classifier\"} 10",
                            "tailbatch_autoscaler_p95_seconds{service=\"classifier\"} 0.12",
                            "tailbatch_autoscaler_capacity_rps{service=\"classifier\"} 100",
                            "tailbatch_autoscaler_evaluations_total{service=\"classifier\"} 1"});
}

TEST_CASE("the same inputs give the same decisions") {
  auto run = [] {
    Autoscaler a(config100());
    std::vector<int> out;
    int cur = 2;
    const auto t0 = ManualClock::start();
    for (int i = 0; i < 40; ++i) {
      const double rps = i < 10 ? 100.0 : i < 25 ? 900.0 : 150.0;
      cur = a.evaluate(t0 + std::chrono::seconds(15 * i), cur, fleet(cur, rps, i % 3)).desired_replicas;
      out.push_back(cur);
    }
    return out;
  };
  CHECK(run() == run());
}

TEST_CASE("bad configuration throws std::invalid_argument naming the field") {
  auto c = config100();
  c.capacity_rps = 0.0;
  CHECK_INVALID(Autoscaler{c}, "capacity_rps");
  c = config100();
  c.target_utilization = 1.5;
  CHECK_INVALID(Autoscaler{c}, "target_utilization");
  c = config100();
  c.target_utilization = 0.0;
  CHECK_INVALID(Autoscaler{c}, "target_utilization");
  c = config100();
  c.min_replicas = 10;
  c.max_replicas = 5;
  CHECK_INVALID(Autoscaler{c}, "max_replicas");
  c = config100();
  c.min_replicas = -1;
  CHECK_INVALID(Autoscaler{c}, "min_replicas");
  c = config100();
  c.tolerance = -0.1;
  CHECK_INVALID(Autoscaler{c}, "tolerance");
  c = config100();
  c.latency_trigger = 0.0;
  CHECK_INVALID(Autoscaler{c}, "latency_trigger");
  c = config100();
  c.queue_drain_time = 0s;
  CHECK_INVALID(Autoscaler{c}, "queue_drain_time");
  c = config100();
  c.lead_time = -1s;
  CHECK_INVALID(Autoscaler{c}, "lead_time");
  c = config100();
  c.slo_p95 = -1ms;
  CHECK_INVALID(Autoscaler{c}, "slo_p95");
  c = config100();
  c.behavior.scale_down.stabilization_window = -1s;
  CHECK_INVALID(Autoscaler{c}, "scale_down.stabilization_window");
  c = config100();
  c.behavior.scale_up.policies = {ScalingPolicy{ScalingPolicy::Type::pods, 0, 15s}};
  CHECK_INVALID(Autoscaler{c}, "scale_up.policies value");
  c = config100();
  c.behavior.scale_up.policies = {ScalingPolicy{ScalingPolicy::Type::pods, 1, 0s}};
  CHECK_INVALID(Autoscaler{c}, "scale_up.policies period");

  Autoscaler a(config100());
  auto bad = fleet(2, 100.0);
  bad[1].queue_depth = -1.0;
  CHECK_INVALID((void)a.evaluate(ManualClock::start(), 2, bad), "queue_depth");
  bad = fleet(2, 100.0);
  bad[0].arrival_rps = std::numeric_limits<double>::quiet_NaN();
  CHECK_INVALID((void)a.evaluate(ManualClock::start(), 2, bad), "arrival_rps");
  CHECK_INVALID((void)a.evaluate(ManualClock::start(), -1, fleet(1, 1.0)), "current");
}
