// The Pipeline queue's overload policies' state (see queue_policy.hpp for what each does):
// CoDel's control loop, and adaptive LIFO's test for "a queue has formed".
//
// CodelState is CoDel as folly applies it to a server's request queue (folly's Codel), not
// RFC 8289's packet version: the minimum wait seen at the head of the queue over each
// `interval` says whether the queue is standing (the minimum stayed above `target`: the
// queue never drained to a short wait) or only absorbing a burst. While it is standing
// (overloaded), every request that has waited longer than 2 x target when the leader looks
// at the queue is dropped, at once, rather than one request at a time at the control law's
// growing rate: the RFC's ramp (interval / sqrt(drops)) needs seconds to catch up with a
// request queue at twice its capacity, while the backlog serves everyone late. A queue
// that holds no more than one batch is never dropped from (RFC 8289's "maxpacket" rule).
// Time is only what the caller passes in: tested on the manual clock's readings.
//
// Not thread-safe: the Pipeline's batch leader owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <tailbatch/submit_options.hpp>

namespace tailbatch::detail {

class CodelState {
 public:
  CodelState(BatchDuration target, BatchDuration interval) noexcept
      : target_(target), interval_(interval) {}

  // Whether to drop the head now. sojourn: how long the head has waited; small: the queue
  // holds no more than one batch. After true the caller drops the head and asks again
  // about the next one (with its sojourn), until false. Never throws.
  [[nodiscard]] bool should_drop(BatchTime now, BatchDuration sojourn, bool small) noexcept {
    if (!started_) {
      started_ = true;
      interval_end_ = now + interval_;
      min_ = sojourn;
    } else if (now >= interval_end_) {
      // An interval ended: it decides the state for the next one.
      overloaded_ = min_ > target_;
      interval_end_ = now + interval_;
      min_ = sojourn;
    } else if (sojourn < min_) {
      min_ = sojourn;
    }
    if (small || !overloaded_ || sojourn <= 2 * target_) return false;
    ++drops_;
    return true;
  }

  // Whether the last whole interval's minimum wait was above target.
  [[nodiscard]] bool overloaded() const noexcept { return overloaded_; }
  [[nodiscard]] std::uint64_t drops() const noexcept { return drops_; }

 private:
  BatchDuration target_;
  BatchDuration interval_;
  BatchTime interval_end_{};
  BatchDuration min_{};
  std::uint64_t drops_ = 0;
  bool started_ = false;
  bool overloaded_ = false;
};

}  // namespace tailbatch::detail
