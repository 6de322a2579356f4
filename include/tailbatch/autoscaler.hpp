// Autoscaler: how many replicas a fleet of tailbatch servers should run, decided from the
// signals the servers export (arrival rate, queue depth, in-flight, recent p95) and the
// capacity one replica has been measured to serve.
//
// It is a policy object, not a controller: whoever runs it (a sidecar that scrapes
// /metrics, a server's own housekeeping timer, the fleet simulator) calls evaluate() every
// few seconds with the current time and the readings, and acts on the answer (patches a
// Deployment's replica count, or exports it for Kubernetes HPA or KEDA to follow through
// the `tailbatch_autoscaler_desired_replicas` gauge). It owns no thread and reads no clock:
// time is passed in, so a test on the ManualClock, a simulation and production all get the
// same decisions from the same inputs.
//
// What it recommends, each evaluation (docs/autoscaler.md works it through):
//
//   demand      = arrival rate + queued requests / queue_drain_time
//                 (+ the rate's rise over lead_time when lead_time > 0)
//   utilization = demand / (current replicas × capacity per replica)
//   replicas    = ceil(demand / (capacity × target_utilization))   (30 % headroom at 0.7)
//                 unchanged while utilization / target is within 1 ± tolerance
//   and at least current + 1 when the p95 has reached latency_trigger × SLO,
//   clamped to [min_replicas, max_replicas];
//
// then ScalingBehavior applies the semantics of Kubernetes HPA's `behavior` field:
// scale-up is immediate (stabilization window 0) and limited per period, scale-down takes
// the highest recommendation of the last stabilization window (300 s by default), so a
// dip does not shed replicas that the next second needs. A Little's-law check on the
// inputs (queued + in flight ≈ admitted rate × mean latency; refused requests are demand
// but never inside) flags readings that cannot all be true, which usually means a metric
// is taken at the wrong place.
//
// Core: standard library only. Exceptions: constructors throw std::invalid_argument naming
// a bad field; evaluate() throws std::invalid_argument for readings that are negative or
// not finite, and std::bad_alloc.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/littles_law.hpp>

namespace tailbatch {

// ---- Kubernetes HPA behaviour ------------------------------------------------------------

// One scaling policy of an HPA behaviour rule: at most `value` pods, or `value` percent of
// the replicas at the start of the period, may be added (scale-up) or removed (scale-down)
// within any `period`. HPA's `policies: [{type: Pods|Percent, value, periodSeconds}]`.
struct ScalingPolicy {
  enum class Type : std::uint8_t { pods, percent };
  Type type = Type::percent;
  int value = 100;
  std::chrono::nanoseconds period = std::chrono::seconds(15);
};

// Which policy wins when a rule has several: HPA's `selectPolicy`.
enum class SelectPolicy : std::uint8_t {
  max,       // the policy that allows the largest change (HPA's default)
  min,       // the policy that allows the smallest change
  disabled,  // no change in this direction at all
};

// One direction of an HPA behaviour (`scaleUp` or `scaleDown`).
struct ScalingRules {
  // Recommendations are remembered this long. Scale-up follows the lowest recommendation
  // of the window, scale-down the highest, so a change must have been recommended for the
  // whole window before it happens. HPA's `stabilizationWindowSeconds`.
  std::chrono::nanoseconds stabilization_window{0};
  std::vector<ScalingPolicy> policies;  // empty: no rate limit
  SelectPolicy select = SelectPolicy::max;
};

// Both directions; the defaults are Kubernetes HPA's (autoscaling/v2): scale-up at once,
// by 100 % or 4 pods per 15 s, whichever is more; scale-down after 300 s of stability, by
// up to 100 % per 15 s.
struct ScalingBehaviorConfig {
  ScalingRules scale_up{std::chrono::seconds(0),
                        {ScalingPolicy{ScalingPolicy::Type::percent, 100, std::chrono::seconds(15)},
                         ScalingPolicy{ScalingPolicy::Type::pods, 4, std::chrono::seconds(15)}},
                        SelectPolicy::max};
  ScalingRules scale_down{std::chrono::seconds(300),
                          {ScalingPolicy{ScalingPolicy::Type::percent, 100, std::chrono::seconds(15)}},
                          SelectPolicy::max};
};

// Turns raw replica recommendations into replica counts the way HPA's behaviour field does
// (stabilization windows, then rate-limiting policies). Usable on its own, to give any
// formula (say, HPA's CPU formula in a simulation) HPA's exact dynamics.
//
// Keeps the recommendations of the longer stabilization window and the scale events of the
// longest policy period, so memory is bounded by how often it is called. Not thread-safe:
// one caller at a time (const members are thread-safe against each other).
class ScalingBehavior {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // Validates the rules. Throws std::invalid_argument naming the field (a negative window,
  // a policy value < 1 or period <= 0). Allocates nothing. Not thread-safe: construct before
  // sharing.
  explicit ScalingBehavior(ScalingBehaviorConfig config = {}) : config_(std::move(config)) {
    check(config_.scale_up, "ScalingBehavior: scale_up");
    check(config_.scale_down, "ScalingBehavior: scale_down");
  }

  // The replica count to run now, given the count running (`current`) and what the
  // formula recommends: stabilised (HPA: the lowest recommendation of the scale-up window
  // and the highest of the scale-down window bound the change), then limited by the
  // policies against the replicas at the start of each policy's period. Records the
  // recommendation and, if the count changes, the scale event. `now` must not go back in
  // time between calls. Allocates (history); throws std::bad_alloc, and
  // std::invalid_argument if current or recommended is negative. Not thread-safe: one caller
  // at a time (it updates the history).
  [[nodiscard]] int apply(time_point now, int current, int recommended) {
    if (current < 0) detail::throw_invalid_argument("ScalingBehavior::apply: current must be >= 0");
    if (recommended < 0) detail::throw_invalid_argument("ScalingBehavior::apply: recommended must be >= 0");
    forget_before(now);
    // Stabilisation (k8s stabilizeRecommendationWithBehaviors).
    int up = recommended, down = recommended;
    for (const auto& [at, r] : recommendations_) {
      if (at > now - config_.scale_up.stabilization_window) up = std::min(up, r);
      if (at > now - config_.scale_down.stabilization_window) down = std::max(down, r);
    }
    recommendations_.emplace_back(now, recommended);
    int target = current;
    if (target < up) target = up;
    if (target > down) target = down;
    // Rate limits (k8s convertDesiredReplicasWithBehaviorRate).
    if (target > current) target = std::min(target, up_limit(now, current));
    else if (target < current) target = std::max(target, down_limit(now, current));
    if (target != current) events_.push_back(Event{now, target - current});
    return target;
  }

  // The rules in force. Thread-safe.
  [[nodiscard]] const ScalingBehaviorConfig& config() const noexcept { return config_; }

 private:
  struct Event {
    time_point at;
    int change;
  };

  static void check(const ScalingRules& r, std::string_view where) {
    if (r.stabilization_window < std::chrono::nanoseconds::zero())
      fail(where, ".stabilization_window must be >= 0");
    for (const auto& p : r.policies) {
      if (p.value < 1) fail(where, ".policies value must be >= 1");
      if (p.period <= std::chrono::nanoseconds::zero()) fail(where, ".policies period must be > 0");
      if (p.type != ScalingPolicy::Type::pods && p.type != ScalingPolicy::Type::percent)
        fail(where, ".policies type must be pods or percent");
    }
    if (r.select != SelectPolicy::max && r.select != SelectPolicy::min && r.select != SelectPolicy::disabled)
      fail(where, ".select must be max, min or disabled");
  }
  [[noreturn]] static void fail(std::string_view where, std::string_view what) {
    const std::string msg = std::string(where) + std::string(what);
    detail::throw_invalid_argument(msg.c_str());
  }

  [[nodiscard]] std::chrono::nanoseconds longest_period() const noexcept {
    std::chrono::nanoseconds p{0};
    for (const auto* r : {&config_.scale_up, &config_.scale_down})
      for (const auto& q : r->policies) p = std::max(p, q.period);
    return p;
  }

  void forget_before(time_point now) {
    const auto keep = std::max(config_.scale_up.stabilization_window, config_.scale_down.stabilization_window);
    while (!recommendations_.empty() && recommendations_.front().first <= now - keep) recommendations_.pop_front();
    const auto period = longest_period();
    while (!events_.empty() && events_.front().at <= now - period) events_.pop_front();
  }

  // Replicas added (sign > 0) or removed (sign < 0) within the last `period`.
  [[nodiscard]] int changed_within(time_point now, std::chrono::nanoseconds period, int sign) const noexcept {
    int n = 0;
    for (const auto& e : events_)
      if (e.at > now - period && e.change * sign > 0) n += e.change * sign;
    return n;
  }

  [[nodiscard]] int up_limit(time_point now, int current) const {
    const ScalingRules& r = config_.scale_up;
    if (r.select == SelectPolicy::disabled) return current;
    if (r.policies.empty()) return std::numeric_limits<int>::max();
    int limit = r.select == SelectPolicy::max ? std::numeric_limits<int>::min() : std::numeric_limits<int>::max();
    for (const auto& p : r.policies) {
      const int start = current - changed_within(now, p.period, +1);
      const int proposed = p.type == ScalingPolicy::Type::pods
                               ? start + p.value
                               : static_cast<int>(detail::ceil(static_cast<double>(start) * (1.0 + p.value / 100.0)));
      limit = r.select == SelectPolicy::max ? std::max(limit, proposed) : std::min(limit, proposed);
    }
    return limit;
  }

  [[nodiscard]] int down_limit(time_point now, int current) const {
    const ScalingRules& r = config_.scale_down;
    if (r.select == SelectPolicy::disabled) return current;
    if (r.policies.empty()) return 0;
    int limit = r.select == SelectPolicy::max ? std::numeric_limits<int>::max() : std::numeric_limits<int>::min();
    for (const auto& p : r.policies) {
      const int start = current + changed_within(now, p.period, -1);
      const int proposed = p.type == ScalingPolicy::Type::pods
                               ? start - p.value
                               : static_cast<int>(detail::ceil(static_cast<double>(start) * (1.0 - p.value / 100.0)));
      limit = r.select == SelectPolicy::max ? std::min(limit, proposed) : std::max(limit, proposed);
    }
    return std::max(limit, 0);
  }

  ScalingBehaviorConfig config_;
  std::deque<std::pair<time_point, int>> recommendations_;
  std::deque<Event> events_;
};

// ---- the Autoscaler ------------------------------------------------------------------

// One ready replica's readings over the last evaluation interval. Interval averages are
// best (a gauge sampled at each scrape and averaged; Prometheus `avg_over_time`);
// instantaneous readings work but make the Little's-law check noisier.
struct ReplicaSignals {
  // Requests per second arriving at this replica (rate of tailbatch_pipeline_requests_total
  // plus what is still queued; at a load balancer: requests routed to it), refused ones
  // included: they are demand the fleet failed to serve.
  double arrival_rps = 0.0;
  // Of arrival_rps, the requests per second refused at the door (queue full, shed, a
  // deadline that cannot be met): they count in the demand, but spend no time in the
  // replica and are in neither queue_depth, in_flight nor mean_latency, so the Little's-law
  // check leaves them out of the arrival rate. Must be <= arrival_rps.
  double rejected_rps = 0.0;
  // Requests waiting in its queue (tailbatch_pipeline_queue_depth).
  double queue_depth = 0.0;
  // Requests in batches being executed (tailbatch_pipeline_in_flight).
  double in_flight = 0.0;
  // Recent p95 latency, end to end as the SLO is stated (0: no completions).
  std::chrono::nanoseconds p95{0};
  // Recent mean time an admitted request spends in the replica, from submit to completion:
  // the span queue_depth + in_flight counts. 0: unknown (the Little's-law check is skipped).
  std::chrono::nanoseconds mean_latency{0};
  // This replica's measured capacity in requests per second; 0: AutoscalerConfig::capacity_rps.
  double capacity_rps = 0.0;
};

// Autoscaler configuration. Plain aggregate; the Autoscaler constructor validates it and
// throws std::invalid_argument naming the field ("Autoscaler: target_utilization must be
// in (0, 1]").
struct AutoscalerConfig {
  // Requests per second one replica serves within its SLO: the planner's instance_rps
  // (plan_capacity(...).recommendation()->instance_rps, tailbatch-plan) or a load test's
  // saturation point (tailbatch-load). Required (> 0).
  double capacity_rps = 0.0;
  // The share of capacity to plan for: 0.7 keeps 30 % headroom for spikes.
  double target_utilization = 0.7;
  // A change smaller than this fraction of the current utilisation is ignored (HPA's
  // default 0.1), so that noise does not move the fleet.
  double tolerance = 0.1;
  int min_replicas = 1;
  int max_replicas = 100;
  // The p95 objective; 0: no latency trigger.
  std::chrono::nanoseconds slo_p95{0};
  // When the worst replica's p95 reaches this fraction of slo_p95, at least one replica is
  // added this evaluation, whatever the utilisation says.
  double latency_trigger = 0.8;
  // Queued requests count as demand to be served within this long: a queue of Q adds
  // Q / queue_drain_time requests per second.
  std::chrono::nanoseconds queue_drain_time = std::chrono::seconds(10);
  // When > 0, scale-up plans for the arrival rate expected this far ahead (a replica's
  // start-up time), from the rate's rise over trend_window. Never lowers a recommendation.
  std::chrono::nanoseconds lead_time{0};
  std::chrono::nanoseconds trend_window = std::chrono::seconds(30);
  // The Little's-law check flags |relative deviation| above this.
  double littles_law_threshold = 0.5;
  // How recommendations become replica counts (HPA behaviour semantics).
  ScalingBehaviorConfig behavior{};
  // Metrics (tailbatch_autoscaler_*), registered at construction with these labels.
  // nullptr: none. The registry must outlive the Autoscaler.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// Which input set the recommendation.
enum class ScaleTrigger : std::uint8_t {
  none,          // within tolerance: the current count stands
  utilization,   // arrival rate against capacity × target utilisation
  queue,         // the queue's share of demand raised the count
  latency,       // p95 near the SLO added a replica
  trend,         // the projected rise over lead_time raised the count
  min_replicas,  // clamped up to the minimum
  max_replicas,  // clamped down to the maximum
};

// A short, stable, lower-case name ("utilization"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(ScaleTrigger t) noexcept {
  return detail::enum_name(
      t, {"none", "utilization", "queue", "latency", "trend", "min_replicas", "max_replicas"});
}

// One evaluation's answer and the inputs it used.
struct AutoscaleDecision {
  int desired_replicas = 1;      // what to run now: recommended, stabilised and rate-limited
  int recommended_replicas = 1;  // the formula's answer before the behaviour rules
  int current_replicas = 0;      // as passed in
  ScaleTrigger trigger = ScaleTrigger::none;
  double arrival_rps = 0.0;      // summed over replicas
  double projected_rps = 0.0;    // arrival_rps plus the trend over lead_time (>= arrival_rps)
  double queue_depth = 0.0;      // summed
  double in_flight = 0.0;        // summed
  std::chrono::nanoseconds p95{0};  // the worst replica's
  double capacity_rps = 0.0;     // per replica, as used
  double utilization = 0.0;      // demand / (current × capacity)
  // The Little's-law check on the inputs (queue_depth + in_flight vs the admitted rate,
  // arrival_rps - rejected_rps, × the rate-weighted mean latency); consistent when no
  // replica reported a mean latency.
  bool inputs_consistent = true;
  LittlesLawCheck littles_law{};

  // Whether the fleet should grow or shrink. Thread-safe.
  [[nodiscard]] bool scale_up() const noexcept { return desired_replicas > current_replicas; }
  [[nodiscard]] bool scale_down() const noexcept { return desired_replicas < current_replicas; }
};

// The replica-count policy. See the file comment for the formula.
//
// Thread-safety: evaluate() is not thread-safe (one evaluator: it keeps the behaviour's
// history); last() and config() are safe against each other but not against evaluate().
// The exported gauges are read safely by scrapes at any time.
// Exceptions: strong guarantee; see each member.
class Autoscaler {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // Validates config and registers the metrics (see docs/autoscaler.md):
  //   tailbatch_autoscaler_desired_replicas      gauge  the last decision's desired count
  //   tailbatch_autoscaler_recommended_replicas  gauge  before stabilisation and limits
  //   tailbatch_autoscaler_current_replicas      gauge  as passed in
  //   tailbatch_autoscaler_arrival_rate          gauge  requests/s, summed
  //   tailbatch_autoscaler_queue_depth           gauge  summed
  //   tailbatch_autoscaler_in_flight             gauge  summed
  //   tailbatch_autoscaler_p95_seconds           gauge  worst replica
  //   tailbatch_autoscaler_capacity_rps          gauge  per replica, as used
  //   tailbatch_autoscaler_utilization           gauge  demand / (current × capacity)
  //   tailbatch_autoscaler_inputs_consistent     gauge  1, or 0 when Little's law fails
  //   tailbatch_autoscaler_evaluations_total     counter
  // Allocates. Throws std::invalid_argument naming the field, std::bad_alloc. Not
  // thread-safe: construct before sharing.
  explicit Autoscaler(AutoscalerConfig config) : config_(std::move(config)), behavior_(config_.behavior) {
    const auto& c = config_;
    if (!(detail::is_finite(c.capacity_rps) && c.capacity_rps > 0.0))
      detail::throw_invalid_argument("Autoscaler: capacity_rps must be > 0");
    if (!(detail::is_finite(c.target_utilization) && c.target_utilization > 0.0 && c.target_utilization <= 1.0))
      detail::throw_invalid_argument("Autoscaler: target_utilization must be in (0, 1]");
    if (!(detail::is_finite(c.tolerance) && c.tolerance >= 0.0 && c.tolerance < 1.0))
      detail::throw_invalid_argument("Autoscaler: tolerance must be in [0, 1)");
    if (c.min_replicas < 0) detail::throw_invalid_argument("Autoscaler: min_replicas must be >= 0");
    if (c.max_replicas < 1 || c.max_replicas < c.min_replicas)
      detail::throw_invalid_argument("Autoscaler: max_replicas must be >= 1 and >= min_replicas");
    if (c.slo_p95 < std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("Autoscaler: slo_p95 must be >= 0");
    if (!(detail::is_finite(c.latency_trigger) && c.latency_trigger > 0.0 && c.latency_trigger <= 1.0))
      detail::throw_invalid_argument("Autoscaler: latency_trigger must be in (0, 1]");
    if (c.queue_drain_time <= std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("Autoscaler: queue_drain_time must be > 0");
    if (c.lead_time < std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("Autoscaler: lead_time must be >= 0");
    if (c.trend_window <= std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("Autoscaler: trend_window must be > 0");
    if (!(detail::is_finite(c.littles_law_threshold) && c.littles_law_threshold > 0.0))
      detail::throw_invalid_argument("Autoscaler: littles_law_threshold must be > 0");
    if (c.metrics != nullptr) register_metrics(*c.metrics);
  }

  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

  // Decides the replica count at `now` from the readings of the ready replicas and the
  // number of replicas currently provisioned (`current`, ready or starting: a replica
  // still starting is capacity already on its way, so it is not ordered twice). With no
  // ready replica the demand is unknown and only min/max and the behaviour rules apply.
  // `now` must not go back between calls. Updates the exported gauges. Allocates a little
  // (history, the check's explanation). Throws std::invalid_argument naming a reading that
  // is negative or not finite, or a negative current; std::bad_alloc. Not thread-safe: one
  // evaluator at a time (it keeps the rate and behaviour history).
  [[nodiscard]] AutoscaleDecision evaluate(time_point now, int current, std::span<const ReplicaSignals> replicas) {
    using std::chrono::duration;
    if (current < 0) detail::throw_invalid_argument("Autoscaler::evaluate: current must be >= 0");
    AutoscaleDecision d;
    d.current_replicas = current;
    // Little's law holds for what enters the replica: the admitted requests. Rejected ones
    // are in the demand, but in neither the occupancy nor the latency.
    double capacity_sum = 0.0, latency_weighted = 0.0, latency_rate = 0.0, admitted_rps = 0.0;
    for (const auto& r : replicas) {
      check_reading(r.arrival_rps, "arrival_rps");
      check_reading(r.queue_depth, "queue_depth");
      check_reading(r.in_flight, "in_flight");
      check_reading(r.rejected_rps, "rejected_rps");
      if (r.rejected_rps > r.arrival_rps)
        detail::throw_invalid_argument("Autoscaler::evaluate: rejected_rps must be <= arrival_rps");
      check_reading(r.capacity_rps, "capacity_rps");
      if (r.p95 < std::chrono::nanoseconds::zero() || r.mean_latency < std::chrono::nanoseconds::zero())
        detail::throw_invalid_argument("Autoscaler::evaluate: p95 and mean_latency must be >= 0");
      d.arrival_rps += r.arrival_rps;
      d.queue_depth += r.queue_depth;
      d.in_flight += r.in_flight;
      d.p95 = std::max(d.p95, r.p95);
      capacity_sum += r.capacity_rps > 0.0 ? r.capacity_rps : config_.capacity_rps;
      const double admitted = r.arrival_rps - r.rejected_rps;
      admitted_rps += admitted;
      if (r.mean_latency > std::chrono::nanoseconds::zero()) {
        latency_weighted += admitted * duration<double>(r.mean_latency).count();
        latency_rate += admitted;
      }
    }
    d.capacity_rps = replicas.empty() ? config_.capacity_rps : capacity_sum / static_cast<double>(replicas.size());

    // Little's law on the inputs: what is in the replicas ≈ arrival rate × time spent there.
    if (latency_rate > 0.0) {
      const auto w = std::chrono::nanoseconds(static_cast<std::int64_t>(latency_weighted / latency_rate * 1e9));
      d.littles_law = check_littles_law(admitted_rps, w, d.queue_depth + d.in_flight,
                                        config_.littles_law_threshold);
      d.inputs_consistent = !d.littles_law.hidden_queue_suspected;
    } else {
      d.littles_law.explanation = "not checked: no replica reported a mean latency";
    }

    // The rate's rise, for the lead-time projection.
    rates_.emplace_back(now, d.arrival_rps);
    while (rates_.size() > 1 && rates_.front().first < now - config_.trend_window) rates_.pop_front();
    d.projected_rps = d.arrival_rps;
    if (config_.lead_time > std::chrono::nanoseconds::zero() && rates_.size() > 1) {
      const double dt = duration<double>(now - rates_.front().first).count();
      const double rise = dt > 0.0 ? (d.arrival_rps - rates_.front().second) / dt : 0.0;
      if (rise > 0.0) d.projected_rps += rise * duration<double>(config_.lead_time).count();
    }

    const double plan_rps = d.capacity_rps * config_.target_utilization;
    const double queue_rps = d.queue_depth / duration<double>(config_.queue_drain_time).count();
    const double demand = d.arrival_rps + queue_rps;
    d.utilization = current > 0 ? demand / (static_cast<double>(current) * d.capacity_rps) : 0.0;

    int rec = current;
    d.trigger = ScaleTrigger::none;
    if (!replicas.empty()) {
      const int by_rate = ceil_replicas(d.arrival_rps / plan_rps);
      const int by_demand = ceil_replicas(demand / plan_rps);
      const int by_trend = ceil_replicas((d.projected_rps + queue_rps) / plan_rps);
      const double ratio = current > 0 ? d.utilization / config_.target_utilization : 2.0;
      if (detail::fabs(ratio - 1.0) > config_.tolerance || current == 0) {
        rec = by_demand;
        d.trigger = by_demand > by_rate ? ScaleTrigger::queue : ScaleTrigger::utilization;
        if (rec == current) d.trigger = ScaleTrigger::none;
      }
      // The projection is noisy (it extrapolates a difference of two rates): it acts only
      // when it takes the utilisation past the tolerance, like the present demand.
      const double projected_ratio =
          current > 0 ? (d.projected_rps + queue_rps) / (static_cast<double>(current) * d.capacity_rps) /
                            config_.target_utilization
                      : 2.0;
      if (d.projected_rps > d.arrival_rps && projected_ratio > 1.0 + config_.tolerance && by_trend > rec &&
          by_trend > current) {
        rec = by_trend;
        d.trigger = ScaleTrigger::trend;
      }
      if (config_.slo_p95 > std::chrono::nanoseconds::zero() &&
          duration<double>(d.p95).count() >= config_.latency_trigger * duration<double>(config_.slo_p95).count() &&
          rec <= current) {
        rec = current + 1;
        d.trigger = ScaleTrigger::latency;
      }
    }
    if (rec < config_.min_replicas) {
      rec = config_.min_replicas;
      d.trigger = ScaleTrigger::min_replicas;
    } else if (rec > config_.max_replicas) {
      rec = config_.max_replicas;
      d.trigger = ScaleTrigger::max_replicas;
    }
    d.recommended_replicas = rec;
    d.desired_replicas = std::clamp(behavior_.apply(now, current, rec), config_.min_replicas, config_.max_replicas);
    last_ = d;
    export_metrics(d);
    return d;
  }

  // The last decision (a default one before the first evaluate()). Never blocks. Not
  // thread-safe: a concurrent evaluate() races it (const members alone are fine).
  [[nodiscard]] const AutoscaleDecision& last() const noexcept { return last_; }
  // The configuration in force. Thread-safe.
  [[nodiscard]] const AutoscalerConfig& config() const noexcept { return config_; }

 private:
  struct Metrics {
    Gauge* desired = nullptr;
    Gauge* recommended = nullptr;
    Gauge* current = nullptr;
    Gauge* arrival = nullptr;
    Gauge* queue = nullptr;
    Gauge* in_flight = nullptr;
    Gauge* p95 = nullptr;
    Gauge* capacity = nullptr;
    Gauge* utilization = nullptr;
    Gauge* consistent = nullptr;
    Counter* evaluations = nullptr;
  };

  static void check_reading(double v, const char* field) {
    if (!(detail::is_finite(v) && v >= 0.0)) {
      const std::string msg = std::string("Autoscaler::evaluate: ") + field + " must be finite and >= 0";
      detail::throw_invalid_argument(msg.c_str());
    }
  }

  // ceil(x), saturated to an int; a hair of tolerance keeps 7.0000001 from becoming 8.
  static int ceil_replicas(double x) noexcept {
    if (!(x > 0.0)) return 0;
    const double r = detail::ceil(x - 1e-9);
    return r >= static_cast<double>(std::numeric_limits<int>::max()) ? std::numeric_limits<int>::max()
                                                                      : static_cast<int>(r);
  }

  void register_metrics(MetricsRegistry& r) {
    const Labels& l = config_.metric_labels;
    m_.desired = &r.gauge("tailbatch_autoscaler_desired_replicas", "Replicas the autoscaler recommends running now", l);
    m_.recommended = &r.gauge("tailbatch_autoscaler_recommended_replicas",
                              "Replicas the formula recommends, before stabilisation and rate limits", l);
    m_.current = &r.gauge("tailbatch_autoscaler_current_replicas", "Replicas provisioned at the last evaluation", l);
    m_.arrival = &r.gauge("tailbatch_autoscaler_arrival_rate", "Requests per second arriving, summed over replicas", l);
    m_.queue = &r.gauge("tailbatch_autoscaler_queue_depth", "Requests queued, summed over replicas", l);
    m_.in_flight = &r.gauge("tailbatch_autoscaler_in_flight", "Requests executing, summed over replicas", l);
    m_.p95 = &r.gauge("tailbatch_autoscaler_p95_seconds", "The worst replica's recent p95 latency", l);
    m_.capacity = &r.gauge("tailbatch_autoscaler_capacity_rps", "Requests per second one replica serves", l);
    m_.utilization = &r.gauge("tailbatch_autoscaler_utilization", "Demand over the current replicas' capacity", l);
    m_.consistent = &r.gauge("tailbatch_autoscaler_inputs_consistent",
                             "1 when the inputs satisfy Little's law, 0 when they contradict each other", l);
    m_.evaluations = &r.counter("tailbatch_autoscaler_evaluations_total", "Autoscaler evaluations", l);
    m_.consistent->set(1.0);
    m_.desired->set(static_cast<double>(config_.min_replicas));
  }

  void export_metrics(const AutoscaleDecision& d) noexcept {
    if (m_.desired == nullptr) return;
    m_.desired->set(d.desired_replicas);
    m_.recommended->set(d.recommended_replicas);
    m_.current->set(d.current_replicas);
    m_.arrival->set(d.arrival_rps);
    m_.queue->set(d.queue_depth);
    m_.in_flight->set(d.in_flight);
    m_.p95->set(std::chrono::duration<double>(d.p95).count());
    m_.capacity->set(d.capacity_rps);
    m_.utilization->set(d.utilization);
    m_.consistent->set(d.inputs_consistent ? 1.0 : 0.0);
    m_.evaluations->inc();
  }

  AutoscalerConfig config_;
  ScalingBehavior behavior_;
  std::deque<std::pair<time_point, double>> rates_;
  AutoscaleDecision last_{};
  Metrics m_{};
};

}  // namespace tailbatch
