// AdaptiveWindow: a batch policy configured with the SLO, not with a window.
//
// The user states the latency target (a p95, optionally a p99) and the largest batch the
// model's memory allows; the policy learns the rest online and decides each close itself:
//
//   * the model's cost per batch size, from the lanes' measured execution times
//     (BatchFeedback, which the Pipeline and the simulator hand to on_batch_executed):
//     a robust running mean per batch size, interpolated piecewise-linearly between the
//     sizes it has seen and extrapolated beyond them by a weighted least-squares line;
//   * the arrival rate, by counting the requests queued and dispatched (stamped with the
//     newest arrival when the view shows the whole queue), over the last 1024 arrivals
//     or, when the last 64 tell of a change of load (against the count since the last
//     change), over those since the change, counted from 16 arrivals before it was seen;
//   * the queue's and the lanes' state, from each BatchView (candidates, queued, lanes).
//
// From these it plans, and re-plans whenever the rate moves by more than 4 % or the cost
// model by more than 3 %: every (window, batch size) pair of a grid — windows from 0 to
// twice a batch of one's cost, sizes 1, 2, 3, 4, 6, 8, 12, ... up to the cap — is played
// through a small discrete-event model of the lanes (6000 Poisson arrivals at the
// estimated rate, served in the learned times), and the pair with the lowest predicted
// p95 (or p99, when a p99 target is set and is the tighter) is put in force. Plans are
// remembered per rate, so a load that comes back costs nothing to plan again.
//
// Planning cost, and its bound. Planning runs in on_batch_executed, never in decide(),
// and in slices: one call advances the plan in the making by at most plan_slice (8192)
// simulated requests, plus one percentile selection over 5400 latencies when a candidate
// ends, and the plan in force stays in force until the new one is done. That is the
// bound: O(plan_slice + max_batch) per call, about 50 µs of CPU while a plan is in the
// making and 2 µs otherwise (bench_adaptive, Release, 2 shared vCPUs), against about
// 7.5-16 ms for the whole grid in one call (BM_AdaptiveWindow_FullPlan). The search is
// exact but cut short where it cannot change the answer: the nearest rate's plan is tried
// first, a candidate is abandoned once more of its requests exceed the best objective so
// far than its percentile allows, a candidate that would play out exactly as one already
// run (a longer window where the window never closed a batch, a larger size where the
// size never did) is skipped, and so are sizes that cannot keep up with the rate. A plan
// takes about 10-40 calls; one made for a rate the load has left by more than 25 % is
// dropped for the plan of the rate now.
//
// decide() then closes a batch:
//
//   target_size  the queue holds the plan's batch size (it takes that many);
//   window       the oldest request has waited the plan's window;
//   backlog      the queue holds more than rounds of target-sized batches on every lane
//                run within the SLO (less what the oldest has waited and a tenth of the
//                SLO), and a larger batch is cheaper per request: the smallest size that
//                does drain it in time goes (the cap if none does);
//   max_batch    the queue holds the hard cap;
//   slo_guard    holding the oldest request any longer would leave less than its batch's
//                cost plus a tenth of the SLO before the SLO (p95 target, or p99 if tighter);
//   flush        the Pipeline drains;
//   lookahead    a lane is idle and the rule above would wait, or send fewer than all
//                that is queued: both choices are played out from the state in view (the
//                queued requests, when each lane frees, 16 seeded streams of arrivals at
//                the estimated rate over three of the plan's batches, the plan's rule
//                after the first choice), and sending all now left fewer requests over
//                the plan's predicted p95. Weighed only where a larger batch is cheaper
//                per request. A plan is a steady-state answer; this is the answer for
//                the moment (a backlog after a step up, lanes out of phase).
// While the plan in force was made for a rate well below the one counted now (by 25 %),
// the target is at least the size that keeps the lanes 90 % busy at the counted rate, until
// the new plan is done. At light load the plan is a zero or short window: a request goes
// to an idle lane at once. Near capacity it is the window and size that keep up with the load at the lowest
// tail, which is the most throughput the cap allows when nothing else does.
//
// Before any feedback (cold start) the policy dispatches at once whatever is queued, as a
// zero window with the hard cap would: the first batches measure the model.
//
// State. Unlike the other shipped policies, AdaptiveWindow learns. Its state lives behind
// a shared handle: copies of a policy share one learned model (the Pipeline copies the
// policy it is given; keep a copy to read cost_model() and rate_rps()). Every member is
// const and noexcept as BatchPolicy requires, and none allocates; decide() takes the
// internal lock for about 0.2 µs of work with no lane idle, and a few microseconds when
// the lookahead runs (3.8-5.8 µs per arrival near capacity on Example 1, bench_adaptive);
// on_batch_executed() for the refit (O(max_batch)) and a slice of planning (see above);
// so they may be called from
// any threads at once. Everything it reads about time comes from the views
// and the feedback, never from a clock: on the ManualClock (or in the simulator) its
// decisions are exactly reproducible.
//
// Metrics (when AdaptiveWindowConfig::metrics is set; the registry must outlive every
// copy of the policy):
//   tailbatch_adaptive_cost_intercept_seconds  learned L(b) = intercept + slope x b
//   tailbatch_adaptive_cost_slope_seconds
//   tailbatch_adaptive_arrival_rate            requests per second, as estimated
//   tailbatch_adaptive_target_batch            the plan's batch size
//   tailbatch_adaptive_window_seconds          the plan's window
//   tailbatch_adaptive_predicted_p95_seconds   the plan's predicted p95 (queue and lane)
//   tailbatch_adaptive_plans_total             plans computed (not found in the cache)
//   tailbatch_adaptive_closes_total{reason}    closes by AdaptiveCloseReason
//   tailbatch_adaptive_feedback_total          executed batches it learned from
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>

namespace tailbatch {

// Why AdaptiveWindow closed a batch; the label of tailbatch_adaptive_closes_total.
enum class AdaptiveCloseReason : std::uint8_t {
  max_batch,    // the queue held the hard cap
  target_size,  // the queue held the size the current load calls for
  window,       // the oldest request waited as long as the target takes to fill
  slo_guard,    // waiting longer would break the SLO for the oldest request
  backlog,      // more was queued than the target drains within the SLO: a larger batch went
  flush,        // the Pipeline drains
  lookahead,    // playing the next moments out showed fewer late requests if all queued go now
};
inline constexpr std::size_t adaptive_close_reason_count = 7;

// A short, stable, lower-case name ("slo_guard"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(AdaptiveCloseReason r) noexcept {
  switch (r) {
    case AdaptiveCloseReason::max_batch: return "max_batch";
    case AdaptiveCloseReason::target_size: return "target_size";
    case AdaptiveCloseReason::window: return "window";
    case AdaptiveCloseReason::slo_guard: return "slo_guard";
    case AdaptiveCloseReason::backlog: return "backlog";
    case AdaptiveCloseReason::flush: return "flush";
    case AdaptiveCloseReason::lookahead: return "lookahead";
  }
  return "unknown";
}

// What AdaptiveWindow is told. The constructor throws std::invalid_argument naming a bad
// field.
struct AdaptiveWindowConfig {
  // The p95 end-to-end target the policy works under. Required, > 0.
  std::chrono::nanoseconds slo_p95{0};
  // An optional p99 target (0: none); when set it must be >= slo_p95.
  std::chrono::nanoseconds slo_p99{0};
  // The hard cap on a batch (the model's memory limit), in [1, max_batch_limit].
  std::size_t max_batch = 64;
  // Optional: where the policy explains itself (see the header comment). Registering
  // allocates and may throw what MetricsRegistry throws.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// The learned model of batch cost: L(b) = intercept + slope x b over the sizes seen
// (the piecewise refinement is used inside decide(); estimate() gives it too).
struct AdaptiveCostModel {
  double intercept_s = 0.0;      // seconds
  double slope_s = 0.0;          // seconds per request
  std::uint64_t samples = 0;     // executed batches learned from
  std::size_t sizes_seen = 0;    // distinct batch sizes among them
};

// The (window, batch size) in force, and what the policy predicted for it.
struct AdaptivePlan {
  std::size_t batch = 1;                 // close when this many are queued
  BatchDuration window{};                // or when the oldest has waited this long
  double rate_rps = 0.0;                 // the arrival rate it was planned for
  double predicted_p95_s = 0.0;          // in queue and on the lane, seconds
  double predicted_p99_s = 0.0;
};

namespace detail {

// The policy's learned state. Guarded by `mu_`; see AdaptiveWindow.
class AdaptiveState {
 public:
  // A running mean per size weighs the last this-many samples (follows a drifting model).
  static constexpr double size_memory = 32.0;
  // The rate is counted over the last slow_span arrivals; when the count over the last
  // fast_span parts from it by more than rate_jump the load has changed, and the older
  // arrivals are forgotten.
  static constexpr std::uint64_t slow_span = 1024;
  static constexpr std::uint64_t fast_span = 64;
  static constexpr double rate_jump = 0.5;
  // After a change the rate is counted from this many arrivals back (most of the fast
  // span's arrivals came before the change was seen), over a span that grows from there.
  static constexpr std::uint64_t change_span = 16;
  static constexpr std::size_t checkpoint_capacity = 2048;
  // A sample above this multiple of its size's mean is clipped to it (a stall, a page
  // fault) once the size has enough samples to trust its mean.
  static constexpr double outlier_ratio = 1.5;
  // Plans are made for rates on a geometric grid of this ratio, and remembered.
  static constexpr double rate_step = 1.04;
  // The model is re-planned when L(1) or L(max_batch) moved by more than this fraction.
  static constexpr double cost_drift = 0.03;
  // Requests in the planning simulation (the first tenth is its warm-up).
  static constexpr std::size_t plan_requests = 6000;
  // A call advances a plan in the making by at most this many simulated requests (and
  // one batch): the bound on planning work per on_batch_executed.
  static constexpr std::size_t plan_slice = 8192;
  // Window candidates, as fractions of a batch of one's cost.
  static constexpr std::array<double, 12> window_grid = {0.0,   0.025, 0.05, 0.1, 0.15, 0.25,
                                                         0.4,   0.5,   0.75, 1.0, 1.5,  2.0};
  static constexpr std::size_t max_plan_lanes = 256;
  static constexpr std::size_t cache_size = 32;
  // A plan made for a rate this many times below the one counted now is stale; until the
  // new one is in force the target is at least the size that keeps the lanes at most
  // keep_up_load busy at the counted rate.
  static constexpr double stale_rise = 1.25;
  static constexpr double keep_up_load = 0.9;
  // The queue in a view is read as a rate (see decide) from this many requests up.
  static constexpr std::size_t view_rate_min = 8;
  static constexpr double view_rise = 2.0;
  // Lookahead (see lookahead()): streams played per choice, the horizon in batches of the
  // plan's size, the most arrivals a stream plays, and how much cheaper per request the
  // larger batch must be for the choice to be weighed at all.
  static constexpr std::size_t lookahead_streams = 16;
  static constexpr double lookahead_batches = 3.0;
  static constexpr std::size_t lookahead_arrivals = 1024;
  static constexpr double lookahead_gain = 0.98;

  explicit AdaptiveState(const AdaptiveWindowConfig& c)
      : slo_p95_(c.slo_p95), slo_p99_(c.slo_p99), cap_(c.max_batch), sizes_(c.max_batch + 1), table_(c.max_batch + 1, 0.0) {
    // 1, 2, 3, 4, 6, 8, 12, 16, 24, ...: powers of two and one and a half times them.
    for (std::size_t p = 1; p <= cap_; p *= 2) {
      batch_grid_.push_back(p);
      if (p >= 2 && p + p / 2 <= cap_) batch_grid_.push_back(p + p / 2);
      if (p > cap_ / 2) break;
    }
    if (batch_grid_.back() != cap_) batch_grid_.push_back(cap_);
    // Unit-rate exponential gaps from a fixed seed: every plan sees the same arrivals
    // (common random numbers), scaled to the rate it plans for.
    std::uint64_t x = 0x9e3779b97f4a7c15ULL;
    unit_arrivals_.resize(plan_requests);
    double t = 0.0;
    for (double& a : unit_arrivals_) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const double u = (static_cast<double>(x >> 11) + 0.5) * (1.0 / 9007199254740992.0);
      t += -detail::log(u);
      a = t;
    }
    latencies_.resize(plan_requests);
    lane_free_.resize(max_plan_lanes);
    job_table_.resize(c.max_batch + 1);
    job_latencies_.resize(plan_requests);
    job_lane_free_.resize(max_plan_lanes);
    job_window_free_.resize(batch_grid_.size());
    busy_until_.assign(max_plan_lanes, BatchTime::min());
    look_t_.resize(cap_ + lookahead_arrivals);
    look_free_.resize(max_plan_lanes);
    if (c.metrics != nullptr) register_metrics(*c.metrics, c.metric_labels);
  }

  void learn(const BatchFeedback& f) noexcept {
    if (f.failed || f.model_time <= std::chrono::nanoseconds::zero()) return;
    const std::size_t b = std::clamp<std::size_t>(std::max(f.padded_size, f.size), 1, cap_);
    const double x = std::chrono::duration<double>(f.model_time).count();
    std::lock_guard lock(mu_);
    SizeStat& s = sizes_[b];
    if (s.weight > 0.0 && s.weight < 3.0 && x * outlier_ratio < s.mean) {
      // Too few samples to trust, and this one is far lower: the first were a stall (a
      // cold cache, a thread starting); start the size again from this one.
      s.weight = 0.0;
    }
    const double clipped = s.weight >= 3.0 ? std::min(x, outlier_ratio * s.mean) : x;
    s.weight = std::min(s.weight + 1.0, size_memory);
    s.mean += (clipped - s.mean) / s.weight;
    ++samples_;
    // The lane that ran it frees now: the lane whose modelled end is nearest the real one
    // takes the real one (lookahead reads these).
    const BatchTime end = saturating_add(f.started, std::chrono::duration_cast<BatchDuration>(f.model_time));
    std::size_t lane = max_plan_lanes;
    BatchDuration nearest = BatchDuration::max();
    for (std::size_t i = 0; i < lanes_; ++i) {
      if (busy_until_[i] == BatchTime::min()) continue;
      const BatchDuration gap = busy_until_[i] > end ? busy_until_[i] - end : end - busy_until_[i];
      if (gap < nearest) {
        nearest = gap;
        lane = i;
      }
    }
    if (lane < max_plan_lanes) busy_until_[lane] = end;
    refit();
    if (m_.feedback != nullptr) m_.feedback->inc();
    // Planning happens here, on the thread that just ran a batch, rather than in decide():
    // batch formation never waits for it.
    replan_if_stale(f.started);
  }

  // The decision; see AdaptiveWindow::decide. The plan's rule decides first; where a lane
  // is idle and that rule would send fewer than all that is queued (or wait), the two
  // choices are played out (lookahead) and the one with fewer late requests is taken.
  BatchDecision decide(const BatchView& v) noexcept {
    std::lock_guard lock(mu_);
    observe_arrivals(v);
    lanes_ = std::clamp<std::size_t>(v.lanes, 1, max_plan_lanes);
    reason_ = AdaptiveCloseReason::flush;
    BatchDecision d = plan_decide(v);
    const std::size_t all = std::min(v.candidates.size(), cap_);
    const std::size_t base = std::max<std::size_t>(d.count, 1);
    // Only where a larger batch is cheaper per request: where batching buys nothing, a
    // larger batch would only take work from the other lanes.
    if (planned_ && !v.flush && v.idle_lanes > 0 && d.count < all &&
        cost(all) * static_cast<double>(base) < lookahead_gain * cost(base) * static_cast<double>(all) &&
        lookahead(v, all) < lookahead(v, d.count)) {
      d = BatchDecision::dispatch(all, DispatchReason::size);
      reason_ = AdaptiveCloseReason::lookahead;
    }
    // Only a dispatch with a lane to run it is counted (as taken off the queue, as a
    // close, and as that lane's work): the Pipeline does not act on the others.
    if (d.count > 0 && v.idle_lanes > 0) {
      if (Counter* c = m_.closes[static_cast<std::size_t>(reason_)]) c->inc();
      dispatched_ += d.count;
      std::size_t lane = 0;
      for (std::size_t i = 1; i < lanes_; ++i)
        if (busy_until_[i] < busy_until_[lane]) lane = i;
      busy_until_[lane] = saturating_add(v.now, to_duration(cost(std::min(d.count, cap_))));
    }
    return d;
  }

  // The plan's rule (see the header comment), under the lock; close() notes the reason.
  BatchDecision plan_decide(const BatchView& v) noexcept {
    const std::size_t n = v.candidates.size();
    if (n == 0) return BatchDecision::wait(BatchTime::max(), 1);
    // Cold start: no plan yet, so nothing is held.
    std::size_t target = planned_ ? std::min(plan_.batch, cap_) : cap_;
    const BatchDuration window = planned_ ? plan_.window : BatchDuration::zero();
    const BatchDuration slo = slo_p99_ > BatchDuration::zero() ? std::min(slo_p95_, slo_p99_) : slo_p95_;
    if (planned_) {
      // A rise in load the plan has not caught up with yet (it was made for well under the
      // rate counted now): no smaller than the size that keeps up with the counted rate,
      // until the plan for it is in force.
      double r = rate_at(v.now);
      // The queue tells of a rise before the count does: n requests that arrived within
      // the oldest one's wait came at (n - 1) / wait at least.
      if (n >= view_rate_min) {
        const double waited = std::chrono::duration<double>(v.now - window_start(v.candidates)).count();
        const double seen = waited > 0.0 ? static_cast<double>(n - 1) / waited : 0.0;
        if (seen > view_rise * plan_.rate_rps) r = std::max(r, seen);
      }
      if (r > stale_rise * plan_.rate_rps) {
        const std::size_t keep = keep_up_size(r);
        if (keep > target && cost(keep) * static_cast<double>(target) < 0.8 * cost(target) * static_cast<double>(keep))
          target = keep;
      }
      // A backlog: more queued than batches of the target can drain within the SLO on
      // the lanes there are. Where larger batches are cheaper per request, close the
      // smallest size that does drain it (the cap if none does). (Where batching buys
      // nothing, larger batches would only take work away from the other lanes.)
      const std::size_t queued = std::max(v.queued, n);
      if (queued > target) {
        const BatchDuration age = v.now - window_start(v.candidates);
        const std::size_t s = drain_size(queued, target, slo - std::max(age, BatchDuration::zero()));
        if (s > target && cost(s) * static_cast<double>(target) < 0.8 * cost(target) * static_cast<double>(s)) {
          const std::size_t take = std::min(s, n);
          return close(take, DispatchReason::size,
                       take == cap_ ? AdaptiveCloseReason::max_batch : AdaptiveCloseReason::backlog);
        }
      }
    }
    if (n >= target) {
      return close(target, DispatchReason::size,
                   target == cap_ ? AdaptiveCloseReason::max_batch : AdaptiveCloseReason::target_size);
    }
    if (v.flush) return close(n, DispatchReason::flush, AdaptiveCloseReason::flush);
    const BatchTime oldest = window_start(v.candidates);
    const BatchTime window_end = saturating_add(oldest, window);
    // The latest the oldest request may start: its SLO less the cost of the batch it
    // would run in, less a tenth of the SLO kept for what happens outside the lane.
    const BatchDuration hold_max = slo - to_duration(cost(target)) - slo / 10;
    const BatchTime guard = saturating_add(oldest, std::max(hold_max, BatchDuration::zero()));
    if (v.now >= guard) return close(n, DispatchReason::deadline, AdaptiveCloseReason::slo_guard);
    if (v.now >= window_end) return close(n, DispatchReason::window, AdaptiveCloseReason::window);
    return BatchDecision::wait(std::min(window_end, guard), target);
  }

  AdaptiveCostModel cost_model() const noexcept {
    std::lock_guard lock(mu_);
    AdaptiveCostModel m;
    m.intercept_s = intercept_;
    m.slope_s = slope_;
    m.samples = samples_;
    m.sizes_seen = sizes_seen_;
    return m;
  }

  double estimate(std::size_t b) const noexcept {
    std::lock_guard lock(mu_);
    return cost(std::clamp<std::size_t>(b, 1, cap_));
  }

  double rate(BatchTime now) const noexcept {
    std::lock_guard lock(mu_);
    return rate_at(now);
  }

  AdaptivePlan predict(double rate, std::size_t lanes, std::size_t batch, BatchDuration window) noexcept {
    std::lock_guard lock(mu_);
    AdaptivePlan p;
    p.batch = std::clamp<std::size_t>(batch, 1, cap_);
    p.window = std::max(window, BatchDuration::zero());
    p.rate_rps = rate;
    if (epoch_ == 0 || !(rate > 0.0)) return p;
    const std::size_t saved = lanes_;
    lanes_ = std::clamp<std::size_t>(lanes, 1, max_plan_lanes);
    simulate_fixed(rate, p.batch, std::chrono::duration<double>(p.window).count(), p.predicted_p95_s, p.predicted_p99_s);
    lanes_ = saved;
    return p;
  }

  AdaptivePlan plan() const noexcept {
    std::lock_guard lock(mu_);
    if (!planned_) {
      AdaptivePlan p;
      p.batch = cap_;
      return p;
    }
    return plan_;
  }

 private:
  struct SizeStat {
    double mean = 0.0;
    double weight = 0.0;
  };
  struct Checkpoint {
    BatchTime time{};
    std::uint64_t total = 0;
  };
  struct Cached {
    std::int64_t bucket = 0;
    std::uint64_t epoch = 0;
    std::size_t lanes = 0;
    AdaptivePlan plan{};
    std::size_t wi = 0, bi = 0;  // its cell of the grid
    bool used = false;
  };
  // A plan in the making (see start_job); it advances by at most plan_slice simulated
  // requests per call.
  struct PlanJob {
    bool active = false;
    bool any_feasible = false;
    bool running = false;  // a candidate's simulation is under way
    double rate = 0.0;
    std::int64_t bucket = 0;
    std::uint64_t epoch = 0;
    std::size_t lanes = 1;
    std::size_t order_first = 0;  // the candidate tried first (the plan in force)
    std::size_t next = 0;         // candidates begun
    std::size_t index = 0, b = 1;  // the candidate running, and its size and window
    double w = 0.0;
    bool window_mattered = false, size_mattered = false;
    // The first window index from which, for a size, every longer window plays out the
    // same (job_window_free_); likewise per window the first size index (size_free).
    std::array<std::size_t, window_grid.size()> size_free{};
    std::size_t h = 0;  // requests simulated so far
    std::size_t over95 = 0, over99 = 0;
    AdaptivePlan best{};
    double best_score = std::numeric_limits<double>::infinity();
    std::size_t best_index = 0;
  };
  struct Metrics {
    Gauge* intercept = nullptr;
    Gauge* slope = nullptr;
    Gauge* rate = nullptr;
    Gauge* target = nullptr;
    Gauge* window = nullptr;
    Gauge* predicted = nullptr;
    Counter* feedback = nullptr;
    Counter* plans = nullptr;
    std::array<Counter*, adaptive_close_reason_count> closes{};
  };

  static BatchDuration to_duration(double s) noexcept {
    if (!(s > 0.0)) return BatchDuration::zero();
    if (s > 1e6) s = 1e6;
    return std::chrono::duration_cast<BatchDuration>(std::chrono::duration<double>(s));
  }

  // A dispatch decided on a view with no idle lane is not acted on at once: the Pipeline
  // leaves the requests queued (the batch may grow) and asks again when a lane frees, so
  // they are shown again. decide() counts only a dispatch with a lane to run it (counting
  // the others would count their requests as arrivals once per view that shows them).
  BatchDecision close(std::size_t count, DispatchReason why, AdaptiveCloseReason reason) noexcept {
    reason_ = reason;
    return BatchDecision::dispatch(count, why);
  }

  // Plays the next moments out from the state in view and counts the late requests: the
  // queued requests (their arrival stamps), the lanes' free times (each close adds its
  // batch's modelled cost to the lane that frees first; feedback corrects it), and
  // lookahead_streams streams of Poisson arrivals at the estimated rate over
  // lookahead_batches times the plan's batch cost, the same streams for every choice
  // (common random numbers, from the planner's unit arrivals). `first` requests are
  // dispatched now on the lane that frees first (0: none), then the plan's rule (window,
  // size) serves the rest as the planner models it. A request is late when its time in
  // queue and on the lane exceeds the plan's predicted p95. Returns the late requests
  // summed over the streams, plus a thousandth of their summed lateness (in units of that
  // p95) to break ties. O(lookahead_streams x (queued + arrivals in the horizon)); never
  // allocates.
  double lookahead(const BatchView& v, std::size_t first) noexcept {
    const double rate = std::max(rate_at(v.now), 1.0);
    const std::size_t b = std::min(plan_.batch, cap_);
    const double w = std::chrono::duration<double>(plan_.window).count();
    const double horizon = lookahead_batches * cost(b);
    const double tau = plan_.predicted_p95_s > 0.0 ? plan_.predicted_p95_s : cost(b);
    // The queued requests, as offsets from now (<= 0), oldest first.
    std::size_t queued = 0;
    for (const BatchCandidate& c : v.candidates) {
      if (queued == cap_) break;
      look_t_[queued++] = std::min(0.0, std::chrono::duration<double>(c.arrival - v.now).count());
    }
    std::sort(look_t_.begin(), look_t_.begin() + static_cast<std::ptrdiff_t>(queued));
    const std::size_t units = unit_arrivals_.size();
    const std::size_t stride = units / lookahead_streams;
    const std::size_t room = look_t_.size() - queued;
    double late = 0.0, lateness = 0.0;
    for (std::size_t m = 0; m < lookahead_streams; ++m) {
      // This stream's arrivals: the unit gaps from its own offset on (wrapping), scaled.
      std::size_t n = queued;
      double t = 0.0;
      for (std::size_t k = 0; k < room; ++k) {
        const std::size_t i = (m * stride + k) % (units - 1) + 1;
        t += (unit_arrivals_[i] - unit_arrivals_[i - 1]) / rate;
        if (t > horizon) break;
        look_t_[n++] = t;
      }
      // The lanes: each busy one frees when its last batch is modelled to end; as many as
      // the view says are idle are free now.
      std::size_t idle = 0;
      for (std::size_t i = 0; i < lanes_; ++i) {
        look_free_[i] = busy_until_[i] > v.now ? std::chrono::duration<double>(busy_until_[i] - v.now).count() : 0.0;
        if (look_free_[i] == 0.0) ++idle;
      }
      for (std::size_t i = 0; i < lanes_ && idle < v.idle_lanes; ++i) {
        if (look_free_[i] > 0.0) {
          look_free_[i] = 0.0;
          ++idle;
        }
      }
      std::size_t h = 0;
      auto run = [&](double start, std::size_t e) {
        std::size_t lane = 0;
        for (std::size_t i = 1; i < lanes_; ++i)
          if (look_free_[i] < look_free_[lane]) lane = i;
        const double done = std::max(start, look_free_[lane]) + cost(std::min(e - h, cap_));
        look_free_[lane] = done;
        for (; h < e; ++h) {
          const double l = done - look_t_[h];
          if (l > tau) {
            late += 1.0;
            lateness += (l - tau) / tau;
          }
        }
      };
      if (first > 0) run(0.0, std::min(first, queued));
      while (h < n) {
        double lane_free = look_free_[0];
        for (std::size_t i = 1; i < lanes_; ++i) lane_free = std::min(lane_free, look_free_[i]);
        double close = look_t_[h] + w;
        if (h + b - 1 < n) close = std::min(close, look_t_[h + b - 1]);
        const double start = std::max({lane_free, close, 0.0});
        std::size_t e = h + 1;
        while (e < n && e - h < b && look_t_[e] <= start) ++e;
        run(start, e);
      }
    }
    return late + 1e-3 * lateness;
  }

  // The modelled cost of a batch of b (1 <= b <= cap), seconds; 0 before any feedback.
  double cost(std::size_t b) const noexcept { return table_[b]; }

  // The smallest size whose batches keep the lanes at most keep_up_load busy at `rate`
  // (1 when none does: then no size keeps up, and a larger one would only add its cost).
  // O(max_batch).
  std::size_t keep_up_size(double rate) const noexcept {
    for (std::size_t b = 1; b <= cap_; ++b)
      if (rate * cost(b) <= keep_up_load * static_cast<double>(lanes_) * static_cast<double>(b)) return b;
    return 1;
  }

  // The smallest size from `target` up whose batches, on every lane, run `queued`
  // requests within `budget` less a tenth of the SLO (rounds of batches times a batch's
  // cost); the cap when none does. O(max_batch).
  std::size_t drain_size(std::size_t queued, std::size_t target, BatchDuration left) const noexcept {
    const double budget = std::chrono::duration<double>(left).count() - 0.1 * std::chrono::duration<double>(slo_p95_).count();
    for (std::size_t s = target; s <= cap_; ++s) {
      const std::size_t per_round = s * lanes_;
      const auto rounds = static_cast<double>((queued + per_round - 1) / per_round);
      if (rounds * cost(s) <= budget) return s;
    }
    return cap_;
  }

  // Counts arrivals: the requests queued now plus those it has dispatched, a running
  // total that needs no arrival stamps (so a backlog hiding the newest requests from the
  // view does not hide them from the count). Each change is kept as a checkpoint (time,
  // total). (Requests that expire or are cancelled in the queue are not counted.)
  void observe_arrivals(const BatchView& v) noexcept {
    const std::uint64_t total = dispatched_ + std::max<std::uint64_t>(v.queued, v.candidates.size());
    if (total <= counted_) return;
    counted_ = total;
    // When the view shows every queued request, the newest one's stamp is when the total
    // was reached; otherwise the count is only known to have been reached by now.
    BatchTime when = v.now;
    if (v.queued <= v.candidates.size() && !v.candidates.empty()) {
      BatchTime newest = BatchTime::min();
      for (const BatchCandidate& c : v.candidates) newest = std::max(newest, c.arrival);
      when = std::min(newest, v.now);
    }
    if (checkpoint_count_ > 0) {
      when = std::max(when, checkpoints_[(first_checkpoint_ + checkpoint_count_ - 1) % checkpoints_.size()].time);
    }
    checkpoints_[(first_checkpoint_ + checkpoint_count_) % checkpoints_.size()] = Checkpoint{when, total};
    if (checkpoint_count_ < checkpoints_.size()) {
      ++checkpoint_count_;
    } else {
      first_checkpoint_ = (first_checkpoint_ + 1) % checkpoints_.size();
    }
    // A change of load: the slow estimate forgets what came before the fast one's span.
    // It is compared with the slow estimate of the load in force (since the last change),
    // so that after a change the estimate settles over a growing span instead of being
    // reset to the fast one's while older arrivals are still in the slow one's.
    const std::uint64_t since = total - std::min(total, regime_start_);
    const double slow = rate_over(v.now, std::min(slow_span, std::max(since, fast_span)));
    const double fast = rate_over(v.now, fast_span);
    if (slow > 0.0 && fast > 0.0 && detail::fabs(fast - slow) > rate_jump * slow)
      regime_start_ = total > change_span ? total - change_span : 0;
    if (m_.rate != nullptr) m_.rate->set(rate_at(v.now));
  }

  // Arrivals per second over the most recent `span` arrivals (fewer while fewer have been
  // counted): that count over the time from the checkpoint that begins it to now.
  double rate_over(BatchTime now, std::uint64_t span, std::uint64_t* counted = nullptr) const noexcept {
    if (checkpoint_count_ == 0) return 0.0;
    auto at = [&](std::size_t i) -> const Checkpoint& {
      return checkpoints_[(first_checkpoint_ + i) % checkpoints_.size()];
    };
    const std::uint64_t latest = at(checkpoint_count_ - 1).total;
    // The newest checkpoint at least `span` arrivals back (binary search: totals rise),
    // or the oldest kept.
    std::size_t from = 0;
    if (latest - at(0).total >= span) {
      std::size_t lo = 0, hi = checkpoint_count_ - 1;  // at(lo) qualifies, at(hi) does not
      while (hi - lo > 1) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (latest - at(mid).total >= span) lo = mid;
        else hi = mid;
      }
      from = lo;
    }
    const std::uint64_t count = latest - at(from).total;
    if (counted != nullptr) *counted = count;
    if (count < 8) return 0.0;
    const double secs = std::chrono::duration<double>(now - at(from).time).count();
    return secs > 0.0 ? static_cast<double>(count) / secs : 0.0;
  }

  // Counted over the last slow_span arrivals, but not back beyond the last change of
  // load (see observe_arrivals); over fast_span at least. 0 until a few are known.
  double rate_at(BatchTime now, std::uint64_t* counted = nullptr) const noexcept {
    const std::uint64_t since = counted_ - std::min(counted_, regime_start_);
    const double fast = rate_over(now, fast_span, counted);
    if (since <= fast_span) return rate_over(now, std::max(since, change_span), counted);
    std::uint64_t slow_count = 0;
    const double slow = rate_over(now, std::min(slow_span, since), &slow_count);
    // Arrivals that stop (or surge) show in the fast count before the next arrival is
    // counted and moves the regime's start.
    if (detail::fabs(fast - slow) > rate_jump * slow) return fast;
    if (counted != nullptr) *counted = slow_count;
    return slow;
  }

  // Rebuilds the cost table from the per-size means: a weighted least-squares line over
  // the sizes seen, the means themselves where a size has enough samples, linear
  // interpolation between such sizes, and the line's slope beyond them.
  void refit() noexcept {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    std::size_t seen = 0;
    for (std::size_t b = 1; b <= cap_; ++b) {
      const SizeStat& s = sizes_[b];
      if (s.weight <= 0.0) continue;
      ++seen;
      const double x = static_cast<double>(b);
      sw += s.weight;
      sx += s.weight * x;
      sy += s.weight * s.mean;
      sxx += s.weight * x * x;
      sxy += s.weight * x * s.mean;
    }
    sizes_seen_ = seen;
    if (seen == 0) return;
    const double mx = sx / sw, my = sy / sw;
    const double var = sxx / sw - mx * mx;
    double slope = 0.0;
    if (seen >= 2 && var > 0.0) {
      slope = std::max(0.0, (sxy / sw - mx * my) / var);
    } else {
      // One size seen: assume each further request adds a tenth of the mean batch's
      // per-request cost (some gain from batching, not none), until sizes vary.
      slope = 0.1 * my / mx;
    }
    double intercept = my - slope * mx;
    if (intercept < 0.0) {
      // Never below zero at size 0: refit through the origin.
      intercept = 0.0;
      slope = sxy / sxx;
    }
    intercept_ = intercept;
    slope_ = slope;
    if (m_.intercept != nullptr) m_.intercept->set(intercept_);
    if (m_.slope != nullptr) m_.slope->set(slope_);

    // Piecewise: anchors are sizes with enough samples to trust; between anchors
    // interpolate, outside them follow the line's slope from the nearest anchor.
    std::size_t prev = 0;
    for (std::size_t b = 1; b <= cap_; ++b) {
      if (sizes_[b].weight < 3.0) continue;
      table_[b] = sizes_[b].mean;
      if (prev == 0) {
        for (std::size_t i = 1; i < b; ++i) table_[i] = sizes_[b].mean - slope * static_cast<double>(b - i);
      } else {
        const double a = table_[prev], z = sizes_[b].mean;
        for (std::size_t i = prev + 1; i < b; ++i)
          table_[i] = a + (z - a) * static_cast<double>(i - prev) / static_cast<double>(b - prev);
      }
      prev = b;
    }
    if (prev == 0) {
      for (std::size_t b = 1; b <= cap_; ++b) table_[b] = intercept + slope * static_cast<double>(b);
    } else {
      for (std::size_t b = prev + 1; b <= cap_; ++b) table_[b] = table_[prev] + slope * static_cast<double>(b - prev);
    }
    // Never free, never cheaper than a smaller batch.
    table_[1] = std::max(table_[1], 1e-9);
    for (std::size_t b = 2; b <= cap_; ++b) table_[b] = std::max(table_[b], table_[b - 1]);
    // A new epoch when the model moved enough to change plans.
    const double c1 = table_[1], cn = table_[cap_];
    if (epoch_ == 0 || detail::fabs(c1 - epoch_c1_) > cost_drift * epoch_c1_ ||
        detail::fabs(cn - epoch_cn_) > cost_drift * epoch_cn_) {
      ++epoch_;
      epoch_c1_ = c1;
      epoch_cn_ = cn;
    }
  }

  std::int64_t bucket_of(double rate) const noexcept {
    return static_cast<std::int64_t>(detail::floor(detail::log(rate) / detail::log(rate_step)));
  }

  // Makes sure the plan in force is for the current rate bucket, lanes and cost epoch:
  // from the cache at once, or by a planning job that runs in bounded slices, one per call
  // (see advance_job). The plan in force stays in force until the job ends.
  void replan_if_stale(BatchTime now) noexcept {
    std::size_t budget = plan_slice;
    const double rate = rate_at(now);
    // A plan in the making for a rate the load has since left far behind is dropped: the
    // one for the rate now is started instead.
    if (job_.active && rate > 0.0 && detail::fabs(rate - job_.rate) > (stale_rise - 1.0) * job_.rate) job_.active = false;
    if (job_.active) {
      advance_job(budget);
      if (job_.active) return;
    }
    if (rate <= 0.0 || epoch_ == 0) return;
    const std::int64_t bucket = bucket_of(rate);
    if (planned_ && bucket == plan_bucket_ && epoch_ == plan_epoch_ && lanes_ == plan_lanes_) return;
    for (const Cached& c : cache_) {
      if (c.used && c.bucket == bucket && c.epoch == epoch_ && c.lanes == lanes_) {
        adopt(c.plan, bucket, c.epoch, c.lanes, c.wi, c.bi);
        return;
      }
    }
    start_job(detail::pow(rate_step, static_cast<double>(bucket) + 0.5), bucket);
    advance_job(budget);
  }

  void adopt(const AdaptivePlan& p, std::int64_t bucket, std::uint64_t epoch, std::size_t lanes, std::size_t wi,
             std::size_t bi) noexcept {
    plan_ = p;
    planned_ = true;
    plan_bucket_ = bucket;
    plan_epoch_ = epoch;
    plan_lanes_ = lanes;
    plan_wi_ = wi;
    plan_bi_ = bi;
    if (m_.target != nullptr) m_.target->set(static_cast<double>(p.batch));
    if (m_.window != nullptr) m_.window->set(std::chrono::duration<double>(p.window).count());
    if (m_.predicted != nullptr) m_.predicted->set(p.predicted_p95_s);
  }

  // A plan: every (window, size) candidate of the grid simulated at `rate` on a snapshot
  // of the learned cost table; the one with the lowest objective wins: the p95 over its
  // target, or the p99 over its target when a p99 target is set and that is worse. Ties go
  // to the smaller window, then the smaller size. The search is exact but cut short where
  // it cannot change the answer: the plan in force (its grid cell) is simulated first, a
  // candidate is abandoned as soon as more of its requests exceed the best objective so
  // far than the percentile allows, and sizes that cannot keep up with the rate on the
  // lanes are skipped (when some size can).
  void start_job(double rate, std::int64_t bucket) noexcept {
    job_ = PlanJob{};
    job_.active = true;
    job_.rate = rate;
    job_.bucket = bucket;
    job_.epoch = epoch_;
    job_.lanes = lanes_;
    std::copy(table_.begin(), table_.end(), job_table_.begin());
    // The first candidate sets the bound the others are cut short against: the cell of
    // the plan made for the nearest rate (the plan in force, or a remembered one).
    job_.order_first = planned_ ? plan_wi_ * batch_grid_.size() + plan_bi_ : 0;
    std::int64_t nearest = planned_ ? std::abs(plan_bucket_ - bucket) : std::numeric_limits<std::int64_t>::max();
    for (const Cached& c : cache_) {
      if (c.used && c.lanes == lanes_ && std::abs(c.bucket - bucket) < nearest) {
        nearest = std::abs(c.bucket - bucket);
        job_.order_first = c.wi * batch_grid_.size() + c.bi;
      }
    }
    for (const std::size_t b : batch_grid_) {
      if (feasible(b)) job_.any_feasible = true;
    }
    job_.best.batch = cap_;
    job_.best.rate_rps = rate;
    job_.best_index = std::numeric_limits<std::size_t>::max();
    job_.size_free.fill(std::numeric_limits<std::size_t>::max());
    std::fill(job_window_free_.begin(), job_window_free_.end(), std::numeric_limits<std::size_t>::max());
  }

  bool feasible(std::size_t b) const noexcept {
    return job_.rate * job_table_[b] < static_cast<double>(job_.lanes) * static_cast<double>(b);
  }

  // The n-th candidate to try: the plan in force first, then the grid in order.
  std::size_t job_candidate(std::size_t n) const noexcept {
    if (n == 0) return job_.order_first;
    return n <= job_.order_first ? n - 1 : n;
  }

  // Runs the planning job for at most about `budget` simulated requests (plus one batch),
  // picking up where the last call left off; adopts and caches the plan when it ends.
  void advance_job(std::size_t& budget) noexcept {
    const std::size_t total = window_grid.size() * batch_grid_.size();
    const std::size_t n = unit_arrivals_.size();
    const std::size_t measured = n - n / 10;
    const double p95_target = std::chrono::duration<double>(slo_p95_).count();
    const double p99_target = std::chrono::duration<double>(slo_p99_).count();
    const auto k95 = static_cast<std::size_t>(0.95 * static_cast<double>(measured - 1));
    const auto k99 = static_cast<std::size_t>(0.99 * static_cast<double>(measured - 1));
    while (job_.active && budget > 0) {
      if (!job_.running) {
        if (job_.next == total) {
          finish_job();
          return;
        }
        const std::size_t c = job_candidate(job_.next++);
        const std::size_t wi = c / batch_grid_.size(), bi = c % batch_grid_.size();
        const std::size_t b = batch_grid_[bi];
        if (job_.any_feasible && !feasible(b)) continue;
        // A candidate that would play out exactly as one already run (a longer window where
        // the window never closed a batch, a larger size where the size never did) can
        // only tie with it, and a tie goes to the one run: skip it.
        if (wi > job_window_free_[bi] || bi > job_.size_free[wi]) continue;
        job_.window_mattered = false;
        job_.size_mattered = false;
        job_.running = true;
        job_.index = c;
        job_.b = b;
        job_.w = window_grid[c / batch_grid_.size()] * job_table_[1];
        job_.h = 0;
        job_.over95 = 0;
        job_.over99 = 0;
        std::fill(job_lane_free_.begin(), job_lane_free_.begin() + static_cast<std::ptrdiff_t>(job_.lanes), 0.0);
        --budget;
        continue;
      }
      // Beyond these the candidate cannot beat the best so far.
      const double cut95 = job_.best_score * p95_target;
      const double cut99 = p99_target > 0.0 ? job_.best_score * p99_target : std::numeric_limits<double>::infinity();
      const double scale = 1.0 / job_.rate;
      bool abandoned = false;
      while (job_.h < n && budget > 0) {
        const std::size_t h = job_.h;
        std::size_t lane = 0;
        for (std::size_t i = 1; i < job_.lanes; ++i)
          if (job_lane_free_[i] < job_lane_free_[lane]) lane = i;
        const double first = unit_arrivals_[h] * scale;
        double close = first + job_.w;
        if (h + job_.b - 1 < n) close = std::min(close, unit_arrivals_[h + job_.b - 1] * scale);
        const double t = std::max(job_lane_free_[lane], close);
        std::size_t e = h + 1;
        while (e < n && e - h < job_.b && unit_arrivals_[e] * scale <= t) ++e;
        // Whether a longer window, or a larger size, could have played this batch out
        // otherwise (see the skip rule above).
        const double last = h + job_.b - 1 < n ? unit_arrivals_[h + job_.b - 1] * scale
                                                : std::numeric_limits<double>::infinity();
        if (last > first + job_.w && job_lane_free_[lane] < last) job_.window_mattered = true;
        if (e - h == job_.b || last <= first + job_.w) job_.size_mattered = true;
        const double done = t + job_table_[e - h];
        job_lane_free_[lane] = done;
        for (std::size_t i = h; i < e; ++i) {
          const double l = done - unit_arrivals_[i] * scale;
          job_latencies_[i] = l;
          if (i >= n / 10) {
            if (l > cut95) ++job_.over95;
            if (l > cut99) ++job_.over99;
          }
        }
        budget -= std::min(budget, e - h);
        job_.h = e;
        if (job_.over95 > measured - 1 - k95 || job_.over99 > measured - 1 - k99) {
          abandoned = true;
          break;
        }
      }
      if (abandoned) {
        job_.running = false;
        note_free();
        continue;
      }
      if (job_.h < n) return;  // the budget ran out mid-candidate
      // The candidate ran to the end: its percentiles (a selection over the measured
      // requests, counted against the budget like the requests themselves).
      if (budget < measured / 2 && budget < plan_slice) {
        budget = 0;
        return;
      }
      budget -= std::min(budget, measured / 2);
      job_.running = false;
      note_free();
      const auto from = job_latencies_.begin() + static_cast<std::ptrdiff_t>(n / 10);
      auto at = [&](std::size_t k) {
        std::nth_element(from, from + static_cast<std::ptrdiff_t>(k), job_latencies_.end());
        return *(from + static_cast<std::ptrdiff_t>(k));
      };
      const double p99 = at(k99);
      const double p95 = at(k95);
      double score = p95 / p95_target;
      if (p99_target > 0.0) score = std::max(score, p99 / p99_target);
      const bool better = score < job_.best_score * (1.0 - 1e-9) ||
                          (score <= job_.best_score * (1.0 + 1e-9) && job_.index < job_.best_index);
      if (better) {
        job_.best_score = score;
        job_.best_index = job_.index;
        job_.best.batch = job_.b;
        job_.best.window = to_duration(job_.w);
        job_.best.predicted_p95_s = p95;
        job_.best.predicted_p99_s = p99;
      }
    }
  }

  // After a candidate ends (run out or abandoned): what it showed about the ones like it.
  void note_free() noexcept {
    const std::size_t wi = job_.index / batch_grid_.size(), bi = job_.index % batch_grid_.size();
    if (!job_.window_mattered) job_window_free_[bi] = std::min(job_window_free_[bi], wi);
    if (!job_.size_mattered) job_.size_free[wi] = std::min(job_.size_free[wi], bi);
  }

  void finish_job() noexcept {
    job_.active = false;
    // Nothing finished (every candidate abandoned cannot happen: the first one has no
    // bound to be abandoned against); keep the cap with no window then all the same.
    const std::size_t wi = job_.best_index == std::numeric_limits<std::size_t>::max() ? 0 : job_.best_index / batch_grid_.size();
    const std::size_t bi = job_.best_index == std::numeric_limits<std::size_t>::max() ? batch_grid_.size() - 1
                                                                                       : job_.best_index % batch_grid_.size();
    Cached& slot = cache_[next_slot_];
    next_slot_ = (next_slot_ + 1) % cache_.size();
    slot = Cached{job_.bucket, job_.epoch, job_.lanes, job_.best, wi, bi, true};
    if (m_.plans != nullptr) m_.plans->inc();
    ++plans_;
    // Adopted even when the rate, the lanes or the model moved on meanwhile: it is the
    // newest plan there is; the next call starts the one they call for.
    adopt(job_.best, job_.bucket, job_.epoch, job_.lanes, wi, bi);
  }

  // A FixedWindow(b, w) on lanes_ lanes fed plan_requests Poisson arrivals at `rate`,
  // served in the learned times: the p95 and p99 of time in queue plus service (the
  // first tenth of the requests excluded). O(plan_requests); never allocates.
  void simulate_fixed(double rate, std::size_t b, double w, double& p95, double& p99) noexcept {
    const std::size_t n = unit_arrivals_.size();
    const double scale = 1.0 / rate;
    std::fill(lane_free_.begin(), lane_free_.begin() + static_cast<std::ptrdiff_t>(lanes_), 0.0);
    std::size_t h = 0;
    while (h < n) {
      std::size_t lane = 0;
      for (std::size_t i = 1; i < lanes_; ++i)
        if (lane_free_[i] < lane_free_[lane]) lane = i;
      const double first = unit_arrivals_[h] * scale;
      double close = first + w;
      if (h + b - 1 < n) close = std::min(close, unit_arrivals_[h + b - 1] * scale);
      const double t = std::max(lane_free_[lane], close);
      std::size_t e = h + 1;
      while (e < n && e - h < b && unit_arrivals_[e] * scale <= t) ++e;
      const double done = t + table_[e - h];
      lane_free_[lane] = done;
      for (std::size_t i = h; i < e; ++i) latencies_[i] = done - unit_arrivals_[i] * scale;
      h = e;
    }
    const auto from = latencies_.begin() + static_cast<std::ptrdiff_t>(n / 10);
    const auto count = static_cast<std::ptrdiff_t>(n - n / 10);
    auto at = [&](double q) {
      const auto k = static_cast<std::ptrdiff_t>(q * static_cast<double>(count - 1));
      std::nth_element(from, from + k, latencies_.end());
      return *(from + k);
    };
    p99 = at(0.99);
    p95 = at(0.95);
  }

  void register_metrics(MetricsRegistry& r, const Labels& base) {
    m_.intercept = &r.gauge("tailbatch_adaptive_cost_intercept_seconds",
                            "Learned batch cost model L(b) = intercept + slope x b: the intercept", base);
    m_.slope = &r.gauge("tailbatch_adaptive_cost_slope_seconds",
                        "Learned batch cost model L(b) = intercept + slope x b: the slope per request", base);
    m_.rate = &r.gauge("tailbatch_adaptive_arrival_rate", "Estimated arrival rate, requests per second", base);
    m_.target = &r.gauge("tailbatch_adaptive_target_batch", "The batch size the adaptive window aims for", base);
    m_.window = &r.gauge("tailbatch_adaptive_window_seconds",
                         "How long the adaptive window holds the oldest request for its target", base);
    m_.predicted = &r.gauge("tailbatch_adaptive_predicted_p95_seconds",
                            "p95 in queue and on the lane that the plan in force predicts", base);
    m_.feedback = &r.counter("tailbatch_adaptive_feedback_total", "Executed batches the adaptive window learned from",
                             base);
    m_.plans = &r.counter("tailbatch_adaptive_plans_total", "Plans the adaptive window computed (cache misses)", base);
    for (std::size_t i = 0; i < adaptive_close_reason_count; ++i) {
      m_.closes[i] = &r.counter("tailbatch_adaptive_closes_total", "Batches the adaptive window closed, by reason",
                                join_labels(base, {{"reason", std::string(to_string(static_cast<AdaptiveCloseReason>(i)))}}));
    }
  }

  mutable std::mutex mu_;
  BatchDuration slo_p95_;
  BatchDuration slo_p99_;
  std::size_t cap_;
  std::vector<SizeStat> sizes_;
  std::vector<double> table_;
  std::vector<std::size_t> batch_grid_;
  std::vector<double> unit_arrivals_;
  std::vector<double> latencies_;
  std::vector<double> lane_free_;
  double intercept_ = 0.0, slope_ = 0.0;
  std::uint64_t samples_ = 0;
  std::size_t sizes_seen_ = 0;
  std::uint64_t epoch_ = 0;
  double epoch_c1_ = 0.0, epoch_cn_ = 0.0;
  std::array<Checkpoint, checkpoint_capacity> checkpoints_{};
  std::size_t first_checkpoint_ = 0;
  std::size_t checkpoint_count_ = 0;
  std::uint64_t counted_ = 0;
  std::uint64_t regime_start_ = 0;
  std::uint64_t dispatched_ = 0;
  AdaptiveCloseReason reason_ = AdaptiveCloseReason::flush;  // of plan_decide's close
  std::vector<BatchTime> busy_until_;  // per lane (as the policy counts them): modelled end of its last batch
  std::vector<double> look_t_;         // lookahead: arrival offsets
  std::vector<double> look_free_;      // lookahead: lane free times
  std::size_t lanes_ = 1;
  AdaptivePlan plan_{};
  bool planned_ = false;
  std::int64_t plan_bucket_ = 0;
  std::uint64_t plan_epoch_ = 0;
  std::size_t plan_lanes_ = 0;
  std::size_t plan_wi_ = 0, plan_bi_ = 0;
  PlanJob job_{};
  std::vector<double> job_table_;
  std::vector<double> job_latencies_;
  std::vector<double> job_lane_free_;
  std::vector<std::size_t> job_window_free_;
  std::uint64_t plans_ = 0;
  std::array<Cached, cache_size> cache_{};
  std::size_t next_slot_ = 0;
  Metrics m_{};
};

}  // namespace detail

// The SLO-aimed batch policy (see the header comment). Satisfies BatchPolicy and
// BatchFeedbackPolicy.
//
// Thread-safety: every member is thread-safe; copies share the learned state (a
// std::shared_ptr to it), so the copy a Pipeline holds and the copy a caller keeps see the
// same model. Exceptions: the constructor throws std::invalid_argument naming a bad field,
// or std::bad_alloc; no other member throws.
class AdaptiveWindow {
 public:
  // The largest accepted max_batch (the state holds a few words per size).
  static constexpr std::size_t max_batch_limit = 65536;

  // Validates config and allocates the shared state (registering metrics when asked).
  // Throws std::invalid_argument naming the field, std::bad_alloc, or what the registry
  // throws. Not thread-safe with respect to config.metrics' other registrations.
  explicit AdaptiveWindow(const AdaptiveWindowConfig& config) : max_batch_(config.max_batch) {
    if (config.slo_p95 <= std::chrono::nanoseconds::zero())
      detail::throw_invalid_argument("AdaptiveWindow: slo_p95 must be > 0");
    if (config.slo_p99 < std::chrono::nanoseconds::zero() ||
        (config.slo_p99 > std::chrono::nanoseconds::zero() && config.slo_p99 < config.slo_p95))
      detail::throw_invalid_argument("AdaptiveWindow: slo_p99 must be 0 (none) or >= slo_p95");
    if (config.max_batch < 1 || config.max_batch > max_batch_limit)
      detail::throw_invalid_argument("AdaptiveWindow: max_batch must be in [1, 65536]");
    state_ = std::make_shared<detail::AdaptiveState>(config);
  }

  // The hard cap. Never blocks. Thread-safe.
  [[nodiscard]] std::size_t max_batch() const noexcept { return max_batch_; }
  // Arrival order. Thread-safe.
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }

  // Closes now (and how many) or says until when to wait; see the header comment. Reads
  // the view's arrival stamps into the rate estimate. Takes the state's lock briefly (a
  // few microseconds when a lane is idle and the lookahead runs); never allocates.
  // Thread-safe.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept { return state_->decide(v); }

  // Learns from one executed batch (failed batches and non-positive times are ignored).
  // Takes the state's lock, refits the cost table (O(max_batch)) and advances a plan in
  // the making by at most plan_slice simulated requests (see the header comment: tens of
  // microseconds); never allocates. Thread-safe.
  void on_batch_executed(const BatchFeedback& f) const noexcept { state_->learn(f); }

  // The current linear cost model. Never allocates. Thread-safe.
  [[nodiscard]] AdaptiveCostModel cost_model() const noexcept { return state_->cost_model(); }
  // The modelled cost of a batch of `batch_size` (clamped to [1, max_batch]) as decide()
  // uses it (piecewise where sizes were seen), seconds; 0 before any feedback. Thread-safe.
  [[nodiscard]] double estimate_seconds(std::size_t batch_size) const noexcept { return state_->estimate(batch_size); }
  // The estimated arrival rate at `now`, requests per second; 0 until a few arrivals were
  // seen. Thread-safe.
  [[nodiscard]] double rate_rps(BatchTime now) const noexcept { return state_->rate(now); }
  // The plan in force: the target size and window decide() uses, the rate it was made
  // for and its predicted p95/p99 (before the first plan: the cap, a zero window).
  // Never allocates. Thread-safe.
  [[nodiscard]] AdaptivePlan plan() const noexcept { return state_->plan(); }
  // What the planner predicts for a FixedWindow(batch, window) at `rate` requests/s on
  // `lanes` lanes with the cost model learned so far (predicted_* stay 0 before any
  // feedback): the figures decide() chooses its plan by. Takes the state's lock for the
  // planning simulation (a few hundred microseconds); never allocates. Thread-safe.
  [[nodiscard]] AdaptivePlan predict(double rate, std::size_t lanes, std::size_t batch, BatchDuration window) const noexcept {
    return state_->predict(rate, lanes, batch, window);
  }

 private:
  std::size_t max_batch_;
  std::shared_ptr<detail::AdaptiveState> state_;
};

static_assert(BatchPolicy<AdaptiveWindow>);
static_assert(BatchFeedbackPolicy<AdaptiveWindow>);

}  // namespace tailbatch
