// The sharded storage behind LatencyHistogram. Machinery; users never name it.
//
// Ownership, in one place:
//   - A LatencyHistogram owns a HistogramCore (through a shared_ptr). The core owns every
//     shard ever created for that histogram, a free list, and the reset baseline.
//   - A recording thread borrows one shard per histogram. It finds it through two
//     thread_local objects:
//       histogram_cache          a small direct-mapped array {key -> shard}, trivially
//                                constructed and destroyed, so reading it needs no guard
//                                and no TLS wrapper call (the fast path);
//       histogram_thread_shards  the thread's list of borrowed shards; its destructor runs
//                                at thread exit and returns every shard to its core's free
//                                list, where the next new thread picks it up (the slow
//                                path; counts recorded so far stay in the shard).
//   - Keys are the addresses of small HistogramAnchor objects. A thread's list holds a
//     shared_ptr to each anchor it has cached, so an anchor's address is never reused while
//     any thread can still match it: a histogram that dies leaves stale cache entries that
//     can never match a live histogram. The list holds only a weak_ptr to the core, so a
//     thread never keeps a dead histogram's counters alive.
//   These two thread_locals are the only state with more than one histogram in view; no
//   other global or static state exists. Under -fvisibility=hidden each shared object gets
//   its own copies, which is still correct (a thread may then hold one shard per shared
//   object that records into the same histogram).
//
// Each shard has one writer at a time, so every counter update is a relaxed load and a
// relaxed store of an atomic: no read-modify-write, no lock prefix, no shared cache line,
// and no data race with a concurrent snapshot (which reads the same atomics).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include <tailbatch/detail/histogram/layout.hpp>
#include <tailbatch/detail/throw.hpp>

// Users who link tailbatch into a shared library that is loaded at program start (not
// dlopen()ed later) may define this as [[gnu::tls_model("initial-exec")]] to make the
// fast-path thread_local as cheap as in an executable; see docs/latency-histogram.md.
#ifndef TAILBATCH_HISTOGRAM_TLS_MODEL
#define TAILBATCH_HISTOGRAM_TLS_MODEL
#endif

namespace tailbatch::detail {

// Adds n to a counter that only the calling thread writes: a load and a store, no RMW.
inline void histogram_bump(std::atomic<std::uint64_t>& a, std::uint64_t n) noexcept {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// Raw totals gathered from shards. `sum` wraps modulo 2^64 (the snapshot restores the
// high bits from the bucket midpoints, see LatencyHistogram::merge_into).
struct HistogramTotals {
  std::uint64_t sum = 0;
  std::uint64_t min = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t max = 0;
  std::uint64_t underflow = 0;
  std::uint64_t overflow = 0;
};

struct alignas(64) HistogramCounterLine {
  std::atomic<std::uint64_t> v[8];
};
static_assert(sizeof(HistogramCounterLine) == 64);

// One thread's counters for one histogram. Its own cache lines: the header fields share
// the shard's first line, the buckets start on a fresh one.
class alignas(64) HistogramShard {
 public:
  explicit HistogramShard(std::size_t buckets)
      : lines_(new HistogramCounterLine[line_count(buckets)]()) {}

  static constexpr std::size_t line_count(std::size_t buckets) noexcept { return (buckets + 7) / 8; }
  // What one shard occupies on the heap.
  static constexpr std::size_t bytes_for(std::size_t buckets) noexcept {
    return sizeof(HistogramShard) + line_count(buckets) * sizeof(HistogramCounterLine);
  }

  // Single writer only.
  void record(const HistogramLayout& layout, std::uint64_t v) noexcept {
    if (v < layout.lowest()) [[unlikely]] {
      histogram_bump(underflow_, 1);
      v = layout.lowest();
    } else if (v > layout.highest()) [[unlikely]] {
      histogram_bump(overflow_, 1);
      v = layout.highest();
    }
    histogram_bump(bucket(layout.slot(v)), 1);
    histogram_bump(sum_, v);
    if (v < min_.load(std::memory_order_relaxed)) min_.store(v, std::memory_order_relaxed);
    if (v > max_.load(std::memory_order_relaxed)) max_.store(v, std::memory_order_relaxed);
  }

  // Coordinated-omission back-fill, as HdrHistogram's recordValueWithExpectedInterval:
  // records value - k*interval for k = 1, 2, ... while that is >= interval. The values form
  // an arithmetic progression, so each bucket it crosses is filled with one count and one
  // closed-form sum: the cost is bounded by the number of buckets, not by value/interval.
  // Single writer only. interval >= 1.
  void record_backfill(const HistogramLayout& layout, std::uint64_t value,
                       std::uint64_t interval) noexcept {
    if (value / interval < 2) return;
    const std::uint64_t n = value / interval - 1;  // values value - k*interval, k = 1..n
    std::uint64_t k = 1;
    std::uint64_t lowest_seen = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t highest_seen = 0;
    while (k <= n) {
      const std::uint64_t v = value - k * interval;
      std::uint64_t last;  // the last k of this run
      if (v > layout.highest()) {
        last = std::min(n, (value - layout.highest() - 1) / interval);
        const std::uint64_t c = last - k + 1;
        histogram_bump(overflow_, c);
        histogram_bump(bucket(layout.slot(layout.highest())), c);
        histogram_bump(sum_, c * layout.highest());
        highest_seen = layout.highest();
        lowest_seen = std::min(lowest_seen, layout.highest());
      } else if (v < layout.lowest()) {
        last = n;
        const std::uint64_t c = last - k + 1;
        histogram_bump(underflow_, c);
        histogram_bump(bucket(layout.slot(layout.lowest())), c);
        histogram_bump(sum_, c * layout.lowest());
        highest_seen = std::max(highest_seen, layout.lowest());
        lowest_seen = layout.lowest();
      } else {
        const std::size_t slot = layout.slot(v);
        const std::uint64_t low = layout.slot_low(slot);
        last = std::min(n, (value - low) / interval);
        const std::uint64_t c = last - k + 1;
        histogram_bump(bucket(slot), c);
        // sum over j = k..last of (value - j*interval), modulo 2^64; (k + last) * c is even,
        // so halve whichever factor is even before multiplying.
        const std::uint64_t pairs = (c % 2 == 0) ? (c / 2) * (k + last) : c * ((k + last) / 2);
        histogram_bump(sum_, c * value - interval * pairs);
        highest_seen = std::max(highest_seen, v);
        lowest_seen = std::min(lowest_seen, value - last * interval);
      }
      k = last + 1;
    }
    if (lowest_seen < min_.load(std::memory_order_relaxed)) min_.store(lowest_seen, std::memory_order_relaxed);
    if (highest_seen > max_.load(std::memory_order_relaxed)) max_.store(highest_seen, std::memory_order_relaxed);
  }

  // Adds this shard's counters to counts[0..buckets) and totals. Any thread.
  void add_to(std::uint64_t* counts, std::size_t buckets, HistogramTotals& totals) const noexcept {
    for (std::size_t i = 0; i < buckets; ++i) counts[i] += bucket(i).load(std::memory_order_relaxed);
    totals.sum += sum_.load(std::memory_order_relaxed);
    totals.underflow += underflow_.load(std::memory_order_relaxed);
    totals.overflow += overflow_.load(std::memory_order_relaxed);
    totals.min = std::min(totals.min, min_.load(std::memory_order_relaxed));
    totals.max = std::max(totals.max, max_.load(std::memory_order_relaxed));
  }

  // Forgets min and max (counts are reset through the core's baseline). Any thread: a
  // record racing with this may leave its own value as min/max, which is harmless.
  void clear_extremes() noexcept {
    min_.store(std::numeric_limits<std::uint64_t>::max(), std::memory_order_relaxed);
    max_.store(0, std::memory_order_relaxed);
  }

 private:
  [[nodiscard]] std::atomic<std::uint64_t>& bucket(std::size_t i) noexcept { return lines_[i / 8].v[i % 8]; }
  [[nodiscard]] const std::atomic<std::uint64_t>& bucket(std::size_t i) const noexcept {
    return lines_[i / 8].v[i % 8];
  }

  std::atomic<std::uint64_t> sum_{0};
  std::atomic<std::uint64_t> min_{std::numeric_limits<std::uint64_t>::max()};
  std::atomic<std::uint64_t> max_{0};
  std::atomic<std::uint64_t> underflow_{0};
  std::atomic<std::uint64_t> overflow_{0};
  std::unique_ptr<HistogramCounterLine[]> lines_;
};

// Its address is a histogram's identity in the thread caches (see the top of this file).
struct HistogramAnchor {
  char unused = 0;
};

// Everything a LatencyHistogram shares with the threads that record into it.
class HistogramCore {
 public:
  explicit HistogramCore(const HistogramLayout& layout)
      : layout_(layout),
        anchor_(std::make_shared<HistogramAnchor>()),
        orphan_(layout.size()),
        baseline_(layout.size(), 0) {}

  HistogramCore(const HistogramCore&) = delete;
  HistogramCore& operator=(const HistogramCore&) = delete;

  [[nodiscard]] const HistogramLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] const void* key() const noexcept { return anchor_.get(); }
  [[nodiscard]] const std::shared_ptr<HistogramAnchor>& anchor() const noexcept { return anchor_; }

  // A shard for the calling thread to own: a released one if any, else a new one.
  // Throws std::bad_alloc.
  [[nodiscard]] HistogramShard* acquire() {
    std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      HistogramShard* s = free_.back();
      free_.pop_back();
      return s;
    }
    // Reserve first so that release() never allocates.
    free_.reserve(shards_.size() + 1);
    shards_.reserve(shards_.size() + 1);
    shards_.push_back(std::make_unique<HistogramShard>(layout_.size()));
    return shards_.back().get();
  }

  // Gives a shard back (its counts stay). Never allocates.
  void release(HistogramShard* shard) noexcept {
    std::lock_guard lock(mutex_);
    free_.push_back(shard);
  }

  // For threads that cannot own a shard (out of memory, or recording from a thread_local
  // destructor after the thread's shard list is gone): record under the mutex.
  void record_locked(std::uint64_t v) noexcept {
    std::lock_guard lock(mutex_);
    orphan_.record(layout_, v);
  }
  void record_backfill_locked(std::uint64_t v, std::uint64_t interval) noexcept {
    std::lock_guard lock(mutex_);
    orphan_.record_backfill(layout_, v, interval);
  }

  // Current counts since the last reset: counts[0..layout().size()) must be zero on entry.
  void collect(std::uint64_t* counts, HistogramTotals& totals) const noexcept {
    std::lock_guard lock(mutex_);
    add_all(counts, totals);
    // Counters only grow and every read here is ordered after the baseline's reads by the
    // mutex, so these differences never go negative (sum wraps, as intended).
    for (std::size_t i = 0; i < layout_.size(); ++i) counts[i] -= baseline_[i];
    totals.sum -= baseline_totals_.sum;
    totals.underflow -= baseline_totals_.underflow;
    totals.overflow -= baseline_totals_.overflow;
  }

  // Counts recorded before this call stop showing up in snapshots. Shards are never
  // written by anyone but their owner: the reset moves a baseline instead, so a record
  // racing with reset() is either fully before it or fully after it.
  void reset() noexcept {
    std::lock_guard lock(mutex_);
    std::fill(baseline_.begin(), baseline_.end(), 0);
    baseline_totals_ = {};
    add_all(baseline_.data(), baseline_totals_);
    for (auto& s : shards_) s->clear_extremes();
    orphan_.clear_extremes();
  }

  [[nodiscard]] std::size_t shard_count() const noexcept {
    std::lock_guard lock(mutex_);
    return shards_.size();
  }

 private:
  void add_all(std::uint64_t* counts, HistogramTotals& totals) const noexcept {
    for (const auto& s : shards_) s->add_to(counts, layout_.size(), totals);
    orphan_.add_to(counts, layout_.size(), totals);
  }

  const HistogramLayout layout_;
  const std::shared_ptr<HistogramAnchor> anchor_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<HistogramShard>> shards_;
  std::vector<HistogramShard*> free_;
  HistogramShard orphan_;
  std::vector<std::uint64_t> baseline_;
  HistogramTotals baseline_totals_;
};

// ---- the per-thread side -------------------------------------------------------------

struct HistogramCacheEntry {
  const void* key = nullptr;
  HistogramShard* shard = nullptr;
};

struct HistogramCache {
  static constexpr std::size_t ways = 8;
  HistogramCacheEntry entries[ways];
  bool exiting = false;  // set once the thread's shard list has been destroyed
};

// Trivially constructed and destroyed: its reads compile to a plain TLS access.
TAILBATCH_HISTOGRAM_TLS_MODEL inline thread_local constinit HistogramCache histogram_cache{};

[[nodiscard]] inline std::size_t histogram_cache_way(const void* key) noexcept {
  const auto x = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key));
  return static_cast<std::size_t>((x * 0x9E3779B97F4A7C15ull) >> 61);
}
static_assert(HistogramCache::ways == 8, "histogram_cache_way yields 3 bits");

// The shards this thread has borrowed; returns them when the thread exits.
class HistogramThreadShards {
 public:
  HistogramThreadShards() noexcept = default;
  HistogramThreadShards(const HistogramThreadShards&) = delete;
  HistogramThreadShards& operator=(const HistogramThreadShards&) = delete;

  ~HistogramThreadShards() {
    histogram_cache.exiting = true;
    for (auto& e : histogram_cache.entries) e = {};
    for (auto& e : entries_) {
      if (auto core = e.core.lock()) core->release(e.shard);
    }
  }

  [[nodiscard]] HistogramShard* find(const void* key) const noexcept {
    for (const auto& e : entries_) {
      if (e.anchor.get() == key) return e.shard;
    }
    return nullptr;
  }

  // Remembers a borrowed shard. False (and nothing remembered) when out of memory.
  bool add(const std::shared_ptr<HistogramCore>& core, HistogramShard* shard) noexcept {
    if (entries_.size() >= prune_at_) prune();
#if TAILBATCH_HAS_EXCEPTIONS
    try {
      entries_.push_back(Entry{core->anchor(), core, shard});
    } catch (...) {
      return false;
    }
#else
    entries_.push_back(Entry{core->anchor(), core, shard});  // out of memory aborts
#endif
    return true;
  }

 private:
  struct Entry {
    std::shared_ptr<HistogramAnchor> anchor;
    std::weak_ptr<HistogramCore> core;
    HistogramShard* shard;
  };

  // Drops entries of histograms that no longer exist (and their cache entries, before the
  // anchor address can be reused). Amortised: runs when the list has doubled.
  void prune() noexcept {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      Entry& e = entries_[i];
      if (e.core.expired()) {
        auto& slot = histogram_cache.entries[histogram_cache_way(e.anchor.get())];
        if (slot.key == e.anchor.get()) slot = {};
      } else {
        if (kept != i) entries_[kept] = std::move(e);  // never self-move: it empties a weak_ptr
        ++kept;
      }
    }
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(kept), entries_.end());
    prune_at_ = std::max<std::size_t>(16, 2 * kept);
  }

  std::vector<Entry> entries_;
  std::size_t prune_at_ = 16;
};

inline thread_local HistogramThreadShards histogram_thread_shards;

// The calling thread's shard of `core`, installed in the fast cache; nullptr when the
// thread cannot own one (then the caller records under the core's mutex).
[[gnu::noinline]] inline HistogramShard* histogram_thread_shard(
    const std::shared_ptr<HistogramCore>& core) noexcept {
  auto& cache = histogram_cache;
  if (cache.exiting) return nullptr;
  auto& mine = histogram_thread_shards;
  const void* key = core->key();
  HistogramShard* shard = mine.find(key);
  if (shard == nullptr) {
#if TAILBATCH_HAS_EXCEPTIONS
    try {
      shard = core->acquire();
    } catch (...) {
      return nullptr;
    }
#else
    shard = core->acquire();  // out of memory aborts
#endif
    if (!mine.add(core, shard)) {
      core->release(shard);
      return nullptr;
    }
  }
  cache.entries[histogram_cache_way(key)] = {key, shard};
  return shard;
}

}  // namespace tailbatch::detail
