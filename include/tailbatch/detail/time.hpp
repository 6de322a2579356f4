// Time arithmetic that never overflows, for every component: a time plus or minus a
// duration saturates at the time point's range instead of wrapping, and a product of
// counts saturates at SIZE_MAX. The bottom of the tree: it includes only the standard
// library, and every header that adds a timeout to an arrival or a window to a start
// reaches it here rather than through a component's header.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace tailbatch::detail {

// The number of Duration's ticks d covers, rounded up, or Duration::max() when it does
// not fit. Used below so that a budget in any unit (seconds, doubles) saturates too.
template <class Duration, class Rep, class Period>
[[nodiscard]] constexpr Duration saturating_ceil(std::chrono::duration<Rep, Period> d) noexcept {
  using Wide = std::chrono::duration<long double, typename Duration::period>;
  if (std::chrono::duration_cast<Wide>(d) >= std::chrono::duration_cast<Wide>(Duration::max())) return Duration::max();
  if (std::chrono::duration_cast<Wide>(d) <= std::chrono::duration_cast<Wide>(Duration::min())) return Duration::min();
  return std::chrono::ceil<Duration>(d);
}

// t moved later (Later) or earlier by d, saturating at the time point's range: the one
// body of saturating_add and saturating_sub. A zero or negative d leaves t as it is.
template <bool Later, class Clock, class Dur, class Rep, class Period>
[[nodiscard]] constexpr std::chrono::time_point<Clock, Dur> saturating_shift(
    std::chrono::time_point<Clock, Dur> t, std::chrono::duration<Rep, Period> d) noexcept {
  using Tp = std::chrono::time_point<Clock, Dur>;
  if (d <= std::chrono::duration<Rep, Period>::zero()) return t;
  const Dur dd = saturating_ceil<Dur>(d);
  if constexpr (Later) {
    return t > Tp::max() - dd ? Tp::max() : t + dd;
  } else {
    return t < Tp::min() + dd ? Tp::min() : t - dd;
  }
}

// t + d (a std::chrono::time_point and duration), or the time point's max() when that
// would overflow. A zero or negative d leaves t as it is: every caller adds a budget or a
// window, where "none" is zero. Never throws, never allocates.
template <class TimePoint, class Duration>
[[nodiscard]] constexpr TimePoint saturating_add(TimePoint t, Duration d) noexcept {
  return saturating_shift<true>(t, d);
}

// t - d, or the time point's min() when that would overflow. A zero or negative d leaves
// t as it is. Never throws, never allocates.
template <class TimePoint, class Duration>
[[nodiscard]] constexpr TimePoint saturating_sub(TimePoint t, Duration d) noexcept {
  return saturating_shift<false>(t, d);
}

// a * b, or SIZE_MAX when the product does not fit.
[[nodiscard]] constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) noexcept {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) return std::numeric_limits<std::size_t>::max();
  return a * b;
}

// A time point as signed nanoseconds since its clock's epoch, for atomics and integrals.
template <class Clock, class Dur>
[[nodiscard]] constexpr std::int64_t ns_since_epoch(std::chrono::time_point<Clock, Dur> t) noexcept {
  return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

}  // namespace tailbatch::detail
