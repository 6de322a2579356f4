// capacity_walkthrough: the latency field guide's Exercise (docs/latency-field-guide.md),
// planned and then checked by simulation.
//
//   Target: p95 < 150 ms at 600 rps for a text classifier. Model: 18 ms at batch 1, plus
//   2.5 ms per extra item. Network 4 ms; batch window 6 ms for batch > 1. Two streams.
//   Tail inflation about +20 %.
//
// The planner (tailbatch/tools/planner.hpp) does the field guide's arithmetic for every batch
// size and recommends one; the simulator (tailbatch/tools/simulator.hpp) then runs the real
// Pipeline with a FixedWindow on the modelled model, at the load each replica would carry,
// and reports the p50/p95 and throughput that configuration would actually see. Runs in well
// under a second; the numbers are the same on every machine (same seed, same standard
// library), except the CPU time each simulation took.
#include <tailbatch/tools/planner.hpp>
#include <tailbatch/tools/simulator.hpp>

#include <fmt/core.h>

#include <chrono>
#include <ctime>

using namespace std::chrono_literals;

int main() {
  // 1. Plan.
  tailbatch::PlannerConfig plan_cfg;
  plan_cfg.profile = tailbatch::LatencyProfile::linear(18.0, 2.5);
  plan_cfg.network_ms = 4.0;
  plan_cfg.window_ms = 6.0;
  plan_cfg.streams = 2;
  plan_cfg.tail = 1.2;
  plan_cfg.slo_p95_ms = 150.0;
  plan_cfg.target_rps = 600.0;
  plan_cfg.headroom = 0.3;
  const tailbatch::CapacityPlan plan = tailbatch::plan_capacity(plan_cfg);
  fmt::print("planner: {}\n\n", plan.reason);

  // 2. Simulate the candidates worth considering, at the load each replica would carry with
  //    the replica count the plan asks for (headroom included).
  fmt::print("{:>5} {:>9} {:>9} {:>11} | {:>9} {:>9} {:>9} {:>9} {:>10} {:>8}\n", "batch", "replicas", "planner",
             "planner", "load per", "sim p50", "sim p95", "sim thru", "sim mean", "sim CPU");
  fmt::print("{:>5} {:>9} {:>9} {:>11} | {:>9} {:>9} {:>9} {:>9} {:>10} {:>8}\n", "", "+headroom", "p95 ms",
             "rps/inst", "replica", "ms", "ms", "rps", "batch", "ms");
  for (int b : {1, 8, 10, 16, 32, 39}) {
    const tailbatch::BatchPlan p = tailbatch::plan_batch(plan_cfg, b);
    const int replicas = *p.replicas_with_headroom;
    const double per_replica = 600.0 / replicas;

    tailbatch::SimulationConfig sim;
    sim.arrivals = tailbatch::LoadProfile::poisson(per_replica, 120s);
    sim.warmup = 10s;
    sim.lanes = 2;
    sim.service_time = tailbatch::LinearCost{18ms, 2500us};
    sim.network = 4ms;
    const auto t0 = std::clock();
    const auto window = b > 1 ? 6ms : 0ms;
    const tailbatch::SimulationResult r =
        tailbatch::simulate(sim, tailbatch::FixedWindow(static_cast<std::size_t>(b), window));
    const double cpu_ms = static_cast<double>(std::clock() - t0) * 1000.0 / CLOCKS_PER_SEC;
    auto ms = [](std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); };
    fmt::print("{:>5} {:>9} {:>9.1f} {:>11.1f} | {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>10.2f} {:>8.1f}\n", b, replicas,
               p.p95_ms, p.instance_rps, per_replica, ms(r.p50), ms(r.p95), r.throughput_rps, r.mean_batch_size,
               cpu_ms);
  }

  // 3. The same recommended batch size at the full 600 rps on one replica: what "1 replica,
  //    no headroom" would mean.
  const auto* rec = plan.recommendation();
  if (rec != nullptr) {
    tailbatch::SimulationConfig sim;
    sim.arrivals = tailbatch::LoadProfile::poisson(600.0, 120s);
    sim.warmup = 10s;
    sim.lanes = 2;
    sim.service_time = tailbatch::LinearCost{18ms, 2500us};
    sim.network = 4ms;
    const auto r = tailbatch::simulate(sim, tailbatch::FixedWindow(static_cast<std::size_t>(rec->batch_size), 6ms));
    fmt::print("\nbatch {} on ONE replica at 600 rps: simulated p95 {:.1f} ms, throughput {:.1f} rps, mean batch {:.1f}\n",
               rec->batch_size, std::chrono::duration<double, std::milli>(r.p95).count(), r.throughput_rps,
               r.mean_batch_size);
  }
  return 0;
}
