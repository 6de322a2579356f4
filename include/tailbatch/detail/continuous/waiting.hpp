// The continuous batcher's waiting queue: FIFO with priorities and no starvation.
//
// A waiting sequence is ordered by an "effective arrival": its arrival time moved earlier
// by head * priority_step, where head is how many Priority levels it stands above
// Priority::normal (high: 1, normal: 0, low: -1). A priority is a head start, not a
// separate lane: a sequence with head h is served before everything that arrives more
// than h * priority_step after it, so a steady stream of higher-priority work delays a
// lower-priority sequence by a bounded amount and never starves it. Equal keys keep submission order.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>

namespace tailbatch::detail {

struct CbatchKey {
  std::int64_t effective_ns;  // arrival (clock ticks in ns) minus the priority head start
  std::uint64_t sequence_no;  // submission order, to break ties

  friend bool operator<(const CbatchKey& a, const CbatchKey& b) noexcept {
    return a.effective_ns != b.effective_ns ? a.effective_ns < b.effective_ns
                                            : a.sequence_no < b.sequence_no;
  }
};

// arrival - head * step, saturating at the int64 range.
[[nodiscard]] inline std::int64_t cbatch_effective_arrival(std::int64_t arrival_ns, int priority,
                                                           std::int64_t step_ns) noexcept {
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  // |priority| < 2^31 and step_ns < 2^63: the product fits in a long double exactly enough
  // to decide saturation; the exact value is computed in integers when it fits.
  const long double head = static_cast<long double>(priority) * static_cast<long double>(step_ns);
  const long double key = static_cast<long double>(arrival_ns) - head;
  if (key <= static_cast<long double>(lo)) return lo;
  if (key >= static_cast<long double>(hi)) return hi;
  if (head > static_cast<long double>(hi) || head < static_cast<long double>(lo)) {
    return static_cast<std::int64_t>(key);
  }
  return arrival_ns - static_cast<std::int64_t>(priority) * step_ns;
}

// An ordered map from key to entry; entries are visited in service order.
template <class Entry>
using CbatchWaiting = std::map<CbatchKey, Entry>;

}  // namespace tailbatch::detail
