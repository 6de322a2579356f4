// How the Pipeline's batch leader sleeps and who wakes it.
//
// The leader sleeps on a condition variable until its policy's next decision is due, and is
// woken early only when it asked to be: by enough new arrivals to change the decision, by an
// arrival whose deadline is earlier than a mark, by a cancellation, or by shutdown. Submitters
// and cancellers read the flags without the lock and take it only to wake a sleeping leader,
// so that a busy Pipeline's submits never touch the mutex. The handshake: the leader sets
// `sleeping` (seq_cst) and then looks for newcomers (dirty shards, a pending cancel, a changed
// closing flag); a submitter flags its shard (seq_cst) and then looks at `sleeping`. Either
// the leader sees the newcomer, or the newcomer sees the leader asleep and wakes it. Nothing
// here depends on the Pipeline's template parameters.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include <tailbatch/submit_options.hpp>

namespace tailbatch::detail {

class alignas(64) LeaderSignal {
 public:
  // ---- shutdown ----

  // Starts the drain: from now on `closing()` holds, until `drain_deadline`. Wakes every
  // waiter. Thread-safe.
  void close(BatchTime drain_deadline) noexcept {
    {
      std::lock_guard lock(mu_);
      drain_deadline_ = drain_deadline;
      closing_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  [[nodiscard]] bool closing(std::memory_order order = std::memory_order_acquire) const noexcept {
    return closing_.load(order);
  }
  // The flag itself, for the submit shards' check under their locks.
  [[nodiscard]] const std::atomic<bool>& closing_flag() const noexcept { return closing_; }
  [[nodiscard]] BatchTime drain_deadline() const noexcept {
    std::lock_guard lock(mu_);
    return drain_deadline_;
  }

  // ---- cancellations ----

  // A request was cancelled: the leader purges at its next turn, woken if it sleeps.
  void cancelled() noexcept {
    // Pairs with the leader's store to sleeping_ and its look at cancel_pending_.
    cancel_pending_.store(true, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  // Whether a cancel is pending, clearing it. Looked at before it is cleared: the flag
  // shares a cache line with what every submit reads, and a write per turn would take that
  // line from them. (A flag set just after this look is seen before the leader sleeps.)
  [[nodiscard]] bool take_cancels() noexcept {
    return cancel_pending_.load(std::memory_order_relaxed) &&
           cancel_pending_.exchange(false, std::memory_order_seq_cst);
  }

  // ---- arrivals ----

  // A request was queued (its shard flagged). `fired`: it was cancelled meanwhile.
  void arrived(BatchTime deadline, bool fired) noexcept {
    if (fired) cancel_pending_.store(true, std::memory_order_seq_cst);
    if (!sleeping_.load(std::memory_order_seq_cst)) return;
    // Only while the leader sleeps are arrivals counted: it asked to be woken by so many
    // more, or by a deadline earlier than a mark.
    const std::uint64_t n = sleep_arrivals_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n >= wake_after_arrivals_.load(std::memory_order_relaxed) ||
        deadline.time_since_epoch().count() < wake_if_deadline_before_.load(std::memory_order_relaxed) || fired) {
      wake();
    }
  }

  // Ends the leader's sleep, once (a waker that finds it awake does nothing).
  void wake() noexcept {
    bool was_sleeping = false;
    {
      std::lock_guard lock(mu_);
      was_sleeping = sleeping_.exchange(false, std::memory_order_seq_cst);
    }
    if (was_sleeping) cv_.notify_one();
  }

  // ---- the leader ----

  // Sleeps until `until` (BatchTime::max(): until woken), to be woken early by
  // `wake_after` arrivals (at least one) or one with a deadline before `deadline_mark`.
  // Returns at once when `newcomers()` (seq_cst: the shards' dirty flags), a pending cancel
  // or a change of the closing flag from `was_closing` shows there is something to look at.
  template <class Newcomers>
  void sleep(BatchTime until, std::size_t wake_after, BatchTime deadline_mark, bool was_closing,
             Newcomers&& newcomers) noexcept {
    std::unique_lock lock(mu_);
    sleep_arrivals_.store(0, std::memory_order_relaxed);
    wake_after_arrivals_.store(std::max<std::size_t>(1, wake_after), std::memory_order_relaxed);
    wake_if_deadline_before_.store(deadline_mark.time_since_epoch().count(), std::memory_order_relaxed);
    sleeping_.store(true, std::memory_order_seq_cst);
    // Pairs with a submitter's flagging of its shard (or a canceller's flag) and its look at
    // sleeping_: either this sees the newcomer, or the newcomer sees the leader asleep.
    if (newcomers() || cancel_pending_.load(std::memory_order_seq_cst) ||
        closing_.load(std::memory_order_relaxed) != was_closing) {
      sleeping_.store(false, std::memory_order_relaxed);
      return;
    }
    if (until == BatchTime::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, until);
    }
    sleeping_.store(false, std::memory_order_relaxed);
  }

 private:
  // Flags read without the lock, to skip it; written under it where a sleep depends on them.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> cancel_pending_{false};
  std::atomic<std::uint64_t> sleep_arrivals_{0};  // requests queued while it sleeps
  std::atomic<std::uint64_t> wake_after_arrivals_{1};
  std::atomic<typename BatchTime::rep> wake_if_deadline_before_{BatchTime::min().time_since_epoch().count()};
  BatchTime drain_deadline_ = BatchTime::max();
  std::atomic<bool> closing_{false};

 public:
  // Submitters may stamp arrivals with the cycle counter (set by the leader while its
  // calibration is usable). Beside the flags every submit reads.
  std::atomic<bool> stamp_cycles{false};
};

}  // namespace tailbatch::detail
