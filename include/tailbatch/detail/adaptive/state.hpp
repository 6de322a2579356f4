// AdaptiveWindow's learned state (see <tailbatch/adaptive_window.hpp> and
// docs/adaptive-window.md): the cost table it fits from the lanes' feedback, the arrival
// count (ArrivalCounter), the planner (a (window, size) grid played through a model of the
// lanes, in bounded slices, cached per rate band), the plan's rule, the lookahead
// (LaneLookahead) and the metrics that explain it. One class, because every part reads the
// same plan and cost table under one lock.
//
// Thread-safety: every public member takes the state's mutex. Allocates in its
// constructor only (and registering metrics may throw what the registry throws); nothing
// else throws.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <tailbatch/adaptive_plan.hpp>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/adaptive/arrival_counter.hpp>
#include <tailbatch/detail/adaptive/lane_lookahead.hpp>
#include <tailbatch/detail/hash.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/metrics.hpp>
#include <vector>

namespace tailbatch::detail {

// The policy's learned state. Guarded by `mu_`; see AdaptiveWindow.
class AdaptiveState {
 public:
  // A running mean per size weighs the last this-many samples (follows a drifting model).
  static constexpr double size_memory = 32.0;
  // A sample above this multiple of its size's mean is clipped to it (a stall, a page
  // fault) once the size has enough samples to trust its mean.
  static constexpr double outlier_ratio = 1.5;
  // Plans are made for rates on a geometric grid of this ratio, and remembered.
  static constexpr double rate_step = 1.04;
  // The model is re-planned when L(1), or L(b) at the largest size with a trusted mean
  // (the sizes in use), moved by more than this fraction since the last plan's model.
  // (On the real clock a model's time spreads: a running mean over 32 samples wanders by
  // several per cent on its own, and a tighter bound re-planned all the time. The cap's
  // cost is not watched: beyond the sizes in use it is the fitted line's extrapolation,
  // which the noise of the slope moves by far more than the model moves.)
  static constexpr double cost_drift = 0.10;
  // The spread of the model's time: the last this-many ratios of a batch's time to its
  // size's mean, replayed on the planner's batches, so that the plans see the tail a real
  // model has. 1.0 each until measured: a model whose time does not spread plans as
  // before. A batch draws the ratio its first request's place in the simulated arrivals
  // hashes to (spread_slot), so every candidate of a plan meets the same slow spells at
  // the same requests, and two candidates differ by their windows and sizes rather than
  // by which batch happened to draw a slow ratio (common random numbers).
  static constexpr std::size_t spread_samples = 128;
  // A ratio is capped here (a stall of seconds is not a cost to plan with).
  static constexpr double spread_cap = 8.0;
  // Requests in the planning simulation (the first tenth is its warm-up).
  static constexpr std::size_t plan_requests = 6000;
  // A call advances a plan in the making by at most a slice of simulated requests (and
  // one batch): about slice_per_second x the model time of the batch just run, within
  // [plan_slice_min, plan_slice_max]. A simulated request costs 20-40 ns on 2 shared
  // cores, so a slice is about 1 % of the batch's time from 1 ms batches up (from 33 ms
  // batches: the ceiling, 1 % or less), and the floor, about 5-10 us, below: short
  // batches get the bound on the time added per batch, slow models plans that finish in
  // few batches. On the real clock a plan is in the making most of the time (a model's
  // cost wanders by 10 % within seconds, and each such move is a re-plan), so the slice
  // is the planner's share of the model's time (docs/performance.md). A plan for a rate
  // more than urgent_move from the plan in force's, or the first plan, is urgent (until
  // it is done the plan in force is one for another load): its slices are
  // urgent_slice_per_second x the model time, within [urgent_slice_min, plan_slice_max].
  static constexpr double slice_per_second = 250000.0;
  static constexpr std::size_t plan_slice_min = 256;
  static constexpr double urgent_slice_per_second = 500000.0;
  static constexpr std::size_t urgent_slice_min = 1024;
  static constexpr double urgent_move = 0.10;
  static constexpr std::size_t plan_slice_max = 8192;
  // Window candidates, as fractions of a batch of one's cost.
  static constexpr std::array<double, 12> window_grid = {0.0, 0.025, 0.05, 0.1, 0.15, 0.25,
                                                         0.4, 0.5,   0.75, 1.0, 1.5,  2.0};
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
  // The objective: among the plans that ran to the end (see start_job: the plan for the
  // nearest rate, and each candidate that matched or lowered the lowest tail so far), the
  // ones whose predicted tail (p95 over its target, or p99 over its target when that is
  // worse) is within this fraction of the lowest are equally good for latency; of them the
  // one that spends the least lane time per request wins. (Applied to every candidate of
  // the grid, with the cut below at the lowest tail plus this fraction, it missed the
  // simulated goal: see docs/adaptive-window.md.)
  static constexpr double tail_tolerance = 0.05;
  // At light load (a rate at most light_load times what the lanes serve one request at a
  // time), a plan whose tail is above the lowest by at most light_slack x the cost of a
  // batch of one, and by at most light_room of the target, counts as equally good for
  // latency too if it pays for it: its lane time per request must be below the
  // lowest-tail plan's by at least light_exchange times the fraction its tail is above
  // the lowest (a plan 8 % above must save 2 %; at light load this holds for every plan
  // above the lowest, those within tail_tolerance too). The search runs such plans to the
  // end. There the lowest tail is a model call plus little queueing, and a window a
  // fraction of that call long batches requests that would otherwise each cost a call.
  // light_room keeps the rise one the target cannot see (0.25 ms under a 50 ms target);
  // the exchange keeps it off a model whose batches save little (the simulated
  // no-batching-gain profile, where the slack alone, at 0.10 x L(1), missed the goal of
  // p95 within 5 % of the best static setting: docs/adaptive-window.md). light_load is
  // where one request at a time keeps the lanes at most 60 % busy: applied up to 1.5x, the
  // same slack raised p95 over the fixed window's by more than the live goal's 10 % at
  // rates from 800 to 5100 requests/s on the reference classifier (docs/performance.md).
  static constexpr double light_load = 0.6;
  static constexpr double light_slack = 0.25;
  static constexpr double light_room = 0.005;
  static constexpr double light_exchange = 0.25;
  // How much cheaper per request the larger batch must be for the lookahead to weigh it.
  static constexpr double lookahead_gain = 0.98;
  // How much cheaper per request a larger batch must be for the keep-up and backlog rules
  // to send it, with several lanes: there a larger batch takes work the other lanes could
  // run, so it must buy a clear saving. With one lane nothing else could run the work, and
  // any saving (lookahead_gain) is throughput.
  static constexpr double spread_gain = 0.8;

  explicit AdaptiveState(const AdaptiveWindowConfig& c)
      : slo_p95_(c.slo_p95),
        slo_p99_(c.slo_p99),
        cap_(c.max_batch),
        sizes_(c.max_batch + 1),
        table_(c.max_batch + 1, 0.0),
        epoch_table_(c.max_batch + 1, 0.0),
        lookahead_(c.max_batch, max_plan_lanes) {
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
    {
      // The measured requests' latencies above the p95 (rank k95 of `measured`), and it.
      const std::size_t measured = plan_requests - plan_requests / 10;
      const auto k95 = static_cast<std::size_t>(0.95 * static_cast<double>(measured - 1));
      job_top_.resize(measured - k95);
    }
    job_lane_free_.resize(max_plan_lanes);
    job_window_free_.resize(batch_grid_.size());
    job_done_.resize(window_grid.size() * batch_grid_.size());
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
    if (s.weight >= 3.0 && s.mean > 0.0) {
      spread_[spread_next_] = std::min(x / s.mean, spread_cap);
      spread_next_ = (spread_next_ + 1) % spread_samples;
    }
    const double clipped = s.weight >= 3.0 ? std::min(x, outlier_ratio * s.mean) : x;
    s.weight = std::min(s.weight + 1.0, size_memory);
    s.mean += (clipped - s.mean) / s.weight;
    ++samples_;
    // The lane that ran it frees now (the lookahead reads when each lane frees).
    lookahead_.finished(
        saturating_add(f.started, std::chrono::duration_cast<BatchDuration>(f.model_time)), lanes_);
    refit();
    if (m_.feedback != nullptr) m_.feedback->inc();
    // Planning happens here, on the thread that just ran a batch, rather than in decide():
    // batch formation never waits for it.
    replan_if_stale(f.started, x);
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
        cheaper_by(all, base, lookahead_gain) && lookahead(v, all) < lookahead(v, d.count)) {
      d = BatchDecision::dispatch(all, DispatchReason::size);
      reason_ = AdaptiveCloseReason::lookahead;
    }
    // Only a dispatch with a lane to run it is counted (as taken off the queue, as a
    // close, and as that lane's work): the Pipeline does not act on the others.
    if (d.count > 0 && v.idle_lanes > 0) {
      if (Counter* c = m_.closes[static_cast<std::size_t>(reason_)]) c->inc();
      arrivals_.dispatched(d.count);
      lookahead_.dispatched(v.now, lanes_, to_duration(cost(std::min(d.count, cap_))));
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
    const BatchDuration slo =
        slo_p99_ > BatchDuration::zero() ? std::min(slo_p95_, slo_p99_) : slo_p95_;
    if (planned_) {
      // A rise in load the plan has not caught up with yet (it was made for well under the
      // rate counted now): no smaller than the size that keeps up with the counted rate,
      // until the plan for it is in force.
      double r = rate_at(v.now);
      // The queue tells of a rise before the count does: n requests that arrived within
      // the oldest one's wait came at (n - 1) / wait at least.
      if (n >= view_rate_min) {
        const double waited =
            std::chrono::duration<double>(v.now - window_start(v.candidates)).count();
        const double seen = waited > 0.0 ? static_cast<double>(n - 1) / waited : 0.0;
        if (seen > view_rise * plan_.rate_rps) r = std::max(r, seen);
      }
      if (r > stale_rise * plan_.rate_rps) {
        const std::size_t keep = keep_up_size(r);
        if (keep > target && cheaper_per_request(keep, target)) target = keep;
      }
      // One lane, free again, with more queued than the target: what queued behind the
      // batch it ran is the next batch, up to the cap, where a larger batch is any cheaper
      // per request. No other lane could run the rest, so holding it back would only make
      // it wait a whole batch more (the fixed window at the cap does the same).
      if (lanes_ == 1 && v.idle_lanes > 0 && n > target) {
        const std::size_t take = std::min(n, cap_);
        if (cheaper_per_request(take, target))
          return close(
              take, DispatchReason::size,
              take == cap_ ? AdaptiveCloseReason::max_batch : AdaptiveCloseReason::backlog);
      }
      // A backlog: more queued than batches of the target can drain within the SLO on
      // the lanes there are. Where larger batches are cheaper per request, close the
      // smallest size that does drain it (the cap if none does). (Where batching buys
      // nothing, larger batches would only take work away from the other lanes.)
      const std::size_t queued = std::max(v.queued, n);
      if (queued > target) {
        const BatchDuration age = v.now - window_start(v.candidates);
        const std::size_t s =
            drain_size(queued, target, slo - std::max(age, BatchDuration::zero()));
        if (s > target && cheaper_per_request(s, target)) {
          const std::size_t take = std::min(s, n);
          return close(
              take, DispatchReason::size,
              take == cap_ ? AdaptiveCloseReason::max_batch : AdaptiveCloseReason::backlog);
        }
      }
    }
    if (n >= target) {
      return close(
          target, DispatchReason::size,
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

  AdaptivePlan predict(double rate, std::size_t lanes, std::size_t batch,
                       BatchDuration window) noexcept {
    std::lock_guard lock(mu_);
    AdaptivePlan p;
    p.batch = std::clamp<std::size_t>(batch, 1, cap_);
    p.window = std::max(window, BatchDuration::zero());
    p.rate_rps = rate;
    if (epoch_ == 0 || !(rate > 0.0)) return p;
    const std::size_t saved = lanes_;
    lanes_ = std::clamp<std::size_t>(lanes, 1, max_plan_lanes);
    simulate_fixed(rate, p.batch, std::chrono::duration<double>(p.window).count(),
                   p.predicted_p95_s, p.predicted_p99_s);
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
  struct Cached {
    std::int64_t bucket = 0;
    std::uint64_t epoch = 0;
    std::size_t lanes = 0;
    AdaptivePlan plan{};
    std::size_t wi = 0, bi = 0;  // its cell of the grid
    bool used = false;
  };
  // A plan in the making (see start_job); it advances by at most a slice of simulated
  // requests per call.
  struct PlanJob {
    bool active = false;
    bool any_feasible = false;
    bool running = false;  // a candidate's simulation is under way
    double rate = 0.0;
    std::int64_t bucket = 0;
    std::uint64_t epoch = 0;
    std::size_t lanes = 1;
    std::size_t order_first = 0;   // the candidate tried first (the plan in force)
    std::size_t next = 0;          // candidates begun
    std::size_t index = 0, b = 1;  // the candidate running, and its size and window
    double w = 0.0;
    bool window_mattered = false, size_mattered = false;
    // The first window index from which, for a size, every longer window plays out the
    // same (job_window_free_); likewise per window the first size index (size_free).
    std::array<std::size_t, window_grid.size()> size_free{};
    std::size_t h = 0;       // requests simulated so far
    double lane_time = 0.0;  // the candidate's lane time so far, seconds
    std::size_t over95 = 0, over99 = 0;
    std::size_t top_count = 0;  // latencies in job_top_
    AdaptivePlan best{};
    double best_score = std::numeric_limits<double>::infinity();
    double slack = 0.0;  // at light load, the rise of the tail (in score) still as good
    std::size_t best_index = 0;
  };
  // A candidate that ran to the end, as the objective weighs it.
  struct Candidate {
    double score = 0.0, per_request = 0.0, window = 0.0, p95 = 0.0, p99 = 0.0;
    std::size_t index = 0, batch = 1;
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

  static constexpr std::array<double, spread_samples> filled_ones() noexcept {
    std::array<double, spread_samples> a{};
    a.fill(1.0);
    return a;
  }

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

  // The late requests (see LaneLookahead::late) if `first` go now, under the plan in force.
  double lookahead(const BatchView& v, std::size_t first) noexcept {
    LaneLookahead::Plan p;
    p.lanes = lanes_;
    p.rate = rate_at(v.now);
    p.batch = std::min(plan_.batch, cap_);
    p.window_s = std::chrono::duration<double>(plan_.window).count();
    p.late_after_s = plan_.predicted_p95_s;
    return lookahead_.late(v, first, p, table_, unit_arrivals_);
  }

  // The modelled cost of a batch of b (1 <= b <= cap), seconds; 0 before any feedback.
  double cost(std::size_t b) const noexcept { return table_[b]; }

  // Whether a batch of `big` costing `big_cost` costs less per request than `gain` times a
  // batch of `small` costing `small_cost`.
  static bool cheaper_by(double big_cost, std::size_t big, double small_cost, std::size_t small,
                         double gain) noexcept {
    return big_cost * static_cast<double>(small) < gain * small_cost * static_cast<double>(big);
  }

  // The same, by the cost table.
  bool cheaper_by(std::size_t big, std::size_t small, double gain) const noexcept {
    return cheaper_by(cost(big), big, cost(small), small, gain);
  }

  // Whether batches of `big` cost enough less per request than batches of `small` for the
  // keep-up, one-lane and backlog rules to send them (spread_gain; lookahead_gain on one
  // lane): by the cost table, or by the fitted line. The means can hold the target down:
  // the target, measured cheap, stays the target, and a larger size measured dear in a
  // neighbour's burst (or only extrapolated) is never run again to correct it (live, a
  // lane stuck at batches of 12 below the rate where the fixed window sent 28). The line,
  // over every size seen, is the steadier judge: with a cost per call (intercept > 0) a
  // larger batch is cheaper per request, as the fixed window at the cap assumes; where
  // batching buys nothing (the fit through the origin) it says so too.
  bool cheaper_per_request(std::size_t big, std::size_t small) const noexcept {
    const double gain = lanes_ == 1 ? lookahead_gain : spread_gain;
    const auto line = [this](std::size_t b) {
      return intercept_ + slope_ * static_cast<double>(b);
    };
    return cheaper_by(big, small, gain) || cheaper_by(line(big), big, line(small), small, gain);
  }

  // The smallest size whose batches keep the lanes at most keep_up_load busy at `rate`
  // (1 when none does: then no size keeps up, and a larger one would only add its cost).
  // O(max_batch).
  std::size_t keep_up_size(double rate) const noexcept {
    for (std::size_t b = 1; b <= cap_; ++b)
      if (rate * cost(b) <= keep_up_load * static_cast<double>(lanes_) * static_cast<double>(b))
        return b;
    return 1;
  }

  // The smallest size from `target` up whose batches, on every lane, run `queued`
  // requests within `budget` less a tenth of the SLO (rounds of batches times a batch's
  // cost); the cap when none does. O(max_batch).
  std::size_t drain_size(std::size_t queued, std::size_t target,
                         BatchDuration left) const noexcept {
    const double budget = std::chrono::duration<double>(left).count() -
                          0.1 * std::chrono::duration<double>(slo_p95_).count();
    for (std::size_t s = target; s <= cap_; ++s) {
      const std::size_t per_round = s * lanes_;
      const auto rounds = static_cast<double>((queued + per_round - 1) / per_round);
      if (rounds * cost(s) <= budget) return s;
    }
    return cap_;
  }

  // Counts arrivals (ArrivalCounter) and shows the rate.
  void observe_arrivals(const BatchView& v) noexcept {
    arrivals_.observe(v);
    if (m_.rate != nullptr) m_.rate->set(rate_at(v.now));
  }

  double rate_at(BatchTime now, std::uint64_t* counted = nullptr) const noexcept {
    return arrivals_.rate_at(now, counted);
  }

  // Rebuilds the cost table from the per-size means: a weighted least-squares line over
  // the sizes seen, the means themselves where a size has enough samples, linear
  // interpolation between such sizes, and the line's slope beyond them (scaled down where the
  // largest such size lies below the line).
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
        for (std::size_t i = 1; i < b; ++i)
          table_[i] = sizes_[b].mean - slope * static_cast<double>(b - i);
      } else {
        const double a = table_[prev], z = sizes_[b].mean;
        for (std::size_t i = prev + 1; i < b; ++i)
          table_[i] = a + (z - a) * static_cast<double>(i - prev) / static_cast<double>(b - prev);
      }
      prev = b;
    }
    if (prev == 0) {
      for (std::size_t b = 1; b <= cap_; ++b)
        table_[b] = intercept + slope * static_cast<double>(b);
    } else {
      // Beyond the largest trusted size the line's slope, scaled down where that size's
      // mean lies below the line (a cost that flattens as batches grow): there the line's
      // slope would make each request of a larger batch cost more than one of that size,
      // the sizes above would never be tried, and their real cost never learned. Scaled,
      // the extension keeps the line's shape from that size up (cost per request falling
      // with size whenever the line's intercept is above zero).
      const double on_line = intercept + slope * static_cast<double>(prev);
      const double k = on_line > 0.0 ? std::min(1.0, table_[prev] / on_line) : 1.0;
      for (std::size_t b = prev + 1; b <= cap_; ++b)
        table_[b] = table_[prev] + k * slope * static_cast<double>(b - prev);
    }
    // Never free, never cheaper than a smaller batch.
    table_[1] = std::max(table_[1], 1e-9);
    for (std::size_t b = 2; b <= cap_; ++b) table_[b] = std::max(table_[b], table_[b - 1]);
    // A new epoch when the model moved enough to change plans: at size 1, or at the
    // largest size with a trusted mean (the cap while none is trusted), against the table
    // of the last epoch.
    const std::size_t top = prev == 0 ? cap_ : prev;
    if (epoch_ == 0 || drifted(1) || drifted(top)) {
      ++epoch_;
      std::copy(table_.begin(), table_.end(), epoch_table_.begin());
    }
  }

  bool drifted(std::size_t b) const noexcept {
    return detail::fabs(table_[b] - epoch_table_[b]) > cost_drift * epoch_table_[b];
  }

  std::int64_t bucket_of(double rate) const noexcept {
    return static_cast<std::int64_t>(detail::floor(detail::log(rate) / detail::log(rate_step)));
  }

  // The slice of simulated requests a call may run for a plan at `rate`, after a batch
  // whose model time was `model_s` (see slice_per_second).
  std::size_t slice_for(double model_s, double rate) const noexcept {
    const bool urgent =
        !planned_ || detail::fabs(rate - plan_.rate_rps) > urgent_move * plan_.rate_rps;
    const double per_second = urgent ? urgent_slice_per_second : slice_per_second;
    const double slice = std::min(model_s * per_second, static_cast<double>(plan_slice_max));
    return std::max(urgent ? urgent_slice_min : plan_slice_min, static_cast<std::size_t>(slice));
  }

  // Makes sure the plan in force is for the current rate bucket, lanes and cost epoch:
  // from the cache at once, or by a planning job that runs in bounded slices, one per call
  // (see advance_job). The plan in force stays in force until the job ends.
  void replan_if_stale(BatchTime now, double model_s) noexcept {
    const double rate = rate_at(now);
    // A plan in the making for a rate the load has since left far behind is dropped: the
    // one for the rate now is started instead.
    if (job_.active && rate > 0.0 &&
        detail::fabs(rate - job_.rate) > (stale_rise - 1.0) * job_.rate)
      job_.active = false;
    // The slice: for the plan in the making, else for the one this call may start (a
    // slice left over when a plan ends goes to the next).
    std::size_t budget = slice_for(model_s, job_.active ? job_.rate : rate);
    if (job_.active) {
      advance_job(budget);
      if (job_.active) return;
    }
    if (rate <= 0.0 || epoch_ == 0) return;
    const std::int64_t bucket = bucket_of(rate);
    if (planned_ && bucket == plan_bucket_ && epoch_ == plan_epoch_ && lanes_ == plan_lanes_)
      return;
    for (const Cached& c : cache_) {
      if (c.used && c.bucket == bucket && c.epoch == epoch_ && c.lanes == lanes_) {
        adopt(c.plan, bucket, c.epoch, c.lanes, c.wi, c.bi);
        return;
      }
    }
    start_job(detail::pow(rate_step, static_cast<double>(bucket) + 0.5), bucket);
    advance_job(budget);
  }

  void adopt(const AdaptivePlan& p, std::int64_t bucket, std::uint64_t epoch, std::size_t lanes,
             std::size_t wi, std::size_t bi) noexcept {
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

  // A plan: the (window, size) candidates of the grid simulated at `rate` on a snapshot of
  // the learned cost table, each scored by its tail: the p95 over its target, or the p99
  // over its target when a p99 target is set and that is worse. The cell of the plan made
  // for the nearest rate (the plan in force, or a remembered one) runs first and always to
  // the end; then the grid in order (window by window from the shortest, each with its
  // sizes from the smallest), each candidate abandoned as soon as more of its requests
  // exceed the lowest tail so far (at light load, plus the slack: light_load) than the
  // percentile allows. So the candidates that run to the end are that first cell and each
  // one that matched or lowered the lowest tail (or came within the slack of it);
  // finish_job picks among them (the cheapest within tail_tolerance of the lowest). The
  // lowest tail itself is exact over the grid: neither the cut nor skipping a candidate
  // that would play out as one already run changes it. Sizes that cannot keep up with
  // the rate on the lanes are left out (when some size can).
  void start_job(double rate, std::int64_t bucket) noexcept {
    job_ = PlanJob{};
    job_.active = true;
    job_.rate = rate;
    job_.bucket = bucket;
    job_.epoch = epoch_;
    job_.lanes = lanes_;
    std::copy(table_.begin(), table_.end(), job_table_.begin());
    job_spread_ = spread_;
    job_done_count_ = 0;
    // The first candidate sets the bound the others are cut short against: the cell of
    // the plan made for the nearest rate (the plan in force, or a remembered one).
    job_.order_first = planned_ ? plan_wi_ * batch_grid_.size() + plan_bi_ : 0;
    std::int64_t nearest =
        planned_ ? std::abs(plan_bucket_ - bucket) : std::numeric_limits<std::int64_t>::max();
    for (const Cached& c : cache_) {
      if (c.used && c.lanes == lanes_ && std::abs(c.bucket - bucket) < nearest) {
        nearest = std::abs(c.bucket - bucket);
        job_.order_first = c.wi * batch_grid_.size() + c.bi;
      }
    }
    for (const std::size_t b : batch_grid_) {
      if (feasible(b)) job_.any_feasible = true;
    }
    if (rate * job_table_[1] <= light_load * static_cast<double>(lanes_)) {
      // In score units, against the larger target (the p99's, when set), so that neither
      // percentile may rise by more than light_slack x L(1) (nor light_room of it).
      const double target = std::chrono::duration<double>(std::max(slo_p95_, slo_p99_)).count();
      job_.slack = std::min(light_slack * job_table_[1] / target, light_room);
    }
    job_.best.batch = cap_;
    job_.best.rate_rps = rate;
    job_.best_index = std::numeric_limits<std::size_t>::max();
    job_.size_free.fill(std::numeric_limits<std::size_t>::max());
    std::fill(job_window_free_.begin(), job_window_free_.end(),
              std::numeric_limits<std::size_t>::max());
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
        job_.lane_time = 0.0;
        job_.over95 = 0;
        job_.over99 = 0;
        job_.top_count = 0;
        std::fill(job_lane_free_.begin(),
                  job_lane_free_.begin() + static_cast<std::ptrdiff_t>(job_.lanes), 0.0);
        --budget;
        continue;
      }
      // Beyond these the candidate's tail is above the lowest so far (plus the light-load
      // slack): it is abandoned (see start_job; its tail could still be within
      // tail_tolerance of the lowest, but the objective counts only the candidates that
      // ran to the end).
      const double cut = job_.best_score + job_.slack;
      const double cut95 = cut * p95_target;
      const double cut99 =
          p99_target > 0.0 ? cut * p99_target : std::numeric_limits<double>::infinity();
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
        const double service = job_table_[e - h] * job_spread_[spread_slot(h)];
        const double done = t + service;
        job_.lane_time += service;
        job_lane_free_[lane] = done;
        for (std::size_t i = h; i < e; ++i) {
          const double l = done - unit_arrivals_[i] * scale;
          if (i >= n / 10) {
            keep_top(l);
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
      // The candidate ran to the end: its percentiles, from the largest latencies kept as
      // it ran (the p95 is the smallest of them; sorting them, O(top log top), is all
      // that is left to do).
      job_.running = false;
      note_free();
      const auto top = job_top_.begin() + static_cast<std::ptrdiff_t>(job_.top_count);
      std::sort_heap(job_top_.begin(), top, std::greater<>{});  // largest first
      const double p95 = job_top_[job_.top_count - 1];
      const double p99 = job_top_[std::min(measured - 1 - k99, job_.top_count - 1)];
      double score = p95 / p95_target;
      if (p99_target > 0.0) score = std::max(score, p99 / p99_target);
      job_.best_score = std::min(job_.best_score, score);
      if (job_done_count_ < job_done_.size()) {
        Candidate& c = job_done_[job_done_count_++];
        c.score = score;
        c.per_request = job_.lane_time / static_cast<double>(n);
        c.index = job_.index;
        c.batch = job_.b;
        c.window = job_.w;
        c.p95 = p95;
        c.p99 = p99;
      }
    }
  }

  // Keeps the top_keep largest latencies of the candidate running (a min-heap): the p95
  // and the p99 are among them. O(log top_keep) for a value that enters, O(1) otherwise.
  void keep_top(double l) noexcept {
    const auto first = job_top_.begin();
    if (job_.top_count < job_top_.size()) {
      job_top_[job_.top_count++] = l;
      std::push_heap(first, first + static_cast<std::ptrdiff_t>(job_.top_count), std::greater<>{});
    } else if (l > job_top_.front()) {
      std::pop_heap(job_top_.begin(), job_top_.end(), std::greater<>{});
      job_top_.back() = l;
      std::push_heap(job_top_.begin(), job_top_.end(), std::greater<>{});
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
    // The objective, over the candidates that ran to the end (see start_job): within
    // tail_tolerance of the lowest tail (or the light-load slack above it, the larger; at
    // light load only a plan that saves lane time at light_exchange to its rise), the
    // least lane time per request; then the lower tail; then the candidate earlier in the
    // grid.
    const double tolerated = job_.best_score * (1.0 + tail_tolerance);
    const double bound = std::max(tolerated, job_.best_score + job_.slack);
    // The lane time per request of the lowest tail (the cheapest of the plans that have it).
    double lowest_cost = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < job_done_count_; ++i) {
      const Candidate& c = job_done_[i];
      if (c.score <= job_.best_score * (1.0 + 1e-9))
        lowest_cost = std::min(lowest_cost, c.per_request);
    }
    const Candidate* pick = nullptr;
    for (std::size_t i = 0; i < job_done_count_; ++i) {
      const Candidate& c = job_done_[i];
      if (c.score > bound + 1e-12) continue;
      // At light load a rise above the lowest tail must buy lane time (light_exchange).
      if (job_.slack > 0.0 && c.score > job_.best_score * (1.0 + 1e-9) &&
          lowest_cost - c.per_request <
              light_exchange * lowest_cost * (c.score - job_.best_score) / job_.best_score)
        continue;
      const bool better = pick == nullptr || c.per_request < pick->per_request * (1.0 - 1e-9) ||
                          (c.per_request <= pick->per_request * (1.0 + 1e-9) &&
                           (c.score < pick->score * (1.0 - 1e-9) ||
                            (c.score <= pick->score * (1.0 + 1e-9) && c.index < pick->index)));
      if (better) pick = &c;
    }
    if (pick != nullptr) {
      job_.best_index = pick->index;
      job_.best.batch = pick->batch;
      job_.best.window = to_duration(pick->window);
      job_.best.predicted_p95_s = pick->p95;
      job_.best.predicted_p99_s = pick->p99;
    }
    // Nothing finished (every candidate abandoned cannot happen: the first one has no
    // bound to be abandoned against); keep the cap with no window then all the same.
    const std::size_t wi = job_.best_index == std::numeric_limits<std::size_t>::max()
                               ? 0
                               : job_.best_index / batch_grid_.size();
    const std::size_t bi = job_.best_index == std::numeric_limits<std::size_t>::max()
                               ? batch_grid_.size() - 1
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

  // The spread ratio a batch whose first request is the h-th simulated arrival draws.
  static constexpr std::size_t spread_slot(std::size_t h) noexcept {
    return static_cast<std::size_t>(mix64(h) % spread_samples);
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
      const double done = t + table_[e - h] * spread_[spread_slot(h)];
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
    m_.intercept =
        &r.gauge("tailbatch_adaptive_cost_intercept_seconds",
                 "Learned batch cost model L(b) = intercept + slope x b: the intercept", base);
    m_.slope = &r.gauge(
        "tailbatch_adaptive_cost_slope_seconds",
        "Learned batch cost model L(b) = intercept + slope x b: the slope per request", base);
    m_.rate = &r.gauge("tailbatch_adaptive_arrival_rate",
                       "Estimated arrival rate, requests per second", base);
    m_.target = &r.gauge("tailbatch_adaptive_target_batch",
                         "The batch size the adaptive window aims for", base);
    m_.window =
        &r.gauge("tailbatch_adaptive_window_seconds",
                 "How long the adaptive window holds the oldest request for its target", base);
    m_.predicted = &r.gauge("tailbatch_adaptive_predicted_p95_seconds",
                            "p95 in queue and on the lane that the plan in force predicts", base);
    m_.feedback = &r.counter("tailbatch_adaptive_feedback_total",
                             "Executed batches the adaptive window learned from", base);
    m_.plans = &r.counter("tailbatch_adaptive_plans_total",
                          "Plans the adaptive window computed (cache misses)", base);
    for (std::size_t i = 0; i < adaptive_close_reason_count; ++i) {
      m_.closes[i] = &r.counter(
          "tailbatch_adaptive_closes_total", "Batches the adaptive window closed, by reason",
          join_labels(base,
                      {{"reason", std::string(to_string(static_cast<AdaptiveCloseReason>(i)))}}));
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
  std::array<double, spread_samples> spread_ = filled_ones();
  std::array<double, spread_samples> job_spread_ = filled_ones();
  std::size_t spread_next_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<double> epoch_table_;  // the cost table when the epoch began
  ArrivalCounter arrivals_{};
  AdaptiveCloseReason reason_ = AdaptiveCloseReason::flush;  // of plan_decide's close
  std::size_t lanes_ = 1;
  AdaptivePlan plan_{};
  bool planned_ = false;
  std::int64_t plan_bucket_ = 0;
  std::uint64_t plan_epoch_ = 0;
  std::size_t plan_lanes_ = 0;
  std::size_t plan_wi_ = 0, plan_bi_ = 0;
  PlanJob job_{};
  std::vector<double> job_table_;
  std::vector<double> job_top_;  // the running candidate's largest latencies (keep_top)
  std::vector<double> job_lane_free_;
  std::vector<std::size_t> job_window_free_;
  std::vector<Candidate> job_done_;
  std::size_t job_done_count_ = 0;
  std::uint64_t plans_ = 0;
  std::array<Cached, cache_size> cache_{};
  std::size_t next_slot_ = 0;
  Metrics m_{};
  LaneLookahead lookahead_;
};

}  // namespace tailbatch::detail
