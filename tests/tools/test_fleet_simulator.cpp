// The fleet simulator: one replica is exactly the single-replica simulator; load balancing
// (round robin, least outstanding); cold start; scale-down by draining loses nothing;
// overload shows as failures and violation seconds; the Autoscaler drives a fleet through a
// spike; same seed, same run; bad configuration names the field.
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/tools/fleet_simulator.hpp>
#include <tailbatch/tools/simulator.hpp>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::FixedWindow;
using tailbatch::FleetConfig;
using tailbatch::FleetObservation;
using tailbatch::LinearCost;
using tailbatch::LoadBalancing;
using tailbatch::LoadProfile;

namespace {

// The latency field guide's Example 1 replica: 20 + 3 (b - 1) ms per batch, 2 lanes, 5 ms
// network; about 410 requests/s within a 150 ms p95 (the planner), 490 at saturation.
FleetConfig example1(double rps, std::chrono::nanoseconds length, std::size_t replicas = 1) {
  FleetConfig c;
  c.arrivals = LoadProfile::poisson(rps, length);
  c.lanes = 2;
  c.service_time = LinearCost{20ms, 3ms};
  c.network = 5ms;
  c.initial_replicas = replicas;
  c.slo_p95 = 150ms;
  return c;
}

const FixedWindow batching(16, 8ms);

}  // namespace

TEST_CASE("a fleet of one replica is the single-replica simulation, request for request") {
  const FleetConfig f = example1(300.0, 10s);
  tailbatch::SimulationConfig s;
  s.arrivals = f.arrivals;
  s.lanes = 2;
  s.service_time = f.service_time;
  s.network = 5ms;
  const auto fleet = tailbatch::simulate_fleet(f, batching);
  const auto single = tailbatch::simulate(s, batching);
  CHECK(fleet.arrivals == single.arrivals);
  CHECK(fleet.ok == single.ok);
  CHECK(fleet.failed == 0);
  CHECK(fleet.p50 == single.p50);
  CHECK(fleet.p95 == single.p95);
  CHECK(fleet.p99 == single.p99);
  CHECK(fleet.latency.mean() == single.latency.mean());
  CHECK(fleet.replica_seconds == Approx(10.0).epsilon(0.01));
  CHECK(fleet.max_replicas == 1);
  CHECK(fleet.timeline.size() == 10);
  CHECK(fleet.violation_seconds == 0.0);
}

TEST_CASE("round robin gives each ready replica the same share") {
  auto c = example1(600.0, 10s, 3);
  c.balancing = LoadBalancing::round_robin;
  c.evaluation_interval = 5s;
  std::vector<FleetObservation> seen;
  c.scaling_policy = [&](const FleetObservation& o) {
    seen.push_back(o);
    return o.provisioned;
  };
  const auto r = tailbatch::simulate_fleet(c, batching);
  REQUIRE(seen.size() == 1);  // at 5 s (the one at 10 s would be after the last arrival)
  REQUIRE(seen[0].ready.size() == 3);
  double total = 0.0;
  for (const auto& rep : seen[0].ready) total += rep.arrival_rps;
  for (const auto& rep : seen[0].ready) {
    CHECK(std::fabs(rep.arrival_rps - total / 3) <= 1.0 / 5.0);  // one request in 5 s at most
    CHECK(rep.utilization > 0.0);
    CHECK(rep.utilization <= 1.0);
    CHECK(rep.p95 > 0ns);
    CHECK(rep.mean_latency > 0ns);
  }
  CHECK(r.ok == r.arrivals);
}

TEST_CASE("least outstanding requests sends new arrivals to the replica with the shorter backlog") {
  // One replica overloaded (700 rps against ~490) builds a backlog; at 5 s a second one
  // joins, ready at once. Round robin still gives it half; least-outstanding gives it
  // nearly everything until the backlogs meet.
  auto run = [](LoadBalancing lb) {
    auto c = example1(700.0, 15s, 1);
    c.balancing = lb;
    c.queue_capacity = 100000;
    c.evaluation_interval = 5s;
    std::vector<FleetObservation> seen;
    c.scaling_policy = [&seen](const FleetObservation& o) {
      seen.push_back(o);
      return std::size_t{2};
    };
    (void)tailbatch::simulate_fleet(c, batching);
    return seen;
  };
  const auto rr = run(LoadBalancing::round_robin);
  const auto lor = run(LoadBalancing::least_outstanding);
  REQUIRE(rr.size() == 2);
  REQUIRE(lor.size() == 2);
  REQUIRE(rr[1].ready.size() == 2);
  REQUIRE(lor[1].ready.size() == 2);
  // Interval 5-10 s: replica 0 holds the backlog, replica 1 is new.
  CHECK(std::fabs(rr[1].ready[0].arrival_rps - rr[1].ready[1].arrival_rps) <= 0.2);
  CHECK(lor[1].ready[1].arrival_rps > 1.5 * lor[1].ready[0].arrival_rps);
  CHECK(lor[1].ready[0].mean_queue_depth > lor[1].ready[1].mean_queue_depth);
}

TEST_CASE("a new replica costs from its creation and serves only after the cold start") {
  auto c = example1(200.0, 40s, 1);
  c.cold_start = 12s;
  c.evaluation_interval = 5s;
  std::vector<FleetObservation> seen;
  c.scaling_policy = [&](const FleetObservation& o) {
    seen.push_back(o);
    return std::size_t{3};
  };
  const auto r = tailbatch::simulate_fleet(c, batching);
  REQUIRE(seen.size() >= 4);
  // At 5 s two replicas are ordered; they are ready at 17 s.
  CHECK(seen[0].provisioned == 1);
  CHECK(seen[1].provisioned == 3);  // 10 s
  CHECK(seen[1].starting == 2);
  CHECK(seen[1].ready.size() == 1);
  CHECK(seen[2].ready.size() == 1);  // 15 s
  CHECK(seen[3].ready.size() == 3);  // 20 s
  CHECK(seen[3].starting == 0);
  REQUIRE(r.scale_events.size() == 1);
  CHECK(r.scale_events[0].at == 5s);
  CHECK(r.scale_events[0].from == 1);
  CHECK(r.scale_events[0].to == 3);
  // One replica for 40 s and two more from 5 s on (until the last completion, a few ms later).
  CHECK(r.replica_seconds == Approx(40.0 + 2 * 35.0).epsilon(0.005));
  CHECK(r.max_replicas == 3);
  CHECK(r.timeline[3].ready == 1);
  CHECK(r.timeline[20].ready == 3);
  CHECK(r.timeline[10].replicas == Approx(3.0));
  CHECK(r.timeline[2].replicas == Approx(1.0));
}

TEST_CASE("scaling down drains: no request is lost, the drained replica costs until empty") {
  auto c = example1(1200.0, 20s, 4);
  c.evaluation_interval = 5s;
  c.scaling_policy = [](const FleetObservation& o) { return o.at >= 10s ? std::size_t{3} : o.provisioned; };
  const auto r = tailbatch::simulate_fleet(c, batching);
  CHECK(r.failed == 0);
  CHECK(r.ok == r.arrivals);
  REQUIRE(r.scale_events.size() == 1);
  CHECK(r.scale_events[0].from == 4);
  CHECK(r.scale_events[0].to == 3);
  // The fourth replica left shortly after 10 s, once its queue and lanes were empty.
  CHECK(r.replica_seconds > 4 * 10.0 + 3 * 10.0);
  CHECK(r.replica_seconds < 4 * 10.0 + 3 * 10.0 + 1.0);
  // A starting replica removed before it is ready is simply cancelled.
  auto d = example1(200.0, 20s, 1);
  d.cold_start = 30s;
  d.evaluation_interval = 5s;
  d.scaling_policy = [](const FleetObservation& o) { return o.at == 5s ? std::size_t{2} : std::size_t{1}; };
  const auto q = tailbatch::simulate_fleet(d, batching);
  CHECK(q.replica_seconds == Approx(20.0 + 5.0).epsilon(0.005));
  CHECK(q.ok == q.arrivals);
}

TEST_CASE("overload shows as queue-full failures and seconds of violation") {
  auto c = example1(700.0, 10s, 1);  // 1.4x one replica's saturation
  c.queue_capacity = 256;
  const auto r = tailbatch::simulate_fleet(c, batching);
  CHECK(r.failed > 0);
  CHECK(r.ok + r.failed == r.arrivals);
  CHECK(r.violation_seconds >= 5.0);
  std::uint64_t failed = 0;
  for (const auto& s : r.timeline) failed += s.failed;
  CHECK(failed == r.failed);
  // Two replicas carry it.
  const auto two = tailbatch::simulate_fleet(example1(700.0, 10s, 2), batching);
  CHECK(two.failed == 0);
  CHECK(two.violation_seconds == 0.0);
}

TEST_CASE("the Autoscaler drives a fleet through a spike and back") {
  auto c = example1(300.0, 1s, 2);
  c.arrivals = LoadProfile::steps(tailbatch::ArrivalProcess::poisson,
                                  {{20s, 300.0}, {40s, 1200.0}, {60s, 300.0}});
  c.cold_start = 10s;
  c.evaluation_interval = 5s;
  tailbatch::AutoscalerConfig ac;
  ac.capacity_rps = 410.0;
  ac.slo_p95 = 150ms;
  ac.behavior.scale_down.stabilization_window = 20s;
  tailbatch::Autoscaler scaler(ac);
  c.scaling_policy = [&](const FleetObservation& o) {
    std::vector<tailbatch::ReplicaSignals> s;
    for (const auto& r : o.ready) s.push_back(r.signals());
    return static_cast<std::size_t>(scaler.evaluate(o.time_point(), static_cast<int>(o.provisioned), s).desired_replicas);
  };
  const auto r = tailbatch::simulate_fleet(c, batching);
  // 1200 rps at 287 per replica: 5 replicas at the peak, back to 2 (300 / 287) after.
  CHECK(r.max_replicas >= 5);
  CHECK(r.timeline[55].ready >= 5);
  CHECK(r.timeline[119].ready <= 2);
  CHECK(r.ok + r.failed == r.arrivals);
  // Without scaling the same spike overwhelms the starting fleet for the whole peak.
  auto fixed = c;
  fixed.scaling_policy = {};
  const auto f = tailbatch::simulate_fleet(fixed, batching);
  CHECK(f.violation_seconds >= 35.0);
  CHECK(r.violation_seconds < 20.0);
  CHECK(r.failed < f.failed / 2);
}

TEST_CASE("the same seed gives the same run; another seed another") {
  auto c = example1(900.0, 15s, 2);
  c.evaluation_interval = 5s;
  c.scaling_policy = [](const FleetObservation& o) { return o.ready.front().p95 > 60ms ? o.provisioned + 1 : o.provisioned; };
  const auto a = tailbatch::simulate_fleet(c, batching);
  const auto b = tailbatch::simulate_fleet(c, batching);
  CHECK(a.arrivals == b.arrivals);
  CHECK(a.p99 == b.p99);
  CHECK(a.replica_seconds == b.replica_seconds);
  CHECK(a.scale_events.size() == b.scale_events.size());
  for (std::size_t i = 0; i < a.timeline.size(); ++i) CHECK(a.timeline[i].p95 == b.timeline[i].p95);
  c.seed = 43;
  const auto d = tailbatch::simulate_fleet(c, batching);
  CHECK(d.arrivals != a.arrivals);
}

TEST_CASE("bad fleet configuration throws std::invalid_argument naming the field") {
  // Example 1 with one field spoiled: the message names that field.
  const auto invalid = [](void (*spoil)(FleetConfig&), const char* field) {
    INFO(field);
    auto c = example1(100.0, 1s);
    spoil(c);
    CHECK_INVALID((void)tailbatch::simulate_fleet(c, batching), field);
  };
  invalid([](FleetConfig& c) { c.service_time = {}; }, "service_time");
  invalid([](FleetConfig& c) { c.lanes = 0; }, "lanes");
  invalid([](FleetConfig& c) { c.initial_replicas = 0; }, "initial_replicas");
  invalid([](FleetConfig& c) { c.cold_start = -1s; }, "cold_start");
  invalid([](FleetConfig& c) { c.evaluation_interval = 0s; }, "evaluation_interval");
  invalid([](FleetConfig& c) { c.timeline_step = 0s; }, "timeline_step");
  invalid([](FleetConfig& c) { c.queue_capacity = 0; }, "queue_capacity");
  invalid([](FleetConfig& c) { c.max_replicas = 0; }, "max_replicas");
}

TEST_CASE("a scaling policy that throws ends the run with its exception, no request touched after") {
  auto c = example1(900.0, 10s, 1);  // overloaded: requests are queued when the policy runs
  c.evaluation_interval = 2s;
  c.scaling_policy = [](const FleetObservation& o) -> std::size_t {
    if (o.ready.front().queue_depth > 0) throw std::runtime_error("policy failed");
    return o.provisioned;
  };
  CHECK_THROWS_AS((void)tailbatch::simulate_fleet(c, batching), std::runtime_error);
}
