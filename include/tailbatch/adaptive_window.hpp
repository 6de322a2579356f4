// AdaptiveWindow: a batch policy configured with the SLO, not with a window.
//
// The user states the latency target (a p95, optionally a p99) and the largest batch the
// model's memory allows; the policy learns the rest online and decides each close itself:
//
//   * the model's cost per batch size, from the lanes' measured execution times
//     (BatchFeedback, which the Pipeline and the simulator hand to on_batch_executed):
//     a robust running mean per batch size, interpolated piecewise-linearly between the
//     sizes it has seen and extrapolated beyond them by a weighted least-squares line's
//     slope (scaled down where the largest trusted size's mean lies below the line);
//   * the arrival rate, by counting the requests queued and dispatched (stamped with the
//     newest arrival when the view shows the whole queue), over the last 1024 arrivals
//     or, when the last 64 tell of a change of load (against the count since the last
//     change), over those since the change, counted from 16 arrivals before it was seen;
//   * the queue's and the lanes' state, from each BatchView (candidates, queued, lanes).
//
// From these it plans, and re-plans whenever the rate moves by more than 4 % or the cost
// model by more than 10 % (at size 1 or the largest size with a trusted mean): every
// (window, batch size) pair of a grid — windows from 0 to twice a batch of one's cost,
// sizes 1, 2, 3, 4, 6, 8, 12, ... up to the cap — is played through a small discrete-event
// model of the lanes (6000 Poisson arrivals at the estimated rate, served in the learned
// times, each scaled by the model's measured spread: the last 128 ratios of a batch's time
// to its size's mean, each batch drawing the ratio its first request's place hashes to, the
// same for every pair), and the objective picks the pair to put in force:
// the predicted p95 (or p99, when a p99 target is set and is the tighter) over its target,
// lowest; among the pairs within 5 % of that lowest tail, the one with the least lane time
// per request (the cheapest that is as fast); then the lower tail, then the shorter window
// and smaller size. The pairs compared so are those the search ran to the end: the plan
// for the nearest rate, tried first, and each pair that matched or lowered the lowest tail
// found so far (the others are cut short as soon as they are worse than it): in effect the
// plan in force stays while its tail is within 5 % of the lowest, unless a pair found on
// the way there is cheaper. At light load (a rate at which one request at a time would
// keep the lanes at most 60 % busy) a pair up to min(0.25 x the cost of a batch of one,
// 0.5 % of the target) above the lowest tail counts as fast enough if it pays for its
// rise: its lane time per request at least a quarter of that rise (as a fraction of the
// lowest tail) below the lowest-tail pair's. There a window a fraction of a model call
// long batches requests that would otherwise each pay a call.
// Plans are remembered per rate, so a load that comes back
// costs nothing to plan again.
//
// Planning cost, and its bound. Planning runs in on_batch_executed (which the Pipeline
// calls after the batch's completions, so they never wait for it), never in decide(), and
// in slices: one call advances the plan in the making by a slice of simulated requests
// sized to the batch that reported (about 250 000 per second of its model time, within
// 256 to 8192; for a plan for a rate more than 10 % from the plan in force's, or the
// first, twice that within 1024 to 8192), and a candidate's percentiles come from its
// largest latencies kept as it runs (no selection pass); the plan in force stays in
// force until the new one is done. That is the bound: O(slice + max_batch) per call,
// about 40 us at p99 per batch with a 0.3 ms model on 2 shared vCPUs and 8 us on average
// (bench_adaptive RealClock, Release), against about 7.5-16 ms for the whole grid in one
// call (BM_AdaptiveWindow_FullPlan). The search is exact but cut short where it cannot
// change the answer: the nearest rate's plan is tried first, a candidate is abandoned
// once more of its requests exceed the best objective so far than its percentile allows,
// a candidate that would play out exactly as one already run (a longer window where the
// window never closed a batch, a larger size where the size never did) is skipped, and
// so are sizes that cannot keep up with the rate. A plan for a new load takes about 10-40
// calls on a model of tens of ms (some 200 with 1-2 ms batches; a re-plan for a drifted
// cost, twice the calls for the same work); one made for a rate the load has left by
// more than 25 % is dropped for the plan of the rate now.
//
// decide() then closes a batch:
//
//   target_size  the queue holds the plan's batch size (it takes that many);
//   window       the oldest request has waited the plan's window;
//   backlog      the queue holds more than rounds of target-sized batches on every lane
//                run within the SLO (less what the oldest has waited and a tenth of the
//                SLO), and a larger batch is cheaper per request: the smallest size that
//                does drain it in time goes (the cap if none does). On one lane also
//                when the lane frees with more than the target queued: all of it goes,
//                up to the cap. "Cheaper" is by 20 % with several lanes (a larger batch
//                takes work another lane could run) and by 2 % on one, by the cost table
//                or by the fitted line (a size's mean can hold the target down: a size
//                measured cheap stays the target and the cap, never run, is never
//                measured);
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
//
// Where the parts are: adaptive_plan.hpp (the configuration, close reasons, cost model and
// plan types); detail/adaptive/state.hpp (the learned state: cost table, planner, the
// plan's rule, metrics); detail/adaptive/arrival_counter.hpp (the arrival rate);
// detail/adaptive/lane_lookahead.hpp (the lookahead). This file is the policy users hold.
#pragma once

#include <cstddef>
#include <memory>

#include <tailbatch/adaptive_plan.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/adaptive/state.hpp>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

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
  // the making by at most one slice of simulated requests (see the header comment: tens of
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
