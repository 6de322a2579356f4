// Fleet simulator: N replicas of a batching server behind a load balancer, with replicas
// that take time to start and a replica count chosen by a scaling policy: the latency
// field guide's spike-and-autoscale project, in milliseconds of CPU.
//
// Each replica is the one-replica model of simulator.hpp: the real Pipeline, stepped by
// poll() on the simulation's ManualClock, with the same BatchPolicy, on `lanes` modelled
// lanes where a batch of b requests holds its lane for service_time(b) + lane_overhead.
// Around them:
//
//   * the load balancer sends each arrival to a ready replica, in turn (round_robin) or
//     to the one with the fewest requests outstanding (least_outstanding: queued or
//     executing, as Envoy's LEAST_REQUEST and Kubernetes-native gateways do);
//   * a replica added by the policy starts at once (it costs from then on) and receives
//     traffic only cold_start later, when it is ready;
//   * every evaluation_interval the scaling policy sees each ready replica's readings over
//     the interval (arrival rate, queue depth and in-flight averaged over time, p95, mean
//     latency, lane utilisation) and returns the replica count it wants;
//   * a replica removed by the policy stops receiving traffic (readiness off) and leaves
//     once what it holds has completed, so a scale-down loses no request; a replica still
//     starting is simply cancelled.
//
// The result is a timeline (per timeline_step: arrivals, failures, p95/p99 of the requests
// that arrived in it, replicas), seconds of SLO violation, replica-seconds (cost) and
// the scale events. simulate_fleet() is single-threaded and owns no threads; results are
// exactly reproducible for the same configuration and seed (with the same standard
// library).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include <tailbatch/autoscaler.hpp>
#include <tailbatch/tools/simulator.hpp>

namespace tailbatch {

// How the load balancer picks a replica.
enum class LoadBalancing : std::uint8_t {
  round_robin,        // each ready replica in turn
  least_outstanding,  // the ready replica with the fewest requests queued or executing
};

// A short, stable, lower-case name ("round_robin"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(LoadBalancing b) noexcept {
  return b == LoadBalancing::round_robin ? "round_robin" : "least_outstanding";
}

// One ready replica's readings over the last evaluation interval (or since it became
// ready, if that was later).
struct ReplicaObservation {
  std::size_t id = 0;                 // replicas are numbered from 0 in order of creation
  double arrival_rps = 0.0;           // requests routed to it per second
  double rejected_rps = 0.0;          // of them, refused by its full queue
  double completion_rps = 0.0;        // requests it completed per second
  double mean_queue_depth = 0.0;      // requests waiting, averaged over time
  double mean_in_flight = 0.0;        // requests in executing batches, averaged over time
  std::size_t queue_depth = 0;        // waiting now
  std::size_t in_flight = 0;          // executing now
  std::chrono::nanoseconds p95{0};    // end to end (network included) of its completions; 0: none
  std::chrono::nanoseconds mean_latency{0};  // arrival to completion inside the replica; 0: none
  double utilization = 0.0;           // busy lane time / (lanes × the interval): "CPU utilisation"

  // The readings as the Autoscaler takes them (interval averages for queue and in-flight).
  // Never throws. Thread-safe.
  [[nodiscard]] ReplicaSignals signals() const noexcept {
    ReplicaSignals s;
    s.arrival_rps = arrival_rps;
    s.rejected_rps = rejected_rps;
    s.queue_depth = mean_queue_depth;
    s.in_flight = mean_in_flight;
    s.p95 = p95;
    s.mean_latency = mean_latency;
    return s;
  }
};

// What the scaling policy sees at an evaluation.
struct FleetObservation {
  std::chrono::nanoseconds at{0};        // since the start of the run
  std::chrono::nanoseconds interval{0};  // since the previous evaluation
  std::size_t provisioned = 0;           // ready + starting (draining replicas excluded)
  std::size_t starting = 0;
  std::vector<ReplicaObservation> ready;  // one per ready replica, by id

  // The steady-clock time of this evaluation on the simulation's ManualClock, for
  // policies (the Autoscaler) that take a time point. Thread-safe.
  [[nodiscard]] std::chrono::steady_clock::time_point time_point() const noexcept { return ManualClock::start() + at; }
};

// What to simulate. A plain aggregate; simulate_fleet() validates it and throws
// std::invalid_argument naming the field.
struct FleetConfig {
  LoadProfile arrivals = LoadProfile::poisson(100.0, std::chrono::seconds(60));
  std::uint64_t seed = 42;
  // Per replica: lanes, the model's time per batch (required), per-batch overhead holding
  // the lane, and the bounded queue (arrivals beyond it fail: rejected/queue_full).
  std::size_t lanes = 1;
  std::function<std::chrono::nanoseconds(std::size_t batch_size)> service_time{};
  std::chrono::nanoseconds lane_overhead{0};
  std::size_t queue_capacity = 4096;
  // A request's cost, for policies that read it (TokenBudget); by request index.
  std::function<std::size_t(std::uint64_t index)> request_cost{};
  // Added to every request's latency; holds no lane.
  std::chrono::nanoseconds network{0};
  LoadBalancing balancing = LoadBalancing::least_outstanding;
  // Replicas ready at the start.
  std::size_t initial_replicas = 1;
  // The policy's answer is clamped to [1, max_replicas].
  std::size_t max_replicas = 1000;
  // From a replica's creation until it receives traffic.
  std::chrono::nanoseconds cold_start{0};
  std::chrono::nanoseconds evaluation_interval = std::chrono::seconds(15);
  // Called every evaluation_interval while arrivals last; returns the replica count to
  // run. Empty: the fleet stays at initial_replicas.
  std::function<std::size_t(const FleetObservation&)> scaling_policy{};
  // A timeline step whose p95 (failures counted as infinitely late) exceeds this is a
  // violation. 0: none counted.
  std::chrono::nanoseconds slo_p95{0};
  std::chrono::nanoseconds timeline_step = std::chrono::seconds(1);
  std::uint64_t max_requests = 50'000'000;
  LatencyHistogramConfig histogram{};
};

// One step of the timeline.
struct FleetSample {
  std::chrono::nanoseconds start{0};  // offset of the step from the run's start
  std::uint64_t arrivals = 0;         // requests that arrived in the step
  std::uint64_t failed = 0;           // of those, completed other than ok
  std::chrono::nanoseconds p95{0}, p99{0};  // of those (failures as the maximum); 0: none
  bool violation = false;             // p95 > slo_p95 (or a failure at p95)
  double replicas = 0.0;              // provisioned (starting, ready or draining), time-averaged
  std::size_t ready = 0;              // ready at the step's end
};

// A change of the replica count.
struct FleetScaleEvent {
  std::chrono::nanoseconds at{0};
  std::size_t from = 0;  // provisioned before (ready + starting)
  std::size_t to = 0;    // the policy's (clamped) answer
};

// What a fleet simulation measured.
struct FleetResult {
  std::uint64_t arrivals = 0;
  std::uint64_t ok = 0;
  std::uint64_t failed = 0;            // rejected (queue full) or no ready replica
  HistogramSnapshot latency;           // ok requests, end to end
  std::chrono::nanoseconds p50{0}, p95{0}, p99{0};
  double violation_seconds = 0.0;      // steps in violation × timeline_step
  double replica_seconds = 0.0;        // provisioned replicas integrated over the run
  std::size_t max_replicas = 0;        // the most provisioned at once (draining included)
  std::size_t evaluations = 0;
  std::vector<FleetSample> timeline;   // over the load profile's duration
  std::vector<FleetScaleEvent> scale_events;
  std::chrono::nanoseconds simulated{0};  // until the last request completed
};

namespace tools::detail {

template <BatchPolicy Policy>
struct FleetReplica {
  enum class State : std::uint8_t { starting, ready, draining };
  using Pipe = Pipeline<SimRequest, SimResponse, Policy, SimLanes, AdmitAll, ManualClock>;

  FleetReplica(std::size_t i, std::size_t lanes_n, ManualClock clock) : id(i), lanes(lanes_n, std::move(clock)) {}

  std::size_t id;
  State state = State::starting;
  BatchTime ready_at{};
  SimLanes lanes;
  std::unique_ptr<Pipe> pipeline;
  BatchTime wake_at = BatchTime::max();  // when a poll may dispatch without new arrivals
  BatchTime next_due = BatchTime::max();
  bool touched = false;                  // received an arrival since its last poll
  std::size_t queued = 0, executing = 0;
  // Interval readings, reset at each evaluation.
  BatchTime interval_start{};
  std::uint64_t routed = 0, completed = 0, rejected = 0;
  std::vector<std::int64_t> latencies;   // end to end, ns
  double inside_s = 0.0;                 // summed time inside the replica
  double queue_area = 0.0, exec_area = 0.0, busy_s = 0.0;

  [[nodiscard]] std::size_t outstanding() const noexcept { return queued + executing; }
};

struct FleetFinish {
  BatchTime at;
  std::uint64_t order;
  std::size_t replica;
  bool operator>(const FleetFinish& o) const noexcept { return at != o.at ? at > o.at : order > o.order; }
};

[[nodiscard]] inline std::chrono::nanoseconds nth_percentile(std::vector<std::int64_t>& v, double p) {
  if (v.empty()) return std::chrono::nanoseconds{0};
  const auto k = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) - 1;
  const auto idx = std::min(k, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx), v.end());
  return std::chrono::nanoseconds(v[idx]);
}

}  // namespace tools::detail

// Runs the fleet: config.arrivals through a load balancer onto replicas each running a
// copy of `policy`, scaled by config.scaling_policy, until every request has completed.
// Single-threaded; allocates; costs about a microsecond of CPU per simulated request.
// Throws std::invalid_argument naming a bad field of config (or what the Pipeline's
// constructor throws for the policy), and whatever the scaling policy throws. Thread-safe
// (each call has its own clock and state; the scaling policy is called from this thread).
template <BatchPolicy Policy>
  requires std::copy_constructible<Policy>
[[nodiscard]] FleetResult simulate_fleet(const FleetConfig& config, const Policy& policy) {
  using namespace std::chrono;
  using Replica = tools::detail::FleetReplica<Policy>;
  using State = typename Replica::State;
  if (!config.service_time) detail::throw_invalid_argument("FleetConfig: service_time must be set");
  if (config.lanes < 1) detail::throw_invalid_argument("FleetConfig: lanes must be >= 1");
  if (config.lane_overhead < nanoseconds::zero()) detail::throw_invalid_argument("FleetConfig: lane_overhead must be >= 0");
  if (config.network < nanoseconds::zero()) detail::throw_invalid_argument("FleetConfig: network must be >= 0");
  if (config.queue_capacity < 1) detail::throw_invalid_argument("FleetConfig: queue_capacity must be >= 1");
  if (config.max_replicas < 1) detail::throw_invalid_argument("FleetConfig: max_replicas must be >= 1");
  if (config.initial_replicas < 1 || config.initial_replicas > config.max_replicas)
    detail::throw_invalid_argument("FleetConfig: initial_replicas must be in [1, max_replicas]");
  if (config.cold_start < nanoseconds::zero()) detail::throw_invalid_argument("FleetConfig: cold_start must be >= 0");
  if (config.evaluation_interval <= nanoseconds::zero())
    detail::throw_invalid_argument("FleetConfig: evaluation_interval must be > 0");
  if (config.slo_p95 < nanoseconds::zero()) detail::throw_invalid_argument("FleetConfig: slo_p95 must be >= 0");
  if (config.timeline_step <= nanoseconds::zero())
    detail::throw_invalid_argument("FleetConfig: timeline_step must be > 0");
  if constexpr (detail::policy_uses_cost<Policy>()) {
    if (!config.request_cost)
      detail::throw_invalid_argument("FleetConfig: request_cost must be set for a policy that reads request cost");
  }

  ManualClock clock;
  const BatchTime start = clock.now();
  const nanoseconds run_length = config.arrivals.duration();
  const std::size_t steps = static_cast<std::size_t>((run_length + config.timeline_step - nanoseconds(1)) / config.timeline_step);

  FleetResult r;
  r.timeline.resize(steps);
  for (std::size_t i = 0; i < steps; ++i) r.timeline[i].start = config.timeline_step * static_cast<std::int64_t>(i);
  std::vector<std::vector<std::int64_t>> by_step(steps);
  LatencyHistogram hist(config.histogram);
  constexpr std::int64_t failed_latency = std::numeric_limits<std::int64_t>::max();

  std::priority_queue<tools::detail::FleetFinish, std::vector<tools::detail::FleetFinish>, std::greater<>> finishes;
  std::uint64_t finish_order = 0;
  BatchTime last_completion = start;

  auto record_step = [&](BatchTime arrival, std::int64_t latency_ns) {
    const auto off = arrival - start;
    const auto i = static_cast<std::size_t>(off / config.timeline_step);
    if (i < steps) {
      by_step[i].push_back(latency_ns);
      if (latency_ns == failed_latency) ++r.timeline[i].failed;
    }
  };

  // The context every request's callback reaches: 8 bytes of pointer, so that with the
  // replica pointer and the arrival the callable stays within the Pipeline's inline size.
  struct Context {
    const FleetConfig* config;
    FleetResult* result;
    LatencyHistogram* hist;
    decltype(finishes)* finish_queue;
    std::uint64_t* finish_order;
    BatchTime* last_completion;
    decltype(record_step)* record;
  } ctx{&config, &r, &hist, &finishes, &finish_order, &last_completion, &record_step};

  // Declared after everything the requests' callbacks reach, so that if the scaling policy
  // throws, the replicas (whose destructors complete what they still hold) go first.
  std::vector<std::unique_ptr<Replica>> replicas;  // alive: starting, ready or draining
  std::size_t next_id = 0;

  auto provision = [&](BatchTime now, bool ready_now) {
    auto rep = std::make_unique<Replica>(next_id++, config.lanes, clock);
    Replica* p = rep.get();
    auto model = [p, &config](std::span<const tools::detail::SimRequest> reqs, std::span<tools::detail::SimResponse> resps,
                             tools::detail::SimLane& lane) {
      const auto service = duration_cast<nanoseconds>(config.service_time(reqs.size())) + config.lane_overhead;
      const BatchTime now_t = p->pipeline->clock().now();
      const BatchTime finish = now_t + std::max(service, nanoseconds::zero());
      lane.busy_until = finish;
      p->busy_s += duration<double>(finish - now_t).count();
      for (auto& resp : resps) resp.finish = finish;
    };
    PipelineConfig<tools::detail::SimRequest> pc;
    pc.queue_capacity = config.queue_capacity;
    pc.workers = 0;
    if constexpr (detail::policy_uses_cost<Policy>()) {
      pc.request_cost = [&config](const tools::detail::SimRequest& q) { return config.request_cost(q.index); };
    }
    p->pipeline = std::make_unique<typename Replica::Pipe>(model, Policy(policy), std::move(pc), p->lanes, clock);
    p->state = ready_now ? State::ready : State::starting;
    p->ready_at = ready_now ? now : now + config.cold_start;
    p->interval_start = p->ready_at;
    replicas.push_back(std::move(rep));
  };

  auto provisioned = [&] {
    std::size_t n = 0;
    for (const auto& p : replicas) n += p->state != State::draining ? 1 : 0;
    return n;
  };

  for (std::size_t i = 0; i < config.initial_replicas; ++i) provision(start, true);

  // Time integrals: per replica queue and execution, fleet replica count per step.
  BatchTime last = start;
  auto integrate = [&](BatchTime to) {
    if (to <= last) return;
    const double dt = duration<double>(to - last).count();
    for (auto& p : replicas) {
      p->queue_area += static_cast<double>(p->queued) * dt;
      p->exec_area += static_cast<double>(p->executing) * dt;
    }
    const double n = static_cast<double>(replicas.size());
    r.replica_seconds += n * dt;
    BatchTime from = last;
    while (from < to) {
      const auto i = static_cast<std::size_t>((from - start) / config.timeline_step);
      if (i >= steps) break;
      const BatchTime step_end = start + config.timeline_step * static_cast<std::int64_t>(i + 1);
      const BatchTime seg = std::min(to, step_end);
      r.timeline[i].replicas += n * duration<double>(seg - from).count();
      from = seg;
    }
    last = to;
  };

  std::size_t rr_cursor = 0;
  auto route = [&]() -> Replica* {
    Replica* best = nullptr;
    std::size_t ready = 0;
    for (const auto& p : replicas) ready += p->state == State::ready ? 1 : 0;
    if (ready == 0) return nullptr;
    const std::size_t turn = rr_cursor++ % ready;
    std::size_t k = 0;
    // Round robin: the turn-th ready replica. Least outstanding: the fewest, ties to the
    // first at or after the turn, so that equal replicas still share the load.
    std::size_t best_k = 0;
    for (const auto& p : replicas) {
      if (p->state != State::ready) continue;
      if (config.balancing == LoadBalancing::round_robin) {
        if (k == turn) return p.get();
      } else {
        const std::size_t rank = (k + ready - turn) % ready;
        if (best == nullptr || p->outstanding() < best->outstanding() ||
            (p->outstanding() == best->outstanding() && rank < best_k)) {
          best = p.get();
          best_k = rank;
        }
      }
      ++k;
    }
    return best;
  };

  auto observe = [&](BatchTime now, nanoseconds interval) {
    FleetObservation o;
    o.at = now - start;
    o.interval = interval;
    for (auto& p : replicas) {
      if (p->state == State::starting) ++o.starting;
      if (p->state != State::ready) continue;
      ReplicaObservation ro;
      ro.id = p->id;
      const double span = duration<double>(now - std::max(p->interval_start, p->ready_at)).count();
      if (span > 0.0) {
        ro.arrival_rps = static_cast<double>(p->routed) / span;
        ro.rejected_rps = static_cast<double>(std::min(p->rejected, p->routed)) / span;
        ro.completion_rps = static_cast<double>(p->completed) / span;
        ro.mean_queue_depth = p->queue_area / span;
        ro.mean_in_flight = p->exec_area / span;
        ro.utilization = std::min(1.0, p->busy_s / (span * static_cast<double>(config.lanes)));
      }
      ro.queue_depth = p->queued;
      ro.in_flight = p->executing;
      ro.p95 = tools::detail::nth_percentile(p->latencies, 95.0);
      if (p->completed > 0)
        ro.mean_latency = nanoseconds(static_cast<std::int64_t>(p->inside_s / static_cast<double>(p->completed) * 1e9));
      o.ready.push_back(ro);
    }
    o.provisioned = provisioned();
    return o;
  };
  auto reset_interval = [&](BatchTime now) {
    for (auto& p : replicas) {
      p->interval_start = std::max(now, p->interval_start);
      p->routed = p->completed = p->rejected = 0;
      p->latencies.clear();
      p->inside_s = p->queue_area = p->exec_area = p->busy_s = 0.0;
    }
  };

  auto rescale = [&](BatchTime now, std::size_t want) {
    want = std::clamp<std::size_t>(want, 1, config.max_replicas);
    const std::size_t have = provisioned();
    if (want == have) return;
    r.scale_events.push_back(FleetScaleEvent{now - start, have, want});
    if (want > have) {
      for (std::size_t i = have; i < want; ++i) provision(now, config.cold_start == nanoseconds::zero());
      return;
    }
    std::size_t drop = have - want;
    // Starting replicas first, the latest first: they serve nobody yet.
    while (drop > 0) {
      auto it = std::find_if(replicas.rbegin(), replicas.rend(), [](const auto& p) { return p->state == State::starting; });
      if (it == replicas.rend()) break;
      replicas.erase(std::next(it).base());
      --drop;
    }
    // Then ready ones, the least loaded (the newest among equals): readiness off, drain.
    while (drop > 0) {
      Replica* pick = nullptr;
      for (auto& p : replicas)
        if (p->state == State::ready && (pick == nullptr || p->outstanding() <= pick->outstanding())) pick = p.get();
      if (pick == nullptr) break;
      pick->state = State::draining;
      --drop;
    }
  };

  auto retire_drained = [&] {
    std::erase_if(replicas, [](const auto& p) { return p->state == State::draining && p->outstanding() == 0; });
  };

  ArrivalSchedule schedule(config.arrivals, config.seed);
  std::optional<nanoseconds> next_arrival = schedule.next();
  std::uint64_t index = 0;
  BatchTime next_eval = start + config.evaluation_interval;
  BatchTime last_eval = start;
  std::size_t step_seen = 0;  // timeline steps whose end has been recorded

  for (;;) {
    const BatchTime now0 = clock.now();
    const bool arrivals_left = next_arrival && index < config.max_requests;
    BatchTime t = BatchTime::max();
    if (arrivals_left) t = std::min({t, start + *next_arrival, next_eval});
    if (!finishes.empty()) t = std::min(t, finishes.top().at);
    for (const auto& p : replicas) {
      if (p->state == State::starting) t = std::min(t, p->ready_at);
      if (p->wake_at > now0) t = std::min(t, p->wake_at);
    }
    if (t == BatchTime::max()) break;
    integrate(t);
    clock.advance_to(t);
    const BatchTime now = clock.now();
    while (step_seen < steps && start + config.timeline_step * static_cast<std::int64_t>(step_seen + 1) <= now) {
      std::size_t ready = 0;
      for (const auto& p : replicas) ready += p->state == State::ready ? 1 : 0;
      r.timeline[step_seen++].ready = ready;
    }

    while (!finishes.empty() && finishes.top().at <= now) {
      const tools::detail::FleetFinish f = finishes.top();
      finishes.pop();
      for (auto& p : replicas)
        if (p->id == f.replica) {
          --p->executing;
          break;
        }
    }
    retire_drained();
    for (auto& p : replicas)
      if (p->state == State::starting && p->ready_at <= now) p->state = State::ready;

    if (arrivals_left && now >= next_eval) {
      if (config.scaling_policy) {
        const FleetObservation o = observe(now, now - last_eval);
        ++r.evaluations;
        rescale(now, config.scaling_policy(o));
      }
      reset_interval(now);
      last_eval = now;
      next_eval += config.evaluation_interval;
    }

    while (next_arrival && index < config.max_requests && start + *next_arrival <= now) {
      const BatchTime arrival = start + *next_arrival;
      ++r.arrivals;
      Replica* p = route();
      if (p == nullptr) {
        ++r.failed;
        record_step(arrival, failed_latency);
      } else {
        ++p->routed;
        ++p->queued;
        p->touched = true;
        p->pipeline->submit(tools::detail::SimRequest{index}, SubmitOptions{},
                            [c = &ctx, p, arrival](Outcome<tools::detail::SimResponse>&& o) noexcept {
                              --p->queued;
                              if (!o.ok()) {
                                if (o.status() == Status::rejected) ++p->rejected;
                                ++c->result->failed;
                                (*c->record)(arrival, failed_latency);
                                return;
                              }
                              ++c->result->ok;
                              const BatchTime done = o.value().finish;
                              ++p->executing;
                              c->finish_queue->push(tools::detail::FleetFinish{done, (*c->finish_order)++, p->id});
                              *c->last_completion = std::max(*c->last_completion, done);
                              const auto e2e = (done - arrival) + c->config->network;
                              c->hist->record(e2e);
                              (*c->record)(arrival, duration_cast<nanoseconds>(e2e).count());
                              ++p->completed;
                              p->latencies.push_back(duration_cast<nanoseconds>(e2e).count());
                              p->inside_s += duration<double>(done - arrival).count();
                            });
      }
      ++index;
      next_arrival = schedule.next();
    }

    for (auto& p : replicas) {
      if (!p->touched && p->wake_at > now) continue;
      p->touched = false;
      const PipelinePollResult pr = p->pipeline->poll();
      p->next_due = pr.next_due;
      BatchTime w = p->lanes.next_free_after(now);
      if (p->lanes.any_idle(now) && p->next_due > now) w = std::min(w, p->next_due);
      p->wake_at = w;
    }
    r.max_replicas = std::max(r.max_replicas, replicas.size());
  }
  for (auto& p : replicas) p->pipeline->shutdown();

  r.simulated = duration_cast<nanoseconds>(std::max(clock.now(), last_completion) - start);
  r.latency = hist.snapshot();
  const double ps[] = {50.0, 95.0, 99.0};
  nanoseconds out[3];
  r.latency.percentiles(ps, out);
  r.p50 = out[0];
  r.p95 = out[1];
  r.p99 = out[2];
  const double step_s = duration<double>(config.timeline_step).count();
  for (std::size_t i = 0; i < steps; ++i) {
    FleetSample& s = r.timeline[i];
    auto& v = by_step[i];
    s.arrivals = v.size();
    if (!v.empty()) {
      s.p99 = tools::detail::nth_percentile(v, 99.0);
      s.p95 = tools::detail::nth_percentile(v, 95.0);
      s.violation = config.slo_p95 > nanoseconds::zero() && s.p95 > config.slo_p95;
    }
    const double len = std::min(step_s, duration<double>(run_length - s.start).count());
    s.replicas = len > 0.0 ? s.replicas / len : 0.0;
    if (s.violation) r.violation_seconds += len;
  }
  return r;
}

}  // namespace tailbatch
