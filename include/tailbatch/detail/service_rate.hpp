// How fast a front door serves requests while it is busy: the rate behind the retry-after
// hint of a request turned away for a full queue (Pipeline and ContinuousBatcher alike).
//
// Measured from service, never from the calendar: each batch (or decode step) reports the
// requests it finished and the time it was busy doing so, and the rate is the ratio of
// the two sums, each decayed by `keep` per report (an exponentially weighted moving
// average of the per-batch service rate, weighted by busy time). Time with nothing to do
// is never in it, so a front door idle for minutes still tells the first caller it turns
// away how soon its queue empties at the speed it actually serves.
//
// record() is called by whoever finishes a batch (several workers at once: one short lock);
// rate() is one relaxed load. Never allocates, never throws.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <tailbatch/detail/math.hpp>

namespace tailbatch::detail {

class ServiceRate {
 public:
  // Each report keeps this share of the earlier ones: about the last 1 / (1 - keep) = 4
  // batches count.
  static constexpr double keep = 0.75;

  // `served` requests were finished in `busy` of service (one batch, one decode step). A
  // report with no busy time (a clock that did not move) carries no rate and is skipped.
  // Returns the rate after it, per second (0 while unknown). Thread-safe.
  double record(std::uint64_t served, std::chrono::nanoseconds busy) noexcept {
    std::lock_guard lock(mu_);
    if (busy > std::chrono::nanoseconds::zero()) {
      served_ = served_ * keep + static_cast<double>(served);
      busy_s_ = busy_s_ * keep + std::chrono::duration<double>(busy).count();
      rate_.store(busy_s_ > 0.0 ? served_ / busy_s_ : 0.0, std::memory_order_relaxed);
    }
    return rate_.load(std::memory_order_relaxed);
  }

  // Requests per second of service (0 until measured). Racy; thread-safe.
  [[nodiscard]] double rate() const noexcept { return rate_.load(std::memory_order_relaxed); }

  // The time `rate` (requests per second) needs to serve `depth` requests (at least one),
  // capped at 60 s; 0 while the rate is unknown.
  [[nodiscard]] static std::chrono::nanoseconds retry_after(double rate,
                                                            std::size_t depth) noexcept {
    if (!(rate > 0.0)) return std::chrono::nanoseconds{0};
    const double seconds =
        std::min(static_cast<double>(std::max<std::size_t>(1, depth)) / rate, 60.0);
    return std::chrono::nanoseconds(detail::llround(seconds * 1e9));
  }

 private:
  std::mutex mu_;
  double served_ = 0.0;
  double busy_s_ = 0.0;
  std::atomic<double> rate_{0.0};
};

}  // namespace tailbatch::detail
