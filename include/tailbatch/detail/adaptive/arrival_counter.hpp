// How AdaptiveWindow counts the arrival rate from its views, without arrival stamps it
// cannot trust: the requests queued now plus those it has dispatched is a running total of
// arrivals, kept as checkpoints (time, total). The rate is that count over the last 1024
// arrivals, or since the last change of load when the last 64 tell of one.
//
// Not thread-safe: its owner (detail::AdaptiveState) guards it with its mutex. Never
// allocates (a fixed ring of checkpoints) and never throws.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/math.hpp>

namespace tailbatch::detail {

class ArrivalCounter {
 public:
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

  // Requests dispatched (taken off the queue): they stay counted as arrivals.
  void dispatched(std::uint64_t n) noexcept { dispatched_ += n; }

  // Counts arrivals: the requests queued now plus those it has dispatched, a running
  // total that needs no arrival stamps (so a backlog hiding the newest requests from the
  // view does not hide them from the count). Each change is kept as a checkpoint (time,
  // total). (Requests that expire or are cancelled in the queue are not counted.)
  void observe(const BatchView& v) noexcept {
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
  // load (see observe); over fast_span at least. 0 until a few are known.
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

 private:
  struct Checkpoint {
    BatchTime time{};
    std::uint64_t total = 0;
  };
  std::array<Checkpoint, checkpoint_capacity> checkpoints_{};
  std::size_t first_checkpoint_ = 0;
  std::size_t checkpoint_count_ = 0;
  std::uint64_t counted_ = 0;
  std::uint64_t regime_start_ = 0;
  std::uint64_t dispatched_ = 0;
};

}  // namespace tailbatch::detail
