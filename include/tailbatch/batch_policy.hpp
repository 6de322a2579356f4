// The batch-policy vocabulary: what every batch policy and the machinery that runs one
// speak. A policy is handed a BatchView (the queued candidates, the time, the lanes free)
// and answers a BatchDecision; the dispatch reasons, the BatchPolicy concepts and the
// feedback a policy may learn from live here. The shipped policies (FixedWindow,
// PreferredSizes, TokenBudget, DeadlineAware) are in batch_window.hpp, AdaptiveWindow in
// adaptive_window.hpp; a user policy needs only this header (see docs/batch-window.md).
//
// Plain types and concepts: no threads, no state; the helpers in detail:: are pure.
#pragma once


#include <algorithm>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/submit_options.hpp>

namespace tailbatch {

// Why a batch was dispatched; the label of the dispatch-reason counters.
enum class DispatchReason : std::uint8_t {
  size,          // the batch reached its size (max_batch, or a preferred size)
  window,        // the window (max_wait from the batch's first request) expired
  deadline,      // waiting longer would miss the tightest deadline in the batch
  token_budget,  // the next request would push max_len x batch over the token budget
  flush,         // the Pipeline is draining (shutdown) and waits for nothing
};
inline constexpr std::size_t dispatch_reason_count = 5;

// A short, stable, lower-case name ("token_budget"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(DispatchReason r) noexcept {
  return detail::enum_name<dispatch_reason_count>(
      r, {"size", "window", "deadline", "token_budget", "flush"});
}

// The order in which requests of one priority are considered for a batch.
enum class BatchOrder : std::uint8_t {
  fifo,               // arrival order
  earliest_deadline,  // earliest deadline first; requests without a deadline last, in arrival order
};

// Every policy reads time as BatchTime (submit_options.hpp): std::chrono::steady_clock
// time points, which both SteadyClock and ManualClock produce.

// The largest max_batch a shipped policy accepts (and the largest PreferredSizes size).
// Batch buffers are sized by max_batch when a Pipeline is built, so a larger value is a
// configuration mistake (std::invalid_argument naming the field), never an allocation of
// gigabytes. Models batch tens to thousands of requests; 65536 leaves room for all of them.
inline constexpr std::size_t max_batch_limit = 65536;

// One queued request as a policy sees it.
struct BatchCandidate {
  BatchTime arrival{};                   // when it was submitted
  // The latest time the request may start executing (the Pipeline's SubmitOptions::deadline,
  // already bounded by its timeout). BatchTime::max(): none.
  BatchTime deadline = BatchTime::max();
  std::size_t cost = 1;                   // its length in tokens (TokenBudget); 1 when unused
  Priority priority = Priority::normal;
};

// What a policy decides on: the requests that could form the next batch, in the order the
// batch would take them (higher priority first, then the policy's BatchOrder; a request
// that is starving comes first), at most max_batch() of them. Requests past their deadline
// or cancelled are never shown: the Pipeline completes them before asking.
struct BatchView {
  std::span<const BatchCandidate> candidates;
  // How many compatible requests are queued in all (>= candidates.size()).
  std::size_t queued = 0;
  BatchTime now{};
  // True while the Pipeline drains for shutdown: dispatch what fits now, never wait.
  bool flush = false;
  // Lane slots free to run a batch at this moment, and lane slots in all. A policy may
  // close early when a slot is idle and waiting would not pay, or wait while none is.
  // A view may show 0 idle lanes: the Pipeline asks before it leases a slot. A dispatch
  // decided on such a view is not acted on then: the requests stay queued (the batch may
  // grow) and the policy is asked again when a slot frees.
  std::size_t idle_lanes = 1;
  std::size_t lanes = 1;
};

// A policy's answer.
struct BatchDecision {
  // Dispatch the first `count` candidates now; 0 means wait.
  std::size_t count = 0;
  // The batch size the model is called with, when larger than count: the policy pads the
  // batch up to this size (PreferredSizes). 0 or count: no padding.
  std::size_t padded_size = 0;
  DispatchReason reason = DispatchReason::window;
  // When count == 0: the decision may change at this time even if nothing else happens.
  BatchTime decide_again_at = BatchTime::max();
  // When count == 0: the decision may change once `queued` reaches this many.
  std::size_t decide_again_at_queued = std::numeric_limits<std::size_t>::max();
  // When count == 0: the decision may change if a request arrives whose deadline is
  // earlier than this. BatchTime::min(): deadlines never change it.
  BatchTime decide_again_if_deadline_before = BatchTime::min();

  // Shorthands for policies. Never allocate. Thread-safe.
  [[nodiscard]] static constexpr BatchDecision dispatch(std::size_t n, DispatchReason why,
                                                        std::size_t padded = 0) noexcept {
    BatchDecision d;
    d.count = n;
    d.reason = why;
    d.padded_size = padded;
    return d;
  }
  [[nodiscard]] static constexpr BatchDecision wait(BatchTime until, std::size_t until_queued,
                                                    BatchTime deadline_before = BatchTime::min()) noexcept {
    BatchDecision d;
    d.decide_again_at = until;
    d.decide_again_at_queued = until_queued;
    d.decide_again_if_deadline_before = deadline_before;
    return d;
  }
};

// What a Pipeline (or the simulator) needs of a batch policy.
//
//   p.max_batch()  the most requests one batch may hold (>= 1); views hold at most this many
//                  candidates, and batch buffers are sized by it.
//   p.order()      how requests of one priority are ordered (BatchOrder).
//   p.decide(v)    the decision for view v at time v.now. Must be a pure function of v and
//                  the policy's configuration, noexcept, and must dispatch at least one
//                  request when v.flush is true and v.candidates is not empty. A dispatch
//                  count must not exceed v.candidates.size().
//
// Optional members, detected by the Pipeline:
//   p.max_cost()           a request whose cost exceeds this can never be batched: it is
//                          rejected at submit (Status::rejected, RejectReason::too_large).
//   p.bucket_count(), p.bucket_of(cost)
//                          requests are grouped by cost: a batch only holds requests of
//                          one bucket, and each bucket is decided on separately.
//   P::uses_cost           a static constexpr bool: true when the policy reads
//                          BatchCandidate::cost, so the Pipeline needs a cost function.
//   p.on_batch_executed(f) told how each executed batch went (BatchFeedbackPolicy).
//
// Policies are copied into the Pipeline; every member must be safe to call from several
// threads at once (they are const and stateless).
template <class P>
concept BatchPolicy = std::copy_constructible<P> && requires(const P& p, const BatchView& v) {
  { p.max_batch() } noexcept -> std::same_as<std::size_t>;
  { p.order() } noexcept -> std::same_as<BatchOrder>;
  { p.decide(v) } noexcept -> std::same_as<BatchDecision>;
};

// A policy that groups requests by cost into buckets (see BatchPolicy).
template <class P>
concept BucketedBatchPolicy = BatchPolicy<P> && requires(const P& p, std::size_t cost) {
  { p.bucket_count() } noexcept -> std::same_as<std::size_t>;
  { p.bucket_of(cost) } noexcept -> std::same_as<std::size_t>;
};

// A policy with a largest admissible single-request cost (see BatchPolicy).
template <class P>
concept CostLimitedBatchPolicy = BatchPolicy<P> && requires(const P& p) {
  { p.max_cost() } noexcept -> std::same_as<std::size_t>;
};

// How one executed batch went: what a policy that learns (AdaptiveWindow) is told after
// each model call.
struct BatchFeedback {
  std::size_t size = 0;         // requests in the batch
  std::size_t padded_size = 0;  // the batch size the model was called with (>= size)
  std::chrono::nanoseconds model_time{0};  // the model call's duration on its lane
  std::size_t lane = 0;         // the lane it ran on
  BatchTime started{};          // when the model call began
  bool failed = false;          // the model call threw
  BatchTime closed{};           // when the policy closed the batch (its dispatch decision)
  DispatchReason reason = DispatchReason::window;  // why it closed
};

// A policy that wants to know how each executed batch went. The Pipeline calls
// p.on_batch_executed(f) once per executed batch, after the model call and after the
// batch's completions (so the policy's work never delays them; the simulator calls it at
// the model call); policies without the member pay nothing. It may be
// called from several worker threads at once, concurrently with decide(): a policy that
// learns keeps its state behind a thread-safe handle, so that copies share it.
template <class P>
concept BatchFeedbackPolicy = BatchPolicy<P> && requires(const P& p, const BatchFeedback& f) {
  { p.on_batch_executed(f) } noexcept;
};

namespace detail {

template <class P>
constexpr bool policy_uses_cost() noexcept {
  if constexpr (requires { P::uses_cost; }) {
    return static_cast<bool>(P::uses_cost);
  } else {
    return false;
  }
}

// The earliest arrival among the candidates: when the batch's window opened.
inline BatchTime window_start(std::span<const BatchCandidate> c) noexcept {
  BatchTime start = BatchTime::max();
  for (const BatchCandidate& x : c) start = std::min(start, x.arrival);
  return start;
}

// When the window that opened at the candidates' earliest arrival closes.
inline BatchTime window_expiry(std::span<const BatchCandidate> c, BatchDuration max_wait) noexcept {
  return saturating_add(window_start(c), max_wait);
}

// The first triggers of FixedWindow's and DeadlineAware's decide(): wait while nothing is
// queued, send max_batch at once when that many are, and everything queued on flush.
// nullopt: the policy's own triggers decide.
inline std::optional<BatchDecision> size_or_flush(const BatchView& v,
                                                  std::size_t max_batch) noexcept {
  const std::size_t n = v.candidates.size();
  if (n == 0) return BatchDecision::wait(BatchTime::max(), 1);
  if (n >= max_batch) return BatchDecision::dispatch(max_batch, DispatchReason::size);
  if (v.flush) return BatchDecision::dispatch(n, DispatchReason::flush);
  return std::nullopt;
}

inline void require_non_negative(BatchDuration d, const char* what) {
  if (d < BatchDuration::zero()) throw_invalid_argument(what);
}

// Checks 1 <= max_batch <= max_batch_limit; `who` names the policy ("FixedWindow").
inline void require_max_batch(std::size_t max_batch, std::string_view who) {
  if (max_batch < 1) throw_invalid_argument((std::string(who) + ": max_batch must be >= 1").c_str());
  if (max_batch > max_batch_limit) {
    throw_invalid_argument((std::string(who) + ": max_batch must be <= " + std::to_string(max_batch_limit)).c_str());
  }
}

}  // namespace detail

}  // namespace tailbatch
