// Clocks: where every timing component of tailbatch reads the time.
//
// Components take the clock as a template parameter (constrained by the Clock concept) and
// an instance of it in their constructor. Production code uses SteadyClock, which is empty
// and costs nothing to store. Tests and the simulator use ManualClock, which only moves
// when it is told to, so that windows, deadlines and limit algorithms are tested
// deterministically.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

// A source of time. Both clocks shipped here use std::chrono::steady_clock's time_point and
// duration, so that deadlines built by callers compare with the clock's readings.
template <class C>
concept Clock = std::copy_constructible<C> && requires(const C& c) {
  typename C::time_point;
  typename C::duration;
  { c.now() } -> std::same_as<typename C::time_point>;
};

// The monotonic wall clock. Empty; copies are free. Thread-safe.
class SteadyClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  // The current time. Never blocks, never allocates. Thread-safe.
  [[nodiscard]] time_point now() const noexcept { return std::chrono::steady_clock::now(); }
};

// A clock that moves only when advanced by hand.
//
// ManualClock is a handle: copies share one time, so a test keeps one copy, hands another
// to the component under test, and advances its own. It starts at a fixed, arbitrary
// point (one hour after the steady clock's epoch) so that "start minus a little" is still
// a valid time. Time never moves backwards.
class ManualClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  // Allocates the shared state once. Throws std::bad_alloc.
  ManualClock() : ticks_(std::make_shared<std::atomic<duration::rep>>(start_ticks())) {}

  // The current manual time. Never blocks. Thread-safe.
  [[nodiscard]] time_point now() const noexcept {
    return time_point(duration(ticks_->load(std::memory_order_acquire)));
  }

  // Moves time forward by d. Throws std::invalid_argument if d is negative. Thread-safe.
  void advance(duration d) {
    if (d < duration::zero())
      detail::throw_invalid_argument("ManualClock::advance: d must not be negative");
    ticks_->fetch_add(d.count(), std::memory_order_acq_rel);
  }

  // Moves time forward to t; a t in the past leaves the clock where it is. Thread-safe.
  void advance_to(time_point t) noexcept {
    auto target = t.time_since_epoch().count();
    auto current = ticks_->load(std::memory_order_acquire);
    while (current < target &&
           !ticks_->compare_exchange_weak(current, target, std::memory_order_acq_rel)) {
    }
  }

  // The time the clock started at, useful as an origin in tests. Thread-safe.
  [[nodiscard]] static time_point start() noexcept { return time_point(duration(start_ticks())); }

 private:
  static constexpr duration::rep start_ticks() noexcept {
    return std::chrono::duration_cast<duration>(std::chrono::hours(1)).count();
  }

  std::shared_ptr<std::atomic<duration::rep>> ticks_;
};

static_assert(Clock<SteadyClock>);
static_assert(Clock<ManualClock>);

}  // namespace tailbatch
