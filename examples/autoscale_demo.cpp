// autoscale_demo: the latency field guide's spike-and-autoscale project, simulated.
//
// A fleet of replicas of the latency field guide's Example 1 classifier (a batch of b costs
// 20 + 3·(b − 1) ms, 2 lanes per replica, 5 ms network, FixedWindow 8 ms / 16 per replica)
// sits behind a least-outstanding-requests load balancer. The load rises from a base rate
// to three times it and falls back (a traffic spike; by default each change takes 90 s, and
// --ramp-s 0 makes it a step). A new replica takes 30 s to become ready. Three policies
// size the fleet:
//
//   tailbatch    tailbatch::Autoscaler: capacity per replica from the planner, 70 % target
//                utilisation, queue and p95 triggers, the rise of the rate over a replica's
//                start-up time;
//   hpa_cpu      Kubernetes HPA's formula on CPU (lane) utilisation:
//                desired = ceil(current × utilisation / 70 %), with HPA's 10 % tolerance and
//                its treatment of replicas still starting;
//   fixed_peak   a fixed fleet sized for the peak at the same 70 % target.
//
// Both autoscaling policies are evaluated at the same interval and share the same
// ScalingBehavior (HPA's behaviour-field semantics: immediate, rate-limited scale-up;
// scale-down after a stabilisation window). Per policy it prints seconds of SLO violation
// (1-second steps whose p95 exceeds the SLO, a failed request counting as infinitely
// late), p95 and p99 over the run, replica-seconds (cost) and the most replicas; with
// --json one object per policy. It writes SVG plots of p95 and of replicas over time.
//
//   autoscale_demo [--json] [--out-dir DIR] [--base-rps 1000] [--peak-rps 3000] [--ramp-s 90]
//                  [--cold-start-s 30] [--interval-s 5] [--scale-down-window-s 120]
//                  [--slo-p95-ms 150] [--round-robin] [--seed 42]
//
// Why 1000 -> 3000 rps and not 100 -> 300: one replica of this profile serves about 410
// requests/s within the SLO (tailbatch-plan), so 100 -> 300 would never need a second
// replica. The shape is the same; the fleet has something to do. Runs in about a second.
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/tools/fleet_simulator.hpp>
#include <tailbatch/tools/planner.hpp>
#include <tailbatch/tools/svg_plot.hpp>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using namespace std::chrono;
using namespace std::chrono_literals;

struct Options {
  bool json = false;
  std::string out_dir;
  double base_rps = 1000.0;
  double peak_rps = 3000.0;
  double ramp_s = 90.0;
  double cold_start_s = 30.0;
  double interval_s = 5.0;
  double scale_down_window_s = 120.0;
  double slo_p95_ms = 150.0;
  // HPA's target utilisation for hpa_cpu; the Autoscaler and the peak fleet keep 70 %.
  double hpa_target = 0.7;
  bool round_robin = false;
  std::uint64_t seed = 42;
};

struct Run {
  std::string policy;
  tailbatch::FleetResult result;
};

double ms(nanoseconds d) { return duration<double, std::milli>(d).count(); }
nanoseconds secs(double s) { return duration_cast<nanoseconds>(duration<double>(s)); }

// base for 120 s, up to the peak (in 5 s steps over ramp_s), the peak for 180 s, down
// again, base for 240 s.
tailbatch::LoadProfile spike(const Options& o) {
  std::vector<tailbatch::LoadPhase> phases;
  phases.push_back({120s, o.base_rps});
  const int ramp_steps = static_cast<int>(std::lround(o.ramp_s / 5.0));
  for (int i = 1; i <= ramp_steps; ++i)
    phases.push_back({5s, o.base_rps + (o.peak_rps - o.base_rps) * i / (ramp_steps + 1)});
  phases.push_back({180s, o.peak_rps});
  for (int i = ramp_steps; i >= 1; --i)
    phases.push_back({5s, o.base_rps + (o.peak_rps - o.base_rps) * i / (ramp_steps + 1)});
  phases.push_back({240s, o.base_rps});
  return tailbatch::LoadProfile::steps(tailbatch::ArrivalProcess::poisson, std::move(phases));
}

// One replica's capacity within the SLO, from the planner (the latency field guide's Example 1 at batch
// 16: 410 requests/s).
double planned_capacity(const Options& o) {
  tailbatch::PlannerConfig p;
  p.profile = tailbatch::LatencyProfile::linear(20.0, 3.0);
  p.network_ms = 5.0;
  p.window_ms = 8.0;
  p.streams = 2;
  p.slo_p95_ms = o.slo_p95_ms;
  p.preferred = {16};
  const auto plan = tailbatch::plan_capacity(p);
  if (plan.recommendation() == nullptr) throw std::runtime_error("no batch size meets the SLO");
  return plan.recommendation()->instance_rps;
}

tailbatch::ScalingBehaviorConfig behavior(const Options& o) {
  tailbatch::ScalingBehaviorConfig b;  // HPA's defaults, with a shorter scale-down window
  b.scale_down.stabilization_window = secs(o.scale_down_window_s);
  return b;
}

// Kubernetes HPA on CPU utilisation: desired = ceil(current × utilisation / target) over
// the ready replicas, unchanged within the 10 % tolerance; replicas still starting count
// as 0 % busy when scaling up (so capacity on its way is not ordered again), as the HPA
// controller does for pods that are not yet ready.
std::size_t hpa_cpu(const tailbatch::FleetObservation& o, double target, tailbatch::ScalingBehavior& b) {
  const int current = static_cast<int>(o.provisioned);
  if (o.ready.empty()) return o.provisioned;
  double busy = 0.0;
  for (const auto& r : o.ready) busy += r.utilization;
  const double ratio = busy / static_cast<double>(o.ready.size()) / target;
  int rec = current;
  if (std::fabs(ratio - 1.0) > 0.1) {
    rec = static_cast<int>(std::ceil(busy / target - 1e-9));
    if (o.starting > 0 && ratio > 1.0 && rec < current) rec = current;
  }
  return static_cast<std::size_t>(std::max(1, b.apply(o.time_point(), current, rec)));
}

tailbatch::FleetConfig fleet_config(const Options& o) {
  tailbatch::FleetConfig c;
  c.arrivals = spike(o);
  c.seed = o.seed;
  c.lanes = 2;
  c.service_time = tailbatch::LinearCost{20ms, 3ms};
  c.network = 5ms;
  c.balancing = o.round_robin ? tailbatch::LoadBalancing::round_robin : tailbatch::LoadBalancing::least_outstanding;
  c.cold_start = secs(o.cold_start_s);
  c.evaluation_interval = secs(o.interval_s);
  c.slo_p95 = duration_cast<nanoseconds>(duration<double, std::milli>(o.slo_p95_ms));
  c.max_replicas = 200;
  return c;
}

std::vector<Run> run_all(const Options& o) {
  const double capacity = planned_capacity(o);
  const double target = 0.7;
  const tailbatch::FixedWindow batching(16, 8ms);
  const auto per_replica = [&](double rps) {
    return static_cast<std::size_t>(std::max(1.0, std::ceil(rps / (capacity * target) - 1e-9)));
  };
  std::vector<Run> runs;

  {  // tailbatch's Autoscaler
    tailbatch::AutoscalerConfig ac;
    ac.capacity_rps = capacity;
    ac.target_utilization = target;
    ac.slo_p95 = duration_cast<nanoseconds>(duration<double, std::milli>(o.slo_p95_ms));
    // Plan for the rate expected when a replica ordered now can first be followed by
    // another: a start-up plus an evaluation interval ahead, from the last 10 s of rise.
    ac.lead_time = secs(o.cold_start_s + o.interval_s);
    ac.trend_window = 10s;
    ac.min_replicas = 1;
    ac.max_replicas = 200;
    ac.behavior = behavior(o);
    tailbatch::Autoscaler scaler(ac);
    auto c = fleet_config(o);
    c.initial_replicas = per_replica(o.base_rps);
    c.scaling_policy = [&](const tailbatch::FleetObservation& obs) {
      std::vector<tailbatch::ReplicaSignals> signals;
      for (const auto& r : obs.ready) signals.push_back(r.signals());
      return static_cast<std::size_t>(
          scaler.evaluate(obs.time_point(), static_cast<int>(obs.provisioned), signals).desired_replicas);
    };
    runs.push_back({"tailbatch", tailbatch::simulate_fleet(c, batching)});
  }
  {  // HPA on CPU utilisation, same behaviour rules
    tailbatch::ScalingBehavior b(behavior(o));
    auto c = fleet_config(o);
    c.initial_replicas = per_replica(o.base_rps);
    c.scaling_policy = [&](const tailbatch::FleetObservation& obs) { return hpa_cpu(obs, o.hpa_target, b); };
    runs.push_back({"hpa_cpu", tailbatch::simulate_fleet(c, batching)});
  }
  {  // a fixed fleet sized for the peak
    auto c = fleet_config(o);
    c.initial_replicas = per_replica(o.peak_rps);
    runs.push_back({"fixed_peak", tailbatch::simulate_fleet(c, batching)});
  }
  return runs;
}

void write_plots(const Options& o, const std::vector<Run>& runs) {
  std::filesystem::create_directories(o.out_dir);
  const std::string subtitle =
      fmt::format("simulated: Example 1 profile, 2 lanes/replica, {:.0f} -> {:.0f} rps, {:.0f} s cold start, "
                  "least-outstanding LB (autoscale_demo --out-dir ...)",
                  o.base_rps, o.peak_rps, o.cold_start_s);
  const char* colors[] = {"#1f77b4", "#d62728", "#7f7f7f"};
  tailbatch::LinePlot p95;
  p95.title = "p95 latency over time, per 1 s of arrivals";
  p95.subtitle = subtitle;
  p95.x_label = "time (s)";
  p95.y_label = "p95 (ms, log scale; failures plotted at 10 s)";
  p95.y_scale = tailbatch::AxisScale::log;
  p95.horizontal.push_back({o.slo_p95_ms, fmt::format("SLO {:.0f} ms", o.slo_p95_ms)});
  tailbatch::LinePlot reps;
  reps.title = "replicas over time";
  reps.subtitle = subtitle;
  reps.x_label = "time (s)";
  reps.y_label = "replicas provisioned (starting, ready or draining)";
  reps.y_min = 0.0;
  tailbatch::PlotSeries load{"offered load / 100 (rps)", {}, "#2ca02c", true, false};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    tailbatch::PlotSeries a{runs[i].policy, {}, colors[i % 3], false, false};
    tailbatch::PlotSeries b{runs[i].policy, {}, colors[i % 3], false, false};
    for (const auto& s : runs[i].result.timeline) {
      const double t = duration<double>(s.start).count();
      if (s.arrivals > 0) a.points.push_back({t, std::min(ms(s.p95), 10000.0)});
      b.points.push_back({t, s.replicas});
      if (i == 0) load.points.push_back({t, static_cast<double>(s.arrivals) / 100.0});
    }
    p95.series.push_back(std::move(a));
    reps.series.push_back(std::move(b));
  }
  reps.series.push_back(std::move(load));
  const auto dir = std::filesystem::path(o.out_dir);
  tailbatch::write_svg((dir / "p95.svg").string(), p95);
  tailbatch::write_svg((dir / "replicas.svg").string(), reps);
  if (!o.json) fmt::print("plots: {} {}\n", (dir / "p95.svg").string(), (dir / "replicas.svg").string());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"autoscale_demo: a traffic spike under three scaling policies (simulated)"};
  app.add_flag("--json", o.json, "one JSON object per policy");
  app.add_option("--out-dir", o.out_dir, "write p95.svg and replicas.svg here");
  app.add_option("--base-rps", o.base_rps, "load before and after the spike")->check(CLI::PositiveNumber);
  app.add_option("--peak-rps", o.peak_rps, "load at the spike's peak")->check(CLI::PositiveNumber);
  app.add_option("--ramp-s", o.ramp_s, "seconds the load takes to rise and to fall (0: a step)")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--cold-start-s", o.cold_start_s, "seconds from a replica's creation until it is ready")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--interval-s", o.interval_s, "seconds between evaluations of the autoscaling policies")
      ->check(CLI::Range(0.5, 120.0));
  app.add_option("--scale-down-window-s", o.scale_down_window_s, "scale-down stabilisation window (both autoscalers)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--slo-p95-ms", o.slo_p95_ms, "the p95 objective")->check(CLI::PositiveNumber);
  app.add_option("--hpa-target", o.hpa_target,
                 "hpa_cpu's target utilisation (0.7 as the others by default; raise it to compare at equal cost)")
      ->check(CLI::Range(0.05, 1.0));
  app.add_flag("--round-robin", o.round_robin, "round-robin load balancing instead of least outstanding requests");
  app.add_option("--seed", o.seed, "arrival seed");
  CLI11_PARSE(app, argc, argv);

  try {
    const std::vector<Run> runs = run_all(o);
    if (o.json) {
      fmt::print("[\n");
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const auto& r = runs[i].result;
        fmt::print("  {{\"policy\": \"{}\", \"violation_s\": {:.0f}, \"p95_ms\": {:.1f}, \"p99_ms\": {:.1f}, "
                   "\"replica_s\": {:.0f}, \"max_replicas\": {}}}{}\n",
                   runs[i].policy, r.violation_seconds, ms(r.p95), ms(r.p99), r.replica_seconds, r.max_replicas,
                   i + 1 < runs.size() ? "," : "");
      }
      fmt::print("]\n");
    } else {
      fmt::print("spike {:.0f} -> {:.0f} -> {:.0f} rps ({:.0f} s ramps), {:.0f} s cold start, p95 SLO {:.0f} ms, "
                 "replica capacity {:.0f} rps (planner), {} balancing\n\n",
                 o.base_rps, o.peak_rps, o.base_rps, o.ramp_s, o.cold_start_s, o.slo_p95_ms, planned_capacity(o),
                 o.round_robin ? "round-robin" : "least-outstanding");
      fmt::print("{:<12} {:>12} {:>9} {:>9} {:>11} {:>13} {:>8}\n", "policy", "violation_s", "p95_ms", "p99_ms",
                 "replica_s", "max_replicas", "failed");
      for (const auto& run : runs) {
        const auto& r = run.result;
        fmt::print("{:<12} {:>12.0f} {:>9.1f} {:>9.1f} {:>11.0f} {:>13} {:>8}\n", run.policy, r.violation_seconds,
                   ms(r.p95), ms(r.p99), r.replica_seconds, r.max_replicas, r.failed);
      }
      const auto& a = runs[0].result;
      const auto& h = runs[1].result;
      const auto& f = runs[2].result;
      fmt::print("\ntailbatch vs hpa_cpu:    {:.0f} vs {:.0f} violation s at {:.2f}x the replica-seconds\n",
                 a.violation_seconds, h.violation_seconds, a.replica_seconds / h.replica_seconds);
      fmt::print("tailbatch vs fixed_peak: {:.0f} vs {:.0f} violation s at {:.2f}x the replica-seconds\n",
                 a.violation_seconds, f.violation_seconds, a.replica_seconds / f.replica_seconds);
    }
    if (!o.out_dir.empty()) write_plots(o, runs);
  } catch (const std::exception& e) {
    fmt::print(stderr, "autoscale_demo: {}\n", e.what());
    return 1;
  }
  return 0;
}
