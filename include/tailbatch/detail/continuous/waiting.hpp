// The continuous batcher's waiting queue: FIFO with priorities and no starvation.
//
// A waiting sequence is ordered by an "effective arrival": its arrival time moved earlier
// by head * priority_step, where head is how many Priority levels it stands above
// Priority::normal (high: 1, normal: 0, low: -1). A priority is a head start, not a
// separate lane: a sequence with head h is served before everything that arrives more
// than h * priority_step after it, so a steady stream of higher-priority work delays a
// lower-priority sequence by a bounded amount and never starves it. Equal keys keep submission
// order.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tailbatch/detail/virtual_counters.hpp>
#include <tailbatch/tenants.hpp>
#include <unordered_map>
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

// Fair scheduling of the waiting queue (ContinuousBatcherConfig::tenants, Scheduling::fair):
// the next sequence is the first (by key: effective arrival) of the waiting tenant with the
// smallest virtual counter (detail/virtual_counters.hpp). A sequence is charged its prompt
// plus output_token_cost x max_new_tokens when admitted (its whole reservation, so that a
// tenant cannot take the token budget with long generations while its counter lags), and
// refunded the output tokens it did not generate when it retires: in the end each tenant
// is charged for prompt + factor x the tokens it was actually served. Within a tenant, the
// priority head start orders its own sequences. Not thread-safe: the batcher's mutex.
class CbatchFair {
 public:
  CbatchFair(const TenantsConfig& config, double output_token_cost)
      : counters_(config), output_cost_(output_token_cost) {}

  // A sequence of tenant t waits under key. May allocate (std::bad_alloc).
  void added(TenantId t, const CbatchKey& key) {
    by_tenant_[t].insert(key);
    counters_.joined(t);
  }
  // The sequence under key left the waiting queue (admitted or dropped). Never throws.
  void removed(TenantId t, const CbatchKey& key) noexcept {
    auto it = by_tenant_.find(t);
    if (it == by_tenant_.end()) return;
    it->second.erase(key);
    if (it->second.empty()) by_tenant_.erase(it);
    counters_.left(t);
  }
  // The key to serve next, nullopt when nothing waits. Linear in the waiting tenants.
  [[nodiscard]] std::optional<CbatchKey> next() const noexcept {
    std::optional<CbatchKey> best;
    double best_counter = 0.0;
    for (const auto& [t, keys] : by_tenant_) {
      const double c = counters_.counter(t);
      const CbatchKey& k = *keys.begin();
      if (!best || c < best_counter || (c == best_counter && k < *best)) {
        best = k;
        best_counter = c;
      }
    }
    return best;
  }
  // The charge at admission, and the refund at retirement (see the class comment).
  [[nodiscard]] double cost(std::size_t prompt, std::size_t output) const noexcept {
    return static_cast<double>(prompt) + output_cost_ * static_cast<double>(output);
  }
  void charge(TenantId t, double cost) noexcept { counters_.charge(t, cost); }
  [[nodiscard]] const VirtualCounters& counters() const noexcept { return counters_; }

 private:
  std::unordered_map<TenantId, std::set<CbatchKey>> by_tenant_;
  VirtualCounters counters_;
  double output_cost_;
};

}  // namespace tailbatch::detail
