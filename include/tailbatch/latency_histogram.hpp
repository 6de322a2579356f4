// LatencyHistogram: where every stage of tailbatch records how long things took.
//
// A log-linear (HDR-style) histogram of durations with a bounded relative error, recorded
// from many threads at once without a shared hot cache line: each recording thread owns a
// shard of the counters and updates it with plain loads and stores (no read-modify-write,
// no lock). A snapshot sums the shards into a HistogramSnapshot, a value type that answers
// count / min / max / mean / any percentile and merges with other snapshots.
// RollingHistogram answers "p95 over the last N seconds" for controllers and autoscalers.
//
// Accuracy: a percentile is defined by nearest rank over the recorded values (clamped to
// [lowest, highest]): percentile(p) of n values is the r-th smallest, r = ceil(p * n / 100),
// at least 1. The reported value differs from it by at most 1/(2M) relative, M = 64 for
// significant_digits = 2 (0.78 %), M = 512 for 3 (0.098 %). min() and max() are exact.
//
// See docs/latency-histogram.md for the threading model, memory and examples.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <ratio>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <tailbatch/clock.hpp>
#include <tailbatch/detail/histogram/layout.hpp>
#include <tailbatch/detail/histogram/shards.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

// The range and precision of a histogram. Values below `lowest` are recorded as `lowest`
// and counted in underflow_count(); values above `highest` as `highest`, counted in
// overflow_count(). A plain aggregate: copyable, comparable.
struct LatencyHistogramConfig {
  std::chrono::nanoseconds lowest{std::chrono::microseconds(1)};  // smallest distinguishable value
  std::chrono::nanoseconds highest{std::chrono::seconds(100)};    // largest trackable value
  int significant_digits = 2;  // 2: every percentile within 1 % relative; 3: within 0.1 %

  friend bool operator==(const LatencyHistogramConfig&, const LatencyHistogramConfig&) = default;
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using HistogramConfig [[deprecated("renamed LatencyHistogramConfig")]] = LatencyHistogramConfig;

namespace detail {

// Validates a config and builds its layout. Throws std::invalid_argument naming the field
// as LatencyHistogramConfig::<field>, prefixed by `who` ("LatencyHistogram: ...").
inline HistogramLayout histogram_layout_for(const LatencyHistogramConfig& o, const char* who) {
  const auto fail = [who](const char* what) {
    throw_invalid_argument((std::string(who) + ": " + what).c_str());
  };
  if (o.lowest.count() < 1) fail("LatencyHistogramConfig::lowest must be >= 1ns");
  if (o.highest.count() / 2 < o.lowest.count())
    fail("LatencyHistogramConfig::highest must be >= 2 * lowest");
  if (static_cast<std::uint64_t>(o.highest.count()) > HistogramLayout::max_highest_ns)
    fail("LatencyHistogramConfig::highest must be <= 2^62 ns (about 146 years)");
  if (o.significant_digits < 1 || o.significant_digits > 4)
    fail("LatencyHistogramConfig::significant_digits must be in [1, 4]");
  return HistogramLayout(static_cast<std::uint64_t>(o.lowest.count()),
                         static_cast<std::uint64_t>(o.highest.count()),
                         HistogramLayout::bits_for_digits(o.significant_digits));
}

// The layout of LatencyHistogramConfig{}, for snapshots built without a config.
inline constexpr HistogramLayout histogram_default_layout{
    static_cast<std::uint64_t>(std::chrono::nanoseconds(LatencyHistogramConfig{}.lowest).count()),
    static_cast<std::uint64_t>(std::chrono::nanoseconds(LatencyHistogramConfig{}.highest).count()),
    HistogramLayout::bits_for_digits(LatencyHistogramConfig{}.significant_digits)};

// Any duration to whole nanoseconds, saturating: negative, zero and NaN give 0 (recorded
// as an underflow), anything beyond 2^64-1 ns gives 2^64-1 (an overflow).
template <class Rep, class Period>
constexpr std::uint64_t histogram_to_ns(std::chrono::duration<Rep, Period> d) noexcept {
  constexpr std::uint64_t cap = std::numeric_limits<std::uint64_t>::max();
  if constexpr (std::is_floating_point_v<Rep>) {
    const double ns = std::chrono::duration<double, std::nano>(d).count();
    if (!(ns > 0.0)) return 0;
    if (ns >= 18446744073709549568.0) return cap;
    return static_cast<std::uint64_t>(ns);
  } else {
    static_assert(std::is_integral_v<Rep>, "LatencyHistogram records arithmetic durations");
    using Ratio = std::ratio_divide<Period, std::nano>;
    const Rep c = d.count();
    if constexpr (std::is_signed_v<Rep>) {
      if (c <= 0) return 0;
    }
    const auto u = static_cast<std::uint64_t>(c);
    if constexpr (Ratio::den == 1) {
      if (u > cap / static_cast<std::uint64_t>(Ratio::num)) return cap;
      return u * static_cast<std::uint64_t>(Ratio::num);
    } else {
      constexpr auto num = static_cast<std::uint64_t>(Ratio::num);
      constexpr auto den = static_cast<std::uint64_t>(Ratio::den);
      return (u / den) * num + (u % den) * num / den;
    }
  }
}

}  // namespace detail

class LatencyHistogram;

// A histogram's contents at one moment: a value type (copyable, movable, mergeable).
// Queries never allocate and never throw. Not thread-safe: a snapshot is owned by one
// thread at a time (take one per reader; LatencyHistogram::snapshot() is thread-safe).
// Exception guarantee: merge() is strong (on a throw the snapshot is unchanged).
class HistogramSnapshot {
 public:
  // An empty snapshot with the default config; it adopts the config of the first snapshot
  // merged into it. Never allocates, never throws. Not thread-safe: a value type.
  HistogramSnapshot() noexcept = default;

  // An empty snapshot with this config, to merge others into. Does not allocate.
  // Throws std::invalid_argument naming the bad field. Not thread-safe: a value type.
  explicit HistogramSnapshot(LatencyHistogramConfig config)
      : config_(config),
        layout_(detail::histogram_layout_for(config, "HistogramSnapshot")),
        adopt_config_(false) {}

  // Number of values recorded, including clamped ones. Not thread-safe: a value type.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  // The smallest value recorded (after clamping), exact; 0 when empty.
  // Not thread-safe: a value type.
  [[nodiscard]] std::chrono::nanoseconds min() const noexcept { return ns(count_ ? min_ : 0); }
  // The largest value recorded (after clamping), exact; 0 when empty.
  // Not thread-safe: a value type.
  [[nodiscard]] std::chrono::nanoseconds max() const noexcept { return ns(max_); }
  // The exact mean of the recorded (clamped) values, rounded to the nearest nanosecond;
  // 0 when empty. Not thread-safe: a value type.
  [[nodiscard]] std::chrono::nanoseconds mean() const noexcept {
    if (count_ == 0) return std::chrono::nanoseconds(0);
    return ns(static_cast<std::uint64_t>(detail::llround(sum_ns() / static_cast<long double>(count_))));
  }
  // The sum of the recorded (clamped) values in seconds, for Prometheus' _sum.
  // Not thread-safe: a value type.
  [[nodiscard]] double sum_seconds() const noexcept { return static_cast<double>(sum_ns() / 1e9L); }

  // The p-th percentile by nearest rank (see the top of this file); p outside [0, 100] is
  // clamped, NaN counts as 0. p = 0 gives min(), p = 100 gives max(); 0 when empty.
  // O(buckets), never allocates. Not thread-safe: a value type.
  [[nodiscard]] std::chrono::nanoseconds percentile(double p) const noexcept {
    std::chrono::nanoseconds out[1];
    const double ps[1] = {p};
    percentiles(ps, out);
    return out[0];
  }

  // Several percentiles in one pass over the buckets; ps in any order (sorted is cheapest);
  // writes out[i] for ps[i], for i < min(ps.size(), out.size()). Never allocates.
  // Not thread-safe: a value type.
  void percentiles(std::span<const double> ps, std::span<std::chrono::nanoseconds> out) const noexcept {
    const std::size_t k = std::min(ps.size(), out.size());
    if (count_ == 0 || counts_.empty()) {
      for (std::size_t i = 0; i < k; ++i) out[i] = std::chrono::nanoseconds(0);
      return;
    }
    // Visit the requests in ascending (rank, position) order while walking the buckets
    // forward once. The selection is O(k^2) but k is a handful, and it needs no buffer.
    std::size_t bucket = 0;
    std::uint64_t cumulative = counts_[0];
    std::uint64_t prev_rank = 0;
    std::size_t prev_pos = 0;
    bool first = true;
    for (std::size_t done = 0; done < k; ++done) {
      std::size_t pos = k;
      std::uint64_t r = 0;
      for (std::size_t i = 0; i < k; ++i) {
        const std::uint64_t ri = rank_of(ps[i]);
        const bool after_prev = first || ri > prev_rank || (ri == prev_rank && i > prev_pos);
        if (after_prev && (pos == k || ri < r)) {
          pos = i;
          r = ri;
        }
      }
      first = false;
      prev_rank = r;
      prev_pos = pos;
      if (r <= 1) {
        out[pos] = ns(min_);
        continue;
      }
      if (r >= count_) {
        out[pos] = ns(max_);
        continue;
      }
      while (cumulative < r) cumulative += counts_[++bucket];
      out[pos] = ns(std::clamp(layout_.slot_mid(bucket), min_, max_));
    }
  }

  // Cumulative counts, as a Prometheus histogram's buckets: out[i] is the number of
  // recorded (clamped) values below bounds[i], for i < min(bounds.size(), out.size()).
  // Exact where bounds[i] is a bucket boundary of this snapshot's layout; any other bound
  // is counted at the nearest boundary, at most 1/(2M) of it away (0.78 % at the default
  // precision). Bounds in ascending order take one pass over the buckets; any order is
  // correct. Never allocates. Not thread-safe: a value type.
  void count_below(std::span<const std::chrono::nanoseconds> bounds,
                   std::span<std::uint64_t> out) const noexcept {
    const std::size_t k = std::min(bounds.size(), out.size());
    std::size_t slot = 0;      // counts_[0 .. slot) are summed in below
    std::uint64_t below = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const std::size_t target = counts_.empty() ? 0 : layout_.nearest_boundary(detail::histogram_to_ns(bounds[i]));
      if (target < slot) {
        slot = 0;
        below = 0;
      }
      for (; slot < target; ++slot) below += counts_[slot];
      out[i] = below;
    }
  }

  // Values recorded below config().lowest (each counted as lowest).
  // Not thread-safe: a value type.
  [[nodiscard]] std::uint64_t underflow_count() const noexcept { return underflow_; }
  // Values recorded above config().highest (each counted as highest).
  // Not thread-safe: a value type.
  [[nodiscard]] std::uint64_t overflow_count() const noexcept { return overflow_; }

  // Adds other's values to this one. May allocate (std::bad_alloc). Throws
  // std::invalid_argument if the configs differ, except that a default-constructed
  // snapshot not yet merged into takes the other's config. Strong guarantee.
  // Not thread-safe: a value type.
  void merge(const HistogramSnapshot& other) {
    if (config_ != other.config_ && !adopt_config_)
      detail::throw_invalid_argument("HistogramSnapshot::merge: the configs differ");
    if (counts_.empty() && !other.counts_.empty()) counts_.assign(other.counts_.size(), 0);
    config_ = other.config_;
    layout_ = other.layout_;
    adopt_config_ = false;
    if (other.counts_.empty()) return;
    add_counts(other.counts_.data(), other.count_, other.min_, other.max_, other.sum_lo_,
               other.sum_hi_, other.underflow_, other.overflow_);
  }

  // The config this snapshot was taken with. Not thread-safe: a value type.
  [[nodiscard]] const LatencyHistogramConfig& config() const noexcept { return config_; }

  // The worst relative error of any reported percentile: 1/(2M) (see the top of the file).
  // Not thread-safe: a value type.
  [[nodiscard]] double max_relative_error() const noexcept { return layout_.max_relative_error(); }

 private:
  friend class LatencyHistogram;

  static constexpr std::chrono::nanoseconds ns(std::uint64_t v) noexcept {
    return std::chrono::nanoseconds(static_cast<std::chrono::nanoseconds::rep>(v));
  }

  [[nodiscard]] long double sum_ns() const noexcept {
    return static_cast<long double>(sum_hi_) * 18446744073709551616.0L + static_cast<long double>(sum_lo_);
  }

  [[nodiscard]] std::uint64_t rank_of(double p) const noexcept {
    if (!(p > 0.0)) return 1;
    if (p >= 100.0) return count_;
    const double r = detail::ceil(p * static_cast<double>(count_) / 100.0);
    if (r < 1.0) return 1;
    if (r >= static_cast<double>(count_)) return count_;
    return static_cast<std::uint64_t>(r);
  }

  // counts has layout_.size() entries, as counts_ must already. Never throws.
  void add_counts(const std::uint64_t* counts, std::uint64_t count, std::uint64_t min,
                  std::uint64_t max, std::uint64_t sum_lo, std::uint64_t sum_hi,
                  std::uint64_t underflow, std::uint64_t overflow) noexcept {
    for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += counts[i];
    if (count != 0) {
      min_ = count_ == 0 ? min : std::min(min_, min);
      max_ = count_ == 0 ? max : std::max(max_, max);
    }
    count_ += count;
    const std::uint64_t lo = sum_lo_ + sum_lo;
    sum_hi_ += sum_hi + (lo < sum_lo_ ? 1 : 0);
    sum_lo_ = lo;
    underflow_ += underflow;
    overflow_ += overflow;
  }

  LatencyHistogramConfig config_{};
  detail::HistogramLayout layout_ = detail::histogram_default_layout;
  bool adopt_config_ =
      true;  // default-constructed and never merged into: takes the first other's config
  std::vector<std::uint64_t> counts_;  // empty until the first merge: all zero
  std::uint64_t count_ = 0;
  std::uint64_t min_ = 0;
  std::uint64_t max_ = 0;
  std::uint64_t sum_lo_ = 0;  // the exact sum in ns is sum_hi_ * 2^64 + sum_lo_
  std::uint64_t sum_hi_ = 0;
  std::uint64_t underflow_ = 0;
  std::uint64_t overflow_ = 0;
};

// A latency histogram that many threads record into at once.
//
// Threading model: record() and record_corrected() are lock-free on the fast path: the
// calling thread's own shard is found through a thread_local cache and updated with
// relaxed loads and stores. A thread's first record into a histogram takes the
// histogram's mutex once to borrow a shard (allocating ~14 KB at the default precision,
// unless a shard released by an exited thread is free). When a thread exits its shards go
// back to their histograms' free lists, counts kept; when the histogram is destroyed its
// shards are freed and threads' cache entries for it can never match again. snapshot(),
// merge_into(), reset() and shard_count() take the mutex briefly and never block
// recorders.
//
// The object must outlive every call on it (as for any object); recording into a
// histogram while it is being destroyed is undefined. Not copyable, not movable (metrics
// registries hand out references to it).
// Exception guarantee: only the constructor, snapshot() and merge_into() throw (strong
// guarantee); recording never fails.
class LatencyHistogram {
 public:
  // Builds an empty histogram. Allocates the core (about two shards' worth: a fallback
  // shard and the reset baseline). Throws std::invalid_argument naming the bad field of
  // config, or std::bad_alloc.
  explicit LatencyHistogram(LatencyHistogramConfig config = {})
      : config_(config),
        layout_(detail::histogram_layout_for(config, "LatencyHistogram")),
        core_(std::make_shared<detail::HistogramCore>(layout_)),
        key_(core_->key()) {}

  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Records one value; see LatencyHistogramConfig for clamping. Negative and NaN durations count
  // as underflows. Lock-free and allocation-free except on a thread's first record into
  // this histogram (see the class comment); on allocation failure it records under the
  // mutex instead. Never fails. Thread-safe.
  template <class Rep, class Period>
  void record(std::chrono::duration<Rep, Period> value) noexcept {
    record_ns(detail::histogram_to_ns(value));
  }

  // Records value, then back-fills the samples that a stalled closed-loop load generator
  // failed to send (HdrHistogram's recordValueWithExpectedInterval, as wrk2 uses it):
  // value - k * expected_interval for k = 1, 2, ... while that is >= expected_interval.
  // expected_interval <= 0 records value alone. Costs O(buckets) at most, whatever
  // value / expected_interval is. Same blocking and allocation as record(). Thread-safe.
  void record_corrected(std::chrono::nanoseconds value, std::chrono::nanoseconds expected_interval) noexcept {
    const std::uint64_t v = detail::histogram_to_ns(value);
    const std::uint64_t interval = detail::histogram_to_ns(expected_interval);
    if (detail::HistogramShard* s = shard()) [[likely]] {
      s->record(layout_, v);
      if (interval != 0) s->record_backfill(layout_, v, interval);
    } else {
      core_->record_locked(v);
      if (interval != 0) core_->record_backfill_locked(v, interval);
    }
  }

  // The contents since construction or the last reset(), summed over all shards.
  // Allocates (one counts array); takes the mutex briefly, never blocks recorders. A record
  // racing with it is either counted or not. Throws std::bad_alloc. Thread-safe.
  [[nodiscard]] HistogramSnapshot snapshot() const {
    HistogramSnapshot out(config_);
    merge_into(out);
    return out;
  }

  // Adds the current contents to `out` (as out.merge(snapshot()) without the extra
  // snapshot). Allocates a temporary counts array. Throws std::invalid_argument if out has
  // another config, std::bad_alloc; strong guarantee. Thread-safe (out is the caller's).
  void merge_into(HistogramSnapshot& out) const {
    if (out.config_ != config_ && !out.adopt_config_)
      detail::throw_invalid_argument("LatencyHistogram::merge_into: the configs differ");
    std::vector<std::uint64_t> counts(layout_.size(), 0);
    detail::HistogramTotals t;
    core_->collect(counts.data(), t);

    std::uint64_t count = 0;
    long double estimate = 0;  // the sum by bucket midpoints, within 1/(2M) of the truth
    std::size_t first = layout_.size();
    std::size_t last = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] == 0) continue;
      count += counts[i];
      estimate += static_cast<long double>(counts[i]) * static_cast<long double>(layout_.slot_mid(i));
      if (first == layout_.size()) first = i;
      last = i;
    }
    std::uint64_t min = 0, max = 0, sum_hi = 0;
    if (count != 0) {
      // The shards' exact min/max, unless a record or reset raced with this snapshot and
      // left them outside the buckets seen: then the bucket bounds.
      min = t.min;
      if (min < layout_.slot_low(first) || min > layout_.slot_high(first)) min = layout_.slot_low(first);
      max = t.max;
      if (max < layout_.slot_low(last) || max > layout_.slot_high(last)) max = layout_.slot_high(last);
      if (min > max) std::swap(min, max);  // both racy readings in one bucket
      // The shards keep the exact sum modulo 2^64; the midpoint estimate is within 1/(2M)
      // of it (0.78 %; 6.25 % at one digit), which fixes the high word while that error is
      // below 2^63: for sums below 2^67 ns (4,000 years of summed latency) at any precision.
      const long double two64 = 18446744073709551616.0L;
      const long double wraps = detail::round((estimate - static_cast<long double>(t.sum)) / two64);
      sum_hi = wraps > 0 ? static_cast<std::uint64_t>(wraps) : 0;
    }
    if (out.counts_.empty()) out.counts_.assign(layout_.size(), 0);
    out.config_ = config_;
    out.layout_ = layout_;
    out.adopt_config_ = false;
    out.add_counts(counts.data(), count, min, max, t.sum, sum_hi, t.underflow, t.overflow);
  }

  // Forgets every value recorded so far (snapshots start from zero again). Takes the mutex;
  // never allocates, never blocks recorders; a record racing with it lands on either side.
  // Thread-safe.
  void reset() noexcept { core_->reset(); }

  // The config given at construction. Thread-safe.
  [[nodiscard]] const LatencyHistogramConfig& config() const noexcept { return config_; }

  // Heap bytes of one recording thread's shard (header + counters): 13,696 at the default
  // config. Thread-safe.
  [[nodiscard]] std::size_t shard_bytes() const noexcept {
    return detail::HistogramShard::bytes_for(layout_.size());
  }
  // Number of buckets per shard. Thread-safe.
  [[nodiscard]] std::size_t bucket_count() const noexcept { return layout_.size(); }
  // Shards allocated so far: at most the number of threads that were recording at the same
  // time (an exited thread's shard is reused). Takes the mutex. Thread-safe.
  [[nodiscard]] std::size_t shard_count() const noexcept { return core_->shard_count(); }

 private:
  [[nodiscard]] detail::HistogramShard* shard() const noexcept {
    const detail::HistogramCacheEntry& e =
        detail::histogram_cache.entries[detail::histogram_cache_way(key_)];
    if (e.key == key_) [[likely]] return e.shard;
    return detail::histogram_thread_shard(core_);
  }

  void record_ns(std::uint64_t v) noexcept {
    const detail::HistogramCacheEntry& e =
        detail::histogram_cache.entries[detail::histogram_cache_way(key_)];
    if (e.key == key_) [[likely]] {
      e.shard->record(layout_, v);
      return;
    }
    record_slow(v);
  }

  [[gnu::noinline]] void record_slow(std::uint64_t v) noexcept {
    if (detail::HistogramShard* s = detail::histogram_thread_shard(core_)) {
      s->record(layout_, v);
    } else {
      core_->record_locked(v);
    }
  }

  const LatencyHistogramConfig config_;
  const detail::HistogramLayout layout_;
  const std::shared_ptr<detail::HistogramCore> core_;
  const void* const key_;
};

// "p95 over the last N seconds": a ring of `slots` LatencyHistograms, each covering
// window / slots of the clock's time. Recording goes to the slot of the current time
// (clearing it first when the ring has come round); snapshot() merges the slots still in
// the window. A snapshot therefore holds every sample of the last window - window/slots
// and none older than window.
//
// Threading and memory: as LatencyHistogram, per slot (a recording thread owns one shard
// in each slot it records into). record() takes a mutex once per slot rotation.
// Not copyable, not movable. Exception guarantee: only the constructor and snapshot()
// throw (strong guarantee).
template <Clock C = SteadyClock>
class RollingHistogram {
 public:
  // window / slots is the rotation step (integer nanoseconds; the effective window is
  // slots times it). Allocates every slot. Throws std::invalid_argument naming the bad
  // field (window > 0, 1 <= slots <= 1000, window >= slots ns, and config as
  // LatencyHistogram).
  RollingHistogram(std::chrono::nanoseconds window, int slots = 10,
                   LatencyHistogramConfig config = {}, C clock = C{})
      : config_(validate(window, slots, config)),
        step_(window / slots),
        clock_(std::move(clock)),
        origin_(clock_.now()) {
    slots_.reserve(static_cast<std::size_t>(slots));
    for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<Slot>(config_));
  }

  RollingHistogram(const RollingHistogram&) = delete;
  RollingHistogram& operator=(const RollingHistogram&) = delete;

  // Records value into the current slot. Lock-free except once per rotation of a slot
  // (a short mutex) and as LatencyHistogram::record(). Never fails. Thread-safe.
  template <class Rep, class Period>
  void record(std::chrono::duration<Rep, Period> value) noexcept {
    const std::int64_t e = epoch(clock_.now());
    Slot& s = slot_for(e);
    if (s.epoch.load(std::memory_order_acquire) != e) [[unlikely]] rotate(s, e);
    s.histogram.record(value);
  }

  // The samples recorded within the window (see the class comment). Allocates; takes each
  // slot's mutex briefly. Throws std::bad_alloc. Thread-safe.
  [[nodiscard]] HistogramSnapshot snapshot() const {
    HistogramSnapshot out(config_);
    const std::int64_t now = epoch(clock_.now());
    const auto n = static_cast<std::int64_t>(slots_.size());
    for (const auto& s : slots_) {
      const std::int64_t e = s->epoch.load(std::memory_order_acquire);
      if (e > now - n && e <= now) s->histogram.merge_into(out);
    }
    return out;
  }

  // Forgets every sample. Takes the rotation mutex. Thread-safe.
  void reset() noexcept {
    std::lock_guard lock(rotate_mutex_);
    for (auto& s : slots_) {
      s->histogram.reset();
      s->epoch.store(never, std::memory_order_release);
    }
  }

  // The effective window (slots x step). Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds window() const noexcept {
    return step_ * static_cast<std::int64_t>(slots_.size());
  }
  // Number of slots. Thread-safe.
  [[nodiscard]] int slots() const noexcept { return static_cast<int>(slots_.size()); }
  // The config of every slot. Thread-safe.
  [[nodiscard]] const LatencyHistogramConfig& config() const noexcept { return config_; }

 private:
  static constexpr std::int64_t never = std::numeric_limits<std::int64_t>::min();

  struct Slot {
    explicit Slot(const LatencyHistogramConfig& o) : histogram(o) {}
    std::atomic<std::int64_t> epoch{never};
    LatencyHistogram histogram;
  };

  static LatencyHistogramConfig validate(std::chrono::nanoseconds window, int slots, const LatencyHistogramConfig& o) {
    if (window.count() <= 0) detail::throw_invalid_argument("RollingHistogram: window must be > 0");
    if (slots < 1 || slots > 1000) detail::throw_invalid_argument("RollingHistogram: slots must be in [1, 1000]");
    if (window.count() < slots) detail::throw_invalid_argument("RollingHistogram: window must be >= slots nanoseconds");
    (void)detail::histogram_layout_for(o, "RollingHistogram");
    return o;
  }

  [[nodiscard]] std::int64_t epoch(typename C::time_point t) const noexcept {
    const auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_);
    // Floor division: a clock may be read slightly before origin_ by another thread.
    std::int64_t q = d.count() / step_.count();
    if (d.count() % step_.count() < 0) --q;
    return q;
  }

  [[nodiscard]] Slot& slot_for(std::int64_t e) const noexcept {
    const auto n = static_cast<std::int64_t>(slots_.size());
    return *slots_[static_cast<std::size_t>(((e % n) + n) % n)];
  }

  void rotate(Slot& s, std::int64_t e) noexcept {
    std::lock_guard lock(rotate_mutex_);
    if (s.epoch.load(std::memory_order_relaxed) < e) {
      s.histogram.reset();
      s.epoch.store(e, std::memory_order_release);
    }
  }

  const LatencyHistogramConfig config_;
  const std::chrono::nanoseconds step_;
  C clock_;
  typename C::time_point origin_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex rotate_mutex_;
};

}  // namespace tailbatch
