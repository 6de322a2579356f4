// The Pipeline queue's overload policies' state (see queue_policy.hpp for what each does):
// CoDel's control loop, and adaptive LIFO's test for "a queue has formed".
//
// CodelState follows Nichols and Jacobson's CoDel (RFC 8289's dequeue side), applied to
// requests as folly's CoDel applies it: the sojourn is the wait of the request at the head
// of the queue. While that wait has stayed at or above `target` for a whole `interval`,
// the queue is standing rather than absorbing a burst: one request is dropped, then one
// more each time the next drop time comes, the spacing shrinking as interval / sqrt(drops)
// (the control law), until the head's wait falls below target. A queue that holds no more
// than one batch is never dropped from (RFC 8289's "maxpacket" rule). Time is only what
// the caller passes in: tested on the manual clock's readings.
//
// Not thread-safe: the Pipeline's batch leader owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <tailbatch/detail/math.hpp>
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
    const bool ok = ok_to_drop(now, sojourn, small);
    if (dropping_) {
      if (!ok) {
        dropping_ = false;
        return false;
      }
      if (now < drop_next_) return false;
      ++count_;
      drop_next_ = control_law(drop_next_, count_);
      ++drops_;
      return true;
    }
    if (!ok) return false;
    // Entering the dropping state: if it was left recently, resume near the drop rate it
    // had (count - lastcount), as the RFC does, so that a persistent queue is not given a
    // fresh, slow start every time.
    dropping_ = true;
    const std::uint32_t delta = count_ - lastcount_;
    count_ = delta > 1 && now - drop_next_ < 16 * interval_ ? delta : 1;
    drop_next_ = control_law(now, count_);
    lastcount_ = count_;
    ++drops_;
    return true;
  }

  [[nodiscard]] bool dropping() const noexcept { return dropping_; }
  [[nodiscard]] std::uint64_t drops() const noexcept { return drops_; }
  // When the next drop is due while dropping.
  [[nodiscard]] BatchTime drop_next() const noexcept { return drop_next_; }

 private:
  bool ok_to_drop(BatchTime now, BatchDuration sojourn, bool small) noexcept {
    if (small || sojourn < target_) {
      above_ = false;
      return false;
    }
    if (!above_) {
      above_ = true;
      first_above_ = now + interval_;
      return false;
    }
    return now >= first_above_;
  }

  [[nodiscard]] BatchTime control_law(BatchTime t, std::uint32_t count) const noexcept {
    const double spacing =
        static_cast<double>(interval_.count()) / detail::sqrt(static_cast<double>(count));
    return t + BatchDuration(static_cast<BatchDuration::rep>(spacing));
  }

  BatchDuration target_;
  BatchDuration interval_;
  BatchTime first_above_{};
  BatchTime drop_next_{};
  std::uint32_t count_ = 0;
  std::uint32_t lastcount_ = 0;
  std::uint64_t drops_ = 0;
  bool above_ = false;
  bool dropping_ = false;
};

}  // namespace tailbatch::detail
