// Batch windows: when a batch closes.
//
// A batch policy is a pure decision object. It holds configuration only, and answers one
// question — "given these queued requests at this time, dispatch a batch now, and how big,
// or wait until when?" — from the time reading it is handed. It owns no threads, reads no
// clock and keeps no state between calls, so the same policy object drives a Pipeline on
// the steady clock, a Pipeline stepped by hand on a ManualClock, and the discrete-event
// simulator alike.
//
// Shipped policies:
//   FixedWindow     max_batch and max_wait; the window opens at the batch's first request.
//   PreferredSizes  dispatch at once on a preferred size; pad up, split or send as is after
//                   max_wait.
//   TokenBudget     closes when max_len x batch would exceed a padded-token budget; requests
//                   are bucketed by length; an oversized request is rejected at once.
//   DeadlineAware   earliest deadline first; closes early so that the batch starts before
//                   the tightest deadline (a deadline is a latest start time).
// Every shipped policy holds at most max_batch_limit (65536) requests per batch.
// A user policy is any type satisfying BatchPolicy (see docs/batch-window.md).
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

#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/time.hpp>
#include <tailbatch/submit_options.hpp>

namespace tailbatch {

// The classic dynamic-batching window: a batch closes when it holds max_batch requests
// or when max_wait has passed since its first request arrived, whichever comes first.
// Start with max_wait around 5 ms for real-time traffic (2-10 ms is the usual range) and
// max_batch at the size where the model's throughput stops growing.
//
// Immutable after construction; thread-safe. The constructor throws std::invalid_argument
// naming the field; decide() never throws.
class FixedWindow {
 public:
  // max_batch in [1, max_batch_limit], max_wait >= 0; otherwise throws
  // std::invalid_argument naming the field. Never allocates (but to build the message).
  FixedWindow(std::size_t max_batch, BatchDuration max_wait) : max_batch_(max_batch), max_wait_(max_wait) {
    detail::require_max_batch(max_batch, "FixedWindow");
    detail::require_non_negative(max_wait, "FixedWindow: max_wait must be >= 0");
  }

  // The configured batch size cap. Thread-safe.
  [[nodiscard]] std::size_t max_batch() const noexcept { return max_batch_; }
  // The configured window length. Thread-safe.
  [[nodiscard]] BatchDuration max_wait() const noexcept { return max_wait_; }
  // Arrival order. Thread-safe.
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }

  // Size trigger first, then the window. Never allocates. Thread-safe.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    if (auto first = detail::size_or_flush(v, max_batch_)) return *first;
    const std::size_t n = v.candidates.size();
    const BatchTime expiry = detail::window_expiry(v.candidates, max_wait_);
    if (v.now >= expiry) return BatchDecision::dispatch(n, DispatchReason::window);
    return BatchDecision::wait(expiry, max_batch_);
  }

 private:
  std::size_t max_batch_;
  BatchDuration max_wait_;
};

// Batch sizes the model runs best at (the sizes a TensorRT profile or a CUDA graph was
// captured for). A batch dispatches at once when the queue holds exactly one of the sizes,
// or the largest; otherwise it waits up to max_wait from its first request, and then:
//
//   Fill::pad    sends everything queued (up to the largest size), padded up to the
//                smallest preferred size that holds it;
//   Fill::split  sends the largest preferred size that the queue fills, and the rest in
//                the next batches (each again a preferred size; a remainder smaller than
//                the smallest size is padded up to it);
//   Fill::exact  sends everything queued as it is (sizes only trigger early dispatch).
//
// Padding: the model is called with spans of the padded size. The padding slots hold
// copies of the batch's last real request and their responses are discarded, so a model
// captured for fixed shapes only ever sees those shapes. Padding therefore needs a
// copy-constructible request type (checked when the Pipeline is built).
//
// Immutable after construction; thread-safe. The constructor throws std::invalid_argument
// naming the field; decide() never throws.
class PreferredSizes {
 public:
  enum class Fill : std::uint8_t { pad, split, exact };

  // `sizes` need not be sorted; duplicates are ignored. Each size must be in
  // [1, max_batch_limit]. Throws std::invalid_argument naming the field. Allocates.
  PreferredSizes(std::vector<std::size_t> sizes, BatchDuration max_wait, Fill fill = Fill::pad)
      : sizes_(std::move(sizes)), max_wait_(max_wait), fill_(fill) {
    if (sizes_.empty()) detail::throw_invalid_argument("PreferredSizes: sizes must not be empty");
    std::sort(sizes_.begin(), sizes_.end());
    sizes_.erase(std::unique(sizes_.begin(), sizes_.end()), sizes_.end());
    if (sizes_.front() < 1) detail::throw_invalid_argument("PreferredSizes: sizes must be >= 1");
    if (sizes_.back() > max_batch_limit) {
      detail::throw_invalid_argument(("PreferredSizes: sizes must be <= " + std::to_string(max_batch_limit)).c_str());
    }
    detail::require_non_negative(max_wait, "PreferredSizes: max_wait must be >= 0");
    if (fill != Fill::pad && fill != Fill::split && fill != Fill::exact) {
      detail::throw_invalid_argument("PreferredSizes: fill must be pad, split or exact");
    }
  }

  // The largest preferred size. Thread-safe.
  [[nodiscard]] std::size_t max_batch() const noexcept { return sizes_.back(); }
  // The preferred sizes, ascending. Thread-safe.
  [[nodiscard]] std::span<const std::size_t> sizes() const noexcept { return sizes_; }
  [[nodiscard]] BatchDuration max_wait() const noexcept { return max_wait_; }
  [[nodiscard]] Fill fill() const noexcept { return fill_; }
  // Arrival order. Thread-safe.
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }

  // True when the policy may ask for padding (fill is pad or split). Thread-safe.
  [[nodiscard]] bool may_pad() const noexcept { return fill_ != Fill::exact; }

  // Never allocates. Thread-safe.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    const std::size_t n = v.candidates.size();
    if (n == 0) return BatchDecision::wait(BatchTime::max(), 1);
    if (n >= sizes_.back()) return BatchDecision::dispatch(sizes_.back(), DispatchReason::size);
    if (std::binary_search(sizes_.begin(), sizes_.end(), n)) {
      return BatchDecision::dispatch(n, DispatchReason::size);
    }
    const BatchTime expiry = detail::window_expiry(v.candidates, max_wait_);
    if (v.flush || v.now >= expiry) {
      const DispatchReason why = v.flush ? DispatchReason::flush : DispatchReason::window;
      const std::size_t up = *std::lower_bound(sizes_.begin(), sizes_.end(), n);  // n < back()
      switch (fill_) {
        case Fill::pad: return BatchDecision::dispatch(n, why, up);
        case Fill::split: {
          auto it = std::upper_bound(sizes_.begin(), sizes_.end(), n);
          if (it == sizes_.begin()) return BatchDecision::dispatch(n, why, up);
          return BatchDecision::dispatch(*(it - 1), why);
        }
        case Fill::exact: return BatchDecision::dispatch(n, why);
      }
    }
    const std::size_t next = *std::upper_bound(sizes_.begin(), sizes_.end(), n);
    return BatchDecision::wait(expiry, next);
  }

 private:
  std::vector<std::size_t> sizes_;
  BatchDuration max_wait_;
  Fill fill_;
};

// A padded-token budget for variable-length requests (text, audio): a batch costs
// max_len x batch_size tokens, because every row is padded to the longest one. The batch
// closes when adding the next request would exceed `budget` (reason token_budget), when
// it holds max_batch requests, or when max_wait has passed since its first request.
//
// Requests are bucketed by length so that short ones do not ride with long ones and pay
// for their padding: each bucket is batched on its own. `bucket_bounds` are ascending
// inclusive upper bounds of lengths (e.g. {32, 64, 128, 256}); a request longer than the
// last bound goes into one more bucket above it. Left empty, buckets are powers of two
// (1, 2, 3-4, 5-8, ...), which keeps padding under half of every batch.
//
// A request whose cost alone exceeds the budget can never run: the Pipeline rejects it at
// submit with RejectReason::too_large and a message naming both numbers, and it never
// stalls the queue.
//
// Needs a cost per request: the Pipeline's `request_cost` function (its length in
// tokens). Immutable after construction; thread-safe. The constructor throws
// std::invalid_argument naming the field; decide() never throws.
class TokenBudget {
 public:
  static constexpr bool uses_cost = true;

  struct Config {
    std::size_t budget = 0;        // padded tokens per batch (max_len x batch_size), >= 1
    std::size_t max_batch = 64;    // most requests per batch, in [1, max_batch_limit]
    BatchDuration max_wait{};      // window from the batch's first request
    std::vector<std::size_t> bucket_bounds{};  // empty: power-of-two buckets
  };

  explicit TokenBudget(Config c)
      : budget_(c.budget), max_batch_(c.max_batch), max_wait_(c.max_wait), bounds_(std::move(c.bucket_bounds)) {
    if (budget_ < 1) detail::throw_invalid_argument("TokenBudget: budget must be >= 1");
    detail::require_max_batch(max_batch_, "TokenBudget");
    detail::require_non_negative(max_wait_, "TokenBudget: max_wait must be >= 0");
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      if (bounds_[i] < 1 || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
        detail::throw_invalid_argument("TokenBudget: bucket_bounds must be ascending and >= 1");
      }
    }
    bucket_count_ = bounds_.empty() ? static_cast<std::size_t>(std::bit_width(budget_ - 1)) + 1
                                    : bounds_.size() + 1;
  }

  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  [[nodiscard]] std::size_t max_batch() const noexcept { return max_batch_; }
  [[nodiscard]] BatchDuration max_wait() const noexcept { return max_wait_; }
  // The configuration it was built with (copies the bucket bounds: allocates). Thread-safe.
  [[nodiscard]] Config config() const { return Config{budget_, max_batch_, max_wait_, bounds_}; }
  // Arrival order within a bucket. Thread-safe.
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::fifo; }
  // The largest single request that fits: the budget. Thread-safe.
  [[nodiscard]] std::size_t max_cost() const noexcept { return budget_; }

  // The number of buckets. Thread-safe.
  [[nodiscard]] std::size_t bucket_count() const noexcept { return bucket_count_; }
  // The bucket of a request of this length, in [0, bucket_count()) for any cost up to
  // max_cost(). Never allocates. Thread-safe.
  [[nodiscard]] std::size_t bucket_of(std::size_t cost) const noexcept {
    if (bounds_.empty()) {
      if (cost <= 1) return 0;
      return std::min<std::size_t>(static_cast<std::size_t>(std::bit_width(cost - 1)), bucket_count_ - 1);
    }
    return static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), cost) - bounds_.begin());
  }

  // The padded cost of a batch of `rows` requests whose longest is `max_len` tokens:
  // rows x max_len, saturating at SIZE_MAX instead of wrapping. Never allocates.
  // Thread-safe.
  [[nodiscard]] static constexpr std::size_t padded_cost(std::size_t rows, std::size_t max_len) noexcept {
    return detail::saturating_mul(rows, max_len);
  }

  // The largest prefix of the candidates whose padded cost fits the budget, then the size
  // and window triggers. The padded cost is compared without overflow, so lengths and
  // budgets up to SIZE_MAX are judged exactly. Never allocates. Thread-safe.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    const std::size_t n = v.candidates.size();
    if (n == 0) return BatchDecision::wait(BatchTime::max(), 1);
    std::size_t fit = 0;
    std::size_t max_len = 0;
    for (const BatchCandidate& c : v.candidates) {
      const std::size_t len = std::max(max_len, c.cost);
      if (fit + 1 > max_batch_ || !fits(fit + 1, len)) break;
      max_len = len;
      ++fit;
    }
    // A first candidate larger than the budget is rejected at submit; should one get
    // here anyway it runs alone rather than blocking the bucket.
    if (fit == 0) return BatchDecision::dispatch(1, DispatchReason::token_budget);
    if (fit == max_batch_) return BatchDecision::dispatch(fit, DispatchReason::size);
    if (fit < n) return BatchDecision::dispatch(fit, DispatchReason::token_budget);
    if (v.flush) return BatchDecision::dispatch(fit, DispatchReason::flush);
    const BatchTime expiry = detail::window_expiry(v.candidates, max_wait_);
    if (v.now >= expiry) return BatchDecision::dispatch(fit, DispatchReason::window);
    // Any arrival in this bucket may fill the budget: look again at the next one.
    return BatchDecision::wait(expiry, v.queued + 1);
  }

 private:
  // rows x max_len <= budget, decided without forming the product (rows >= 1).
  [[nodiscard]] bool fits(std::size_t rows, std::size_t max_len) const noexcept { return max_len <= budget_ / rows; }

  std::size_t budget_;
  std::size_t max_batch_;
  BatchDuration max_wait_;
  std::vector<std::size_t> bounds_;
  std::size_t bucket_count_ = 1;
};

// A linear model of batch cost: base + per_item x (size - 1), the latency field guide's
// L(b) (its worked example is LinearCost{20ms, 3ms}); the simulator's service time.
// Immutable; thread-safe.
struct LinearCost {
  BatchDuration base{};
  BatchDuration per_item{};
  [[nodiscard]] BatchDuration operator()(std::size_t batch_size) const noexcept {
    return base + per_item * static_cast<BatchDuration::rep>(batch_size > 0 ? batch_size - 1 : 0);
  }
};

// Deadline-aware closing. A request's deadline is the latest time it may start executing
// (SubmitOptions::deadline; a request not started by then completes with
// Status::deadline_exceeded and is never executed late). Requests of one priority are
// ordered earliest deadline first, and a batch closes as soon as waiting any longer would
// make it start after the tightest deadline among its requests: with deadlines d_i it
// closes at
//     min(d_i) - margin
// or at max_wait after its first request, or at max_batch, whichever is first. `margin`
// is the time kept in hand between closing a batch and its model call starting (handing
// it to a lane, gathering inputs, a busy machine's scheduling delay); on a real clock a
// batch closed exactly at a deadline would find that deadline passed by the time it is
// checked, so set it to the dispatch lag you measure (100 us to 1 ms is typical).
// Requests without a deadline batch as with FixedWindow.
//
// How long the batch then runs does not enter the decision: a deadline bounds the start.
// A caller with a bound on completion subtracts the model time it expects from that bound
// when it sets the deadline (deadline = respond_by - expected model time).
//
// A request already past its deadline is never executed (the Pipeline completes it with
// Status::deadline_exceeded when the batch is formed).
//
// Immutable after construction; thread-safe. The constructor throws std::invalid_argument
// naming the field; decide() never throws.
class DeadlineAware {
 public:
  struct Config {
    std::size_t max_batch = 32;     // in [1, max_batch_limit]
    BatchDuration max_wait{};       // window from the batch's first request, >= 0
    BatchDuration margin{};         // dispatch lag kept in hand before a deadline, >= 0
  };

  // Throws std::invalid_argument naming the first bad field. Never allocates (but to
  // build the message).
  explicit DeadlineAware(Config c) : max_batch_(c.max_batch), max_wait_(c.max_wait), margin_(c.margin) {
    detail::require_max_batch(max_batch_, "DeadlineAware");
    detail::require_non_negative(max_wait_, "DeadlineAware: max_wait must be >= 0");
    detail::require_non_negative(margin_, "DeadlineAware: margin must be >= 0");
  }

  [[nodiscard]] std::size_t max_batch() const noexcept { return max_batch_; }
  [[nodiscard]] BatchDuration max_wait() const noexcept { return max_wait_; }
  [[nodiscard]] BatchDuration margin() const noexcept { return margin_; }
  // The configuration it was built with. Thread-safe.
  [[nodiscard]] Config config() const noexcept { return Config{max_batch_, max_wait_, margin_}; }
  // Earliest deadline first. Thread-safe.
  [[nodiscard]] BatchOrder order() const noexcept { return BatchOrder::earliest_deadline; }

  // Size trigger, then the tightest latest start, then the window. Never allocates.
  // Thread-safe.
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept {
    if (auto first = detail::size_or_flush(v, max_batch_)) return *first;
    const std::size_t n = v.candidates.size();
    BatchTime tightest = BatchTime::max();
    for (const BatchCandidate& c : v.candidates) tightest = std::min(tightest, c.deadline);
    const BatchTime close_at = tightest == BatchTime::max() ? BatchTime::max() : detail::saturating_sub(tightest, margin_);
    if (v.now >= close_at) return BatchDecision::dispatch(n, DispatchReason::deadline);
    const BatchTime expiry = detail::window_expiry(v.candidates, max_wait_);
    if (v.now >= expiry) return BatchDecision::dispatch(n, DispatchReason::window);
    // A newcomer whose own close (its deadline - margin) comes before the wake-up brings
    // it forward: one with a deadline before wake + margin.
    const BatchTime wake = std::min(close_at, expiry);
    return BatchDecision::wait(wake, max_batch_, detail::saturating_add(wake, margin_));
  }

 private:
  std::size_t max_batch_;
  BatchDuration max_wait_;
  BatchDuration margin_;
};

static_assert(BatchPolicy<FixedWindow>);
static_assert(BatchPolicy<PreferredSizes>);
static_assert(BucketedBatchPolicy<TokenBudget> && CostLimitedBatchPolicy<TokenBudget>);
static_assert(BatchPolicy<DeadlineAware>);

}  // namespace tailbatch
