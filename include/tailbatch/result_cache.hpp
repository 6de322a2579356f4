// ResultCache: answers repeated requests without running the model again, and runs
// identical requests that arrive together only once.
//
//   ResultCache<std::string, Prediction> cache({.max_entries = 100'000});
//   cache.submit(pipeline, text, {}, [](Outcome<Prediction>&& o) { ... });
//
// What submit(pipeline, req, options, callback) does:
//   hit        the cached value completes the callback at once, in the calling thread,
//              without touching the Pipeline's queue;
//   coalesced  an identical request (same hash and KeyEqual) is already queued or
//              executing: this one waits for its outcome and takes no batch slot;
//   miss       the request is submitted to the Pipeline as the leader of a new shared
//              request; an ok outcome is offered to the cache, and every waiter gets it.
// Failed, rejected, cancelled and deadline_exceeded outcomes are never cached.
//
// Cancellation: each waiter (the leader too) cancels only itself. A waiter whose token
// fires completes at once with Status::cancelled; the shared request is cancelled in the
// Pipeline only when every waiter on it has cancelled. Should it still end cancelled or
// deadline_exceeded while some waiters want it (one joined as the last one cancelled, or
// the leader's deadline passed), those whose deadline has not passed are submitted again
// as a new shared request, led by the first of them; the others get deadline_exceeded.
// Deadlines: a request joins a shared request only when its own deadline is no earlier
// than the shared one's, so nobody is ever served after their deadline; a request with an
// earlier deadline goes to the Pipeline on its own (counted as a miss). The shared
// request runs at its leader's priority.
//
// Eviction and admission: W-TinyLFU per shard (detail/cache/tinylfu_store.hpp), bounded by
// entries and by bytes (Config::size_of says what an entry weighs), with an optional
// time-to-live read from the clock C. Lookups are counted in a frequency sketch with a
// doorkeeper (detail/cache/frequency_sketch.hpp): a scan of one-hit keys does not evict a hot
// set.
//
// Hits without the lock: when Key and Value are trivially copyable and 64 bytes together
// at most (integers, fixed-size structs, a 64- or 128-bit fingerprint of a request), each
// shard's entries live in a sequence-locked table of atomic words
// (detail/cache/optimistic_index.hpp) that a hit reads without taking the shard's lock and
// without writing any cache line another thread uses: it probes, copies the value out,
// and checks that no writer ran meanwhile (else it retries, and after a few tries takes
// the lock). Its count goes to the calling thread's stripe, and its sighting for the
// admission policy to the stripe's small buffer, which the shard's lock holder applies
// (before every insert, or when the buffer fills and the lock is free; otherwise it is
// dropped). Hits on settled entries (protected, already marked) are sampled one in 32
// with weight 32. Other types (std::string keys, say) take the shard's lock for a hit:
// key such a cache by a fingerprint of the request to get the lock-free path.
// docs/result-cache.md has the design and the measurements.
//
// Why this file is longer than the core's usual 700 lines: about 800 of its lines are the
// ResultCache class, the one place where a lookup, a coalesced wait, admission and eviction
// meet under a shard's lock (about 200 of the file's lines are documentation); what can
// stand alone already does: the storage and its W-TinyLFU segments
// (detail/cache/tinylfu_store.hpp), the lock-free index (detail/cache/optimistic_index.hpp) and the
// frequency sketch (detail/cache/frequency_sketch.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tailbatch/detail/time.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/cache/frequency_sketch.hpp>
#include <tailbatch/detail/cache/optimistic_index.hpp>
#include <tailbatch/detail/request_intake.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/detail/cache/tinylfu_store.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/pipeline.hpp>

namespace tailbatch {

// ResultCache configuration. Bad values make the constructor throw std::invalid_argument
// naming the field ("ResultCache: max_entries must be >= 1").
template <class Key, class Value>
struct ResultCacheConfig {
  // The most entries held at once, over all shards (each shard holds its share).
  std::size_t max_entries = 10000;
  // The most bytes held at once, as counted by size_of, over all shards. 0: no byte bound.
  // Each shard holds its share, so one entry may weigh at most max_bytes / shards.
  std::size_t max_bytes = 0;
  // An entry's weight in bytes. Required when max_bytes is set; called once per insert,
  // under the shard's lock (from several threads at once for different shards), so it
  // must be thread-safe, quick, and must not call into the cache.
  std::function<std::size_t(const Key&, const Value&)> size_of{};
  // How long an entry stays valid after it was inserted. 0: entries never expire.
  std::chrono::nanoseconds ttl{0};
  // Independently locked shards; a power of two, at most 256. 0: automatic (four per
  // hardware thread, 16 to 64, fewer when max_entries is small).
  std::size_t shards = 0;
  // Metrics (tailbatch_cache_*), registered at construction with these labels added to
  // each. nullptr: none, at no cost.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// Counts since construction (exact once no call is in progress).
struct ResultCacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;      // looked up and not found (submit: sent to the Pipeline)
  std::uint64_t coalesced = 0;   // joined an identical request in flight
  std::uint64_t inserts = 0;     // entries stored (ok outcomes and insert() calls)
  std::uint64_t evictions = 0;   // entries evicted for room, admission losers included
  std::uint64_t expired = 0;     // entries dropped because their time-to-live passed
  std::uint64_t resubmitted = 0; // shared requests submitted again for waiters still live
  std::uint64_t callback_exceptions = 0;  // completion callbacks that threw
  std::size_t entries = 0;
  std::size_t bytes = 0;
  std::size_t in_flight = 0;     // shared requests queued or executing

  // hits / (hits + misses + coalesced); 0 before any lookup.
  [[nodiscard]] double hit_ratio() const noexcept {
    const auto n = hits + misses + coalesced;
    return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
  }
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using CacheStats [[deprecated("renamed ResultCacheStats")]] = ResultCacheStats;

namespace detail {

// A shard's lock. Every hit takes it, so it is made for holds of tens of nanoseconds:
// lock is one atomic exchange when free, unlock one plain store (std::mutex's unlock is
// a second atomic read-modify-write, which on x86 also stalls the loads behind it and
// cost a hit about a third of its time). Having no sleeping waiters to wake is what
// makes that store enough: a waiter spins briefly, then yields, then sleeps in 20 us
// steps, so a holder preempted mid-hit, or one holding it longer (insert, clear,
// erase_expired), costs waiters little CPU. Not fair. Meets Lockable.
class ShardLock {
 public:
  void lock() noexcept {
    if (try_lock()) return;
    lock_contended();
  }
  [[nodiscard]] bool try_lock() noexcept { return !held_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    unsigned waits = 0;
    do {
      while (held_.load(std::memory_order_relaxed)) {
        if (waits < 64) {
          cpu_relax();
        } else if (waits < 64 + 16) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        if (waits < 64 + 16) ++waits;
      }
    } while (!try_lock());
  }

  std::atomic<bool> held_{false};
};

// A waiter's completion: a move-only, type-erased void(Outcome<Value>&&). Allocates once.
template <class Value>
class CacheCallback {
 public:
  CacheCallback() noexcept = default;
  template <class F>
  explicit CacheCallback(F&& f) : impl_(std::make_unique<Impl<std::decay_t<F>>>(std::forward<F>(f))) {}
  [[nodiscard]] explicit operator bool() const noexcept { return impl_ != nullptr; }
  void operator()(Outcome<Value>&& o) { impl_->call(std::move(o)); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void call(Outcome<Value>&& o) = 0;
  };
  template <class F>
  struct Impl final : Base {
    explicit Impl(F&& x) : f(std::move(x)) {}
    explicit Impl(const F& x) : f(x) {}
    void call(Outcome<Value>&& o) override { f(std::move(o)); }
    F f;
  };
  std::unique_ptr<Base> impl_;
};

}  // namespace detail

// A concurrent, sharded result cache with in-flight coalescing, for a Pipeline<Key, Value>.
//
//   Key       the request type: copy-constructible (a shared request keeps a copy).
//   Value     the response type: copy-constructible (a hit copies it out).
//   Hash      hashes a Key (std::hash<Key> by default); KeyEqual compares two. Both must
//             be thread-safe and must not throw. The hash is mixed again, so an identity
//             hash on integers is fine.
//   C         the clock the time-to-live is read from (ManualClock in tests).
//
// Thread-safety: every member may be called from any thread at once. Each shard has one
// lock, held for an insert, a miss or a locked hit (never while a user callback, the
// Pipeline or the model runs); for trivially copyable Key and Value a hit takes no lock
// (see the file comment). Callbacks run in the calling thread (hits, requests turned away at once,
// cancellations) or in the Pipeline's completion thread (everything else), never under a
// cache lock, so a callback may call back into the cache.
//
// Exceptions: the constructor throws std::invalid_argument naming a bad field and
// std::bad_alloc. try_get() throws only what copying a Value throws; insert() gives the
// strong guarantee (std::bad_alloc, or what size_of or moving throws); submit() with a
// callback never throws (out of memory completes the callback with Status::failed), and
// an exception thrown by a callback is caught, counted and dropped.
//
// One cache per Pipeline: a request joins an identical request in flight whichever
// Pipeline that one was submitted to.
//
// Lifetime: a Pipeline that the cache submitted to must be shut down (or destroyed)
// before the cache is destroyed: its completions call back into the cache.
template <class Key, class Value, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>,
          Clock C = SteadyClock>
  requires std::copy_constructible<Key> && std::copy_constructible<Value> && std::movable<Value>
class ResultCache {
 public:
  using Config = ResultCacheConfig<Key, Value>;
  using time_point = typename C::time_point;

  // Allocates every shard and its frequency sketch, and registers the metrics. Throws
  // std::invalid_argument naming a bad field, std::bad_alloc.
  explicit ResultCache(Config config = {}, Hash hash = Hash{}, KeyEqual eq = KeyEqual{}, C clock = C{})
      : config_(std::move(config)), hash_(std::move(hash)), clock_(std::move(clock)) {
    if (config_.max_entries < 1) detail::throw_invalid_argument("ResultCache: max_entries must be >= 1");
    if (config_.max_bytes > 0 && !config_.size_of) {
      detail::throw_invalid_argument("ResultCache: size_of must be set when max_bytes is set");
    }
    if (config_.ttl < std::chrono::nanoseconds::zero()) detail::throw_invalid_argument("ResultCache: ttl must be >= 0");
    std::size_t shards = config_.shards;
    if (shards != 0) {
      if (!std::has_single_bit(shards) || shards > 256) {
        detail::throw_invalid_argument("ResultCache: shards must be a power of two, at most 256");
      }
      if (config_.max_entries < shards) detail::throw_invalid_argument("ResultCache: max_entries must be >= shards");
      if (config_.max_bytes > 0 && config_.max_bytes < shards) {
        detail::throw_invalid_argument("ResultCache: max_bytes must be >= shards");
      }
    } else {
      const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
      shards = std::bit_floor(std::clamp<std::size_t>(4 * hw, 16, 64));
      while (shards > 1 && config_.max_entries / shards < 64) shards /= 2;
      while (shards > 1 && config_.max_bytes > 0 && config_.max_bytes < shards) shards /= 2;
    }
    shard_mask_ = shards - 1;
    shards_ = std::make_unique<Shard[]>(shards);
    shard_count_ = shards;
    for (std::size_t i = 0; i < shards; ++i) {
      const std::size_t entries = share(config_.max_entries, i);
      const std::size_t bytes = config_.max_bytes == 0 ? std::numeric_limits<std::size_t>::max()
                                                       : share(config_.max_bytes, i);
      shards_[i].store.emplace(entries, bytes, eq);
      if constexpr (stripe_count > 0) shards_[i].stripes = std::make_unique<detail::HitStripe[]>(stripe_count);
      shards_[i].flights = std::make_unique<FlightMap>(
          8, detail::KeyRefHash{}, detail::KeyRefEqual<Key, KeyEqual>{eq});
    }
    if constexpr (Store::optimistic) engaged_.emplace(detail::AtomicWords<Value>::make({}));  // all-zero bits
    if (config_.metrics != nullptr) register_metrics(*config_.metrics);
  }

  ResultCache(const ResultCache&) = delete;
  ResultCache& operator=(const ResultCache&) = delete;
  ~ResultCache() = default;

  // The cached value for key, or nullopt (absent or expired). Counts a hit or a miss and
  // one sighting in the admission filter (a hit's is buffered, may be sampled, and may
  // be dropped when the shard is busy; see the file comment). A hit on trivially
  // copyable types takes no lock and never blocks; otherwise the shard's lock is taken
  // briefly. Allocates only what copying the Value does. Throws what copying a Value
  // throws. Thread-safe.
  [[nodiscard]] std::optional<Value> try_get(const Key& key) {
    const std::uint64_t h = mixed_hash(key);
    Shard& s = shard_of(h);
    if constexpr (Store::optimistic) {
      const auto found = s.store->probe(key, h);
      if (optimistic_hit(s, h, found)) [[likely]] {
        // Copied from an engaged optional the compiler cannot see into, then assigned:
        // the engaged flag then arrives with its padding in one wide store. Built directly,
        // g++ 12 stores the flag as a byte and the return reloads it as a word, a
        // store-forwarding stall that cost a lock-free hit a third of its time.
        std::optional<Value> r(engaged_);
        *r = found.value();
        return r;
      }
      return get_locked(s, key, h);  // out of line: the lock-free hit stays small enough to inline
    } else {
      return get_locked(s, key, h);
    }
  }

  // Stores (key, value), replacing an existing value; evicts to stay within bounds (the
  // window's oldest entry may lose its place to a more frequent one). Returns whether the
  // entry is in the cache afterwards (false: larger than a shard's byte share). Does not
  // count a sighting: the frequency filter counts lookups. Takes the shard's lock;
  // allocates. Strong guarantee: throws std::bad_alloc, or what size_of or moving a Key or
  // Value throws, and then changes nothing (when replacing, a Value whose move assignment
  // throws may be left moved-from). Thread-safe.
  bool insert(Key key, Value value) {
    const std::uint64_t h = mixed_hash(key);
    Shard& s = shard_of(h);
    std::lock_guard lock(s.mu);
    return insert_locked(s, std::move(key), std::move(value), h);
  }

  // Removes key's entry. Returns whether there was one. Takes the shard's lock; never
  // throws. Thread-safe.
  bool erase(const Key& key) noexcept {
    const std::uint64_t h = mixed_hash(key);
    Shard& s = shard_of(h);
    std::lock_guard lock(s.mu);
    Node* n = s.store->find(key, h);
    if (n == nullptr) return false;
    const std::size_t b = n->bytes;
    s.store->erase(n);
    account(-1, -static_cast<std::ptrdiff_t>(b));
    return true;
  }

  // Drops every entry whose time-to-live has passed (lookups drop them lazily anyway;
  // this returns their bytes at once). Returns how many. Takes each shard's lock in turn;
  // never throws. Thread-safe.
  std::size_t erase_expired() noexcept {
    if (config_.ttl <= std::chrono::nanoseconds::zero()) return 0;
    const time_point now = clock_.now();
    std::size_t total = 0;
    for (std::size_t i = 0; i < shard_count_; ++i) {
      Shard& s = shards_[i];
      std::lock_guard lock(s.mu);
      const std::size_t entries = s.store->size();
      const std::size_t bytes = s.store->bytes();
      const std::size_t n = s.store->erase_expired(now);
      s.expired += n;
      total += n;
      account(static_cast<std::ptrdiff_t>(s.store->size()) - static_cast<std::ptrdiff_t>(entries),
              static_cast<std::ptrdiff_t>(s.store->bytes()) - static_cast<std::ptrdiff_t>(bytes));
      if (metrics_ && n > 0) metrics_->expired->inc(n);
    }
    return total;
  }

  // Drops every entry and the admission filter's history; shared requests in flight are
  // unaffected. Takes each shard's lock in turn; never throws. Thread-safe.
  void clear() noexcept {
    for (std::size_t i = 0; i < shard_count_; ++i) {
      Shard& s = shards_[i];
      std::lock_guard lock(s.mu);
      account(-static_cast<std::ptrdiff_t>(s.store->size()), -static_cast<std::ptrdiff_t>(s.store->bytes()));
      for (std::size_t j = 0; j < stripe_count; ++j) s.stripes[j].pending.store(0, std::memory_order_relaxed);
      s.store->clear();
    }
  }

  // Answers req from the cache, or by joining an identical request in flight, or by
  // submitting it to pipeline (see the file comment); `on_complete(Outcome<Value>&&)` is
  // called exactly once. A hit, a request turned away at once and a cancellation complete
  // in this thread, before submit returns (or in the thread that cancels); everything else
  // in the Pipeline's completion thread. Allocates a waiter record on a miss or a join
  // (and what the Pipeline allocates); never blocks beyond the shard's lock and the
  // Pipeline's submit; never throws. Thread-safe.
  template <class P, class F>
    requires std::same_as<typename P::Request, Key> && std::same_as<typename P::Response, Value> &&
             std::is_invocable_v<std::decay_t<F>&, Outcome<Value>&&>
  void submit(P& pipeline, Key req, SubmitOptions options, F&& on_complete) noexcept {
    // Arrival, deadline and the refusals every front door shares, on the Pipeline's clock
    // (detail/request_intake.hpp): a request the Pipeline would turn away at once is
    // turned away here, before the lookup, with the same outcome.
    const detail::Intake in = detail::intake(options, now_of<P>(&pipeline));
    if (!in.accepted()) {
      if (in.refusal == detail::IntakeRefusal::cancelled) {
        deliver_user(on_complete, Outcome<Value>(cancelled_error()));
      } else {
        deliver_intake_refusal(on_complete, in);
      }
      return;
    }
    const std::uint64_t h = mixed_hash(req);
    Shard& s = shard_of(h);
    std::shared_ptr<Waiter> waiter;
    // Out of memory (or a throwing Key copy) before the request was shared: the caller
    // hears of it through whichever holds its callback then.
    detail::call_guarded(
        [&] { submit_miss_or_hit<P, F>(pipeline, std::move(req), options, in, h, s, waiter, on_complete); },
        [&](const char*) {
          Outcome<Value> failed(Error{Status::failed, RejectReason::none, "tailbatch: ResultCache: out of memory", {}});
          if (waiter == nullptr) {
            deliver_user(on_complete, std::move(failed));
          } else if (waiter->done) {
            deliver_user(waiter->done, std::move(failed));
          }
        });
  }


  // As above, returning a future of the outcome, always fulfilled. Allocates the
  // future's shared state; throws std::bad_alloc only. Thread-safe.
  template <class P>
    requires std::same_as<typename P::Request, Key> && std::same_as<typename P::Response, Value>
  [[nodiscard]] std::future<Outcome<Value>> submit(P& pipeline, Key req, SubmitOptions options = {}) {
    auto promise = std::make_shared<std::promise<Outcome<Value>>>();
    std::future<Outcome<Value>> future = promise->get_future();
    submit(pipeline, std::move(req), options,
           [promise](Outcome<Value>&& o) mutable { promise->set_value(std::move(o)); });
    return future;
  }

  // Counts since construction and the current size. Takes each shard's lock in turn;
  // never allocates. Thread-safe.
  [[nodiscard]] ResultCacheStats stats() const noexcept {
    ResultCacheStats st;
    for (std::size_t i = 0; i < shard_count_; ++i) {
      const Shard& s = shards_[i];
      std::lock_guard lock(s.mu);
      st.hits += s.hits;
      for (std::size_t j = 0; j < stripe_count; ++j) st.hits += s.stripes[j].hits();
      st.misses += s.misses;
      st.coalesced += s.coalesced;
      st.inserts += s.inserts;
      st.evictions += s.evictions;
      st.expired += s.expired;
      st.resubmitted += s.resubmitted;
      st.entries += s.store->size();
      st.bytes += s.store->bytes();
    }
    st.callback_exceptions = callback_exceptions_.load(std::memory_order_relaxed);
    st.in_flight = in_flight_.load(std::memory_order_relaxed);
    return st;
  }

  // Entries and bytes held right now. Racy by nature; never blocks. Thread-safe.
  [[nodiscard]] std::size_t size_approx() const noexcept {
    return static_cast<std::size_t>(std::max<std::ptrdiff_t>(0, entries_.load(std::memory_order_relaxed)));
  }
  [[nodiscard]] std::size_t bytes_approx() const noexcept {
    return static_cast<std::size_t>(std::max<std::ptrdiff_t>(0, bytes_.load(std::memory_order_relaxed)));
  }
  // The number of shards. Thread-safe.
  [[nodiscard]] std::size_t shard_count() const noexcept { return shard_count_; }
  // The configuration, as given (shards as configured, possibly 0). Thread-safe.
  [[nodiscard]] const Config& config() const noexcept { return config_; }

 private:
  using Store = detail::TinyLfuStore<Key, Value, KeyEqual, time_point>;
  using Node = typename Store::Node;
  struct Flight;
  struct Shard;

  // One caller waiting for a shared request (the leader is one too). Its fields are
  // under its shard's lock.
  struct Waiter {
    explicit Waiter(BatchTime dl) noexcept : deadline(dl) {}
    struct OnCancel {
      ResultCache* cache;
      Shard* shard;
      Waiter* self;
      void operator()() const noexcept { cache->cancel_waiter(*shard, *self); }
    };
    detail::CacheCallback<Value> done;  // empty once completed
    BatchTime deadline;
    Flight* flight = nullptr;           // the shared request it waits on; null once over
    std::optional<std::stop_callback<OnCancel>> on_cancel;  // last: unregistered first
  };

  struct Flight {
    Flight(const Key& k, std::uint64_t h, BatchTime dl, Priority p) : key(k), hash(h), deadline(dl), priority(p) {}
    Key key;
    std::uint64_t hash;
    BatchTime deadline;
    BatchTime arrival = BatchTime::min();  // its leader's (SubmitOptions::arrival as intake saw it)
    Priority priority;
    std::vector<std::shared_ptr<Waiter>> waiters;
    std::size_t live = 0;                   // waiters attached and not cancelled
    std::optional<std::stop_source> stop;   // set when its leader can cancel
    bool alone = false;                     // not in the flight map: nobody joins it
    // The Pipeline it runs in, type-erased: to submit it again, and to read its clock.
    void* pipeline = nullptr;
    void (*resubmit)(ResultCache&, void*, Key&&, std::shared_ptr<Flight>) = nullptr;
    BatchTime (*pipeline_now)(void*) noexcept = nullptr;

    template <class P>
    void bind(P& p) noexcept {
      pipeline = &p;
      resubmit = &ResultCache::resubmit_to<P>;
      pipeline_now = &ResultCache::now_of<P>;
    }
  };

  using FlightMap = std::unordered_map<detail::KeyRef<Key>, std::shared_ptr<Flight>, detail::KeyRefHash,
                                       detail::KeyRefEqual<Key, KeyEqual>>;

  struct alignas(64) Shard {
    // A locked hit writes the lock, hits and the start of store: the first two cache
    // lines. A lock-free hit (optimistic types) writes only its own stripe.
    mutable detail::ShardLock mu;
    std::uint64_t hits = 0;  // locked hits; lock-free ones are counted in stripes
    std::optional<Store> store;  // in place: a hit follows one pointer less
    std::unique_ptr<FlightMap> flights;
    std::uint64_t misses = 0;
    std::uint64_t coalesced = 0;
    std::uint64_t inserts = 0;
    std::uint64_t evictions = 0;
    std::uint64_t expired = 0;
    std::uint64_t resubmitted = 0;
    // Lock-free hits' counts and sampled sightings, by thread (optimistic types only).
    std::unique_ptr<detail::HitStripe[]> stripes;
    // Whether some stripe may hold sightings: an insert checks one line, not 16. Set by
    // readers, cleared by the lock holder.
    alignas(64) std::atomic<bool> pending{false};
  };

  // Stripes per shard, chosen by the calling thread's id (two threads may share one: the
  // counts stay exact, the line is then shared).
  static constexpr std::size_t stripe_count = Store::optimistic ? 16 : 0;
  // Every lock-free hit on an entry that is not settled leaves its hash for the admission
  // policy (it may promote or mark the entry); on a settled one (protected and marked,
  // where a hit only adds to its count) one hit in hit_sample does, with that weight:
  // the bookkeeping a hit costs, shared by that many. At 32 the drains are 6-9 % of
  // BM_Cache_Hit's time in a profile, and the Zipf hit ratio was 0.638 at 8, 0.639 at 32.
  static constexpr std::uint64_t hit_sample = 32;
  static constexpr std::uint64_t weight_one = 1;

  struct Metrics {
    Counter* hits = nullptr;
    Counter* misses = nullptr;
    Counter* coalesced = nullptr;
    Counter* evicted = nullptr;
    Counter* expired = nullptr;
    std::vector<CallbackRegistration> gauges;
  };

  // ---- hashing and shards ------------------------------------------------------------

  [[nodiscard]] std::uint64_t mixed_hash(const Key& k) const noexcept {
    return detail::mix64(static_cast<std::uint64_t>(hash_(k)));
  }
  [[nodiscard]] Shard& shard_of(std::uint64_t h) const noexcept { return shards_[h & shard_mask_]; }
  [[nodiscard]] std::size_t share(std::size_t total, std::size_t i) const noexcept {
    return total / shard_count_ + (i < total % shard_count_ ? 1 : 0);
  }

  void account(std::ptrdiff_t entries, std::ptrdiff_t bytes) noexcept {
    if (entries != 0) entries_.fetch_add(entries, std::memory_order_relaxed);
    if (bytes != 0) bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }

  [[nodiscard]] bool expired(const Node& n) const noexcept {
    return config_.ttl > std::chrono::nanoseconds::zero() && clock_.now() >= n.expires;
  }

  // try_get under the shard's lock.
#if defined(__GNUC__) || defined(__clang__)
  [[gnu::noinline]]
#endif
  std::optional<Value> get_locked(Shard& s, const Key& key, std::uint64_t h) {
    std::unique_lock lock(s.mu);
    Node* n = s.store->find(key, h);
    if (n == nullptr || expired(*n)) [[unlikely]] {
      lock.release();  // missed() unlocks
      missed(s, n, h);
      return std::nullopt;
    }
    std::optional<Value> v(n->value);
    s.store->hit(n);
    ++s.hits;
    lock.unlock();
    if (metrics_) metrics_->hits->inc();
    return v;
  }

  // ---- the lock-free read path (optimistic types) --------------------------------------

  // Completes a hit found without the shard's lock (found: the shard's probe()): checks
  // the time-to-live, and counts the hit in the calling thread's stripe, so that it
  // writes no cache line another thread is using (unless two threads share a stripe).
  // False: absent, expired, or writers busy; the caller takes the locked path, which
  // decides and counts.
  template <class Found>
  bool optimistic_hit(Shard& s, std::uint64_t h, const Found& found) noexcept {
    if (found.probe != detail::Probe::hit) return false;
    if (config_.ttl > std::chrono::nanoseconds::zero() && clock_.now() >= found.expires) return false;
    const bool settled = found.settled;
    const std::uint64_t me = detail::thread_tag();
    detail::HitStripe& st = s.stripes[(me * 0x9E3779B97F4A7C15ull) >> 60];
    const std::uint64_t n = st.count(me);
    // A settled entry's hit is sampled (weight hit_sample); any other is recorded as is.
    if (!settled || n % hit_sample == 0) {
      if (st.push(settled ? h : (h | weight_one))) [[unlikely]] {
        stripe_full(s, st);
      } else if (!s.pending.load(std::memory_order_relaxed)) {
        // Written only when clear: in a run of hits without inserts the line stays
        // clean and shared.
        s.pending.store(true, std::memory_order_release);
      }
    }
    if (metrics_) metrics_->hits->inc();
    return true;
  }

  // A stripe's buffer is full: applied if the lock is free right now, else dropped
  // (lossy by design: a reader never waits for the lock).
#if defined(__GNUC__) || defined(__clang__)
  [[gnu::noinline]]
#endif
  void stripe_full(Shard& s, detail::HitStripe& st) noexcept {
    if (s.mu.try_lock()) {
      drain_stripe(s, st);
      s.mu.unlock();
    } else {
      st.pending.store(0, std::memory_order_relaxed);
    }
  }

  // Applies a stripe's sampled hits to the eviction policy. Under s.mu.
  void drain_stripe(Shard& s, detail::HitStripe& st) noexcept {
    const std::uint32_t n = std::min(st.pending.load(std::memory_order_acquire), detail::HitStripe::capacity);
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint64_t r = st.hashes[i].load(std::memory_order_relaxed);
      // Bit 0 of the recorded hash marks a hit that stands for itself alone (the mixed
      // hash's bit 0 is restored from the shard's entries: find_hash ignores it).
      if (Node* x = s.store->find_hash(r & ~weight_one)) {
        s.store->hit(x, (r & weight_one) != 0 ? 1u : static_cast<unsigned>(hit_sample));
      }
    }
    st.pending.store(0, std::memory_order_relaxed);
  }

  // Applies every stripe's sampled hits before the entries change, so that admission
  // sees them. Under s.mu.
  void drain_stripes(Shard& s) noexcept {
    if constexpr (stripe_count == 0) return;
    // Lossy: a hit pushed by a reader that saw the flag set just before this clears it
    // waits for the next drain.
    if (!s.pending.load(std::memory_order_acquire)) return;
    s.pending.store(false, std::memory_order_relaxed);
    for (std::size_t j = 0; j < stripe_count; ++j) {
      if (s.stripes[j].pending.load(std::memory_order_relaxed) != 0) drain_stripe(s, s.stripes[j]);
    }
  }

  // Drops n, whose time-to-live has passed. Under s.mu.
  void drop_expired(Shard& s, Node* n) noexcept {
    const std::size_t b = n->bytes;
    s.store->erase(n);
    ++s.expired;
    account(-1, -static_cast<std::ptrdiff_t>(b));
    if (metrics_) metrics_->expired->inc();
  }

  // The node for key if present and not expired; an expired one is dropped. Under s.mu.
  Node* live_node(Shard& s, const Key& key, std::uint64_t h) noexcept {
    Node* n = s.store->find(key, h);
    if (n == nullptr) return nullptr;
    if (expired(*n)) {
      drop_expired(s, n);
      return nullptr;
    }
    return n;
  }

  // try_get found nothing live (n: the expired node, or null). Called under s.mu, which
  // it releases. Out of line, so that try_get's hit path stays small.
#if defined(__GNUC__) || defined(__clang__)
  [[gnu::noinline]]
#endif
  void missed(Shard& s, Node* n, std::uint64_t h) noexcept {
    {
      std::unique_lock lock(s.mu, std::adopt_lock);
      if (n != nullptr) drop_expired(s, n);
      s.store->record(h);
      ++s.misses;
    }
    if (metrics_) metrics_->misses->inc();
  }

  // Under s.mu. Strong guarantee.
  bool insert_locked(Shard& s, Key&& key, Value&& value, std::uint64_t h) {
    const std::size_t bytes = config_.size_of ? config_.size_of(key, value) : 0;
    const time_point expires = config_.ttl > std::chrono::nanoseconds::zero()
                                   ? clock_.now() + std::chrono::duration_cast<typename C::duration>(config_.ttl)
                                   : time_point::max();
    const std::size_t entries_before = s.store->size();
    const std::size_t bytes_before = s.store->bytes();
    drain_stripes(s);
    detail::EvictionTally tally;
    const bool stored = s.store->insert(std::move(key), std::move(value), h, bytes, expires, tally);
    if (stored) ++s.inserts;
    s.evictions += tally.capacity;
    account(static_cast<std::ptrdiff_t>(s.store->size()) - static_cast<std::ptrdiff_t>(entries_before),
            static_cast<std::ptrdiff_t>(s.store->bytes()) - static_cast<std::ptrdiff_t>(bytes_before));
    if (metrics_ && tally.capacity > 0) metrics_->evicted->inc(tally.capacity);
    return stored;
  }

  // submit()'s body past intake: a hit, a join, or a new shared request. Throws only
  // std::bad_alloc and what copying a Key throws (submit() turns either into an outcome).
  template <class P, class F>
  void submit_miss_or_hit(P& pipeline, Key&& req, const SubmitOptions& options, const detail::Intake& in,
                          std::uint64_t h, Shard& s, std::shared_ptr<Waiter>& waiter, F& on_complete) {
    if constexpr (Store::optimistic) {
      const auto found = s.store->probe(req, h);
      if (optimistic_hit(s, h, found)) {
        deliver_user(on_complete, Outcome<Value>(found.value()));
        return;
      }
    }
    std::unique_lock lock(s.mu);
    Node* n = live_node(s, req, h);
    if (n != nullptr) {
      std::optional<Value> v(n->value);
      s.store->hit(n);
      ++s.hits;
      lock.unlock();
      if (metrics_) metrics_->hits->inc();
      deliver_user(on_complete, Outcome<Value>(std::move(*v)));
      return;
    }
    s.store->record(h);
    const BatchTime deadline = in.deadline;
    waiter = std::make_shared<Waiter>(deadline);
    waiter->done = detail::CacheCallback<Value>(std::forward<F>(on_complete));
    auto it = s.flights->find(detail::KeyRef<Key>{&req, h});
    if (it != s.flights->end() && deadline >= it->second->deadline) {
      Flight& f = *it->second;
      f.waiters.push_back(waiter);
      waiter->flight = &f;
      ++f.live;
      ++s.coalesced;
      lock.unlock();
      if (metrics_) metrics_->coalesced->inc();
      watch_cancel(s, waiter, options.cancel);
      return;
    }
    ++s.misses;
    if (it != s.flights->end()) {
      // Tighter deadline than the shared request: runs on its own, still cached when ok.
      lock.unlock();
      if (metrics_) metrics_->misses->inc();
      submit_alone(pipeline, std::move(req), h, options, in, std::move(waiter));
      return;
    }
    auto flight = std::make_shared<Flight>(req, h, deadline, options.priority);
    flight->arrival = in.arrival;
    flight->waiters.push_back(waiter);
    waiter->flight = flight.get();
    flight->live = 1;
    if (options.cancel.stop_possible()) flight->stop.emplace();
    flight->bind(pipeline);
    s.flights->emplace(detail::KeyRef<Key>{&flight->key, h}, flight);
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    if (metrics_) metrics_->misses->inc();
    watch_cancel(s, waiter, options.cancel);
    launch(pipeline, std::move(req), std::move(flight));
  }


  // ---- delivery ----------------------------------------------------------------------

  template <class F>
  void deliver_user(F& f, Outcome<Value>&& o) noexcept {
    if (detail::call_guarded([&] { f(std::move(o)); }, [](const char*) {})) {
      callback_exceptions_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  static Error cancelled_error() {
    return Error{Status::cancelled, RejectReason::none, "tailbatch: cancelled", {}};
  }

  // A request intake refused for its time budget (detail/request_intake.hpp).
  template <class F>
  void deliver_intake_refusal(F& f, const detail::Intake& in) noexcept {
    Outcome<Value> o(Error{in.status(), RejectReason::none, {}, {}});
    if (detail::call_guarded([&] { o = Outcome<Value>(in.error()); }, [](const char*) {})) {
      // Out of memory for the message: the status alone.
    }
    deliver_user(f, std::move(o));
  }

  // ---- cancellation ------------------------------------------------------------------

  // Registers w's cancellation after w was attached (outside the lock: a token already
  // stopped runs the callback right here, and it takes the lock).
  void watch_cancel(Shard& s, const std::shared_ptr<Waiter>& w, const CancellationToken& token) {
    if (!token.stop_possible()) return;
    w->on_cancel.emplace(token, typename Waiter::OnCancel{this, &s, w.get()});
  }

  void cancel_waiter(Shard& s, Waiter& w) noexcept {
    detail::CacheCallback<Value> done;
    std::optional<std::stop_source> stop;
    {
      std::lock_guard lock(s.mu);
      if (w.flight == nullptr || !w.done) return;  // already completed
      done = std::move(w.done);
      Flight& f = *w.flight;
      if (--f.live == 0 && f.stop) stop = f.stop;  // nobody wants it any more
    }
    // Outside the lock: request_stop runs the Pipeline's cancellation hook.
    if (stop) stop->request_stop();
    deliver_user(done, Outcome<Value>(cancelled_error()));
  }

  // ---- the shared request ------------------------------------------------------------

  template <class P>
  void launch(P& pipeline, Key&& req, std::shared_ptr<Flight> flight) noexcept {
    SubmitOptions o;
    o.deadline = flight->deadline;
    o.arrival = flight->arrival;
    o.priority = flight->priority;
    if (flight->stop) o.cancel = flight->stop->get_token();
    pipeline.submit(std::move(req), o, [this, f = std::move(flight)](Outcome<Value>&& out) mutable {
      finish(std::move(f), std::move(out));
    });
  }

  template <class P>
  static BatchTime now_of(void* pipeline) noexcept {
    return BatchTime(static_cast<P*>(pipeline)->clock().now().time_since_epoch());
  }

  template <class P>
  static void resubmit_to(ResultCache& cache, void* pipeline, Key&& req, std::shared_ptr<Flight> flight) {
    cache.launch(*static_cast<P*>(pipeline), std::move(req), std::move(flight));
  }

  // A request with a tighter deadline than the shared one: one waiter, not in the flight
  // map, but its ok outcome is cached all the same.
  template <class P>
  void submit_alone(P& pipeline, Key&& req, std::uint64_t h, const SubmitOptions& options, const detail::Intake& in,
                    std::shared_ptr<Waiter> waiter) {
    auto flight = std::make_shared<Flight>(req, h, in.deadline, options.priority);
    flight->arrival = in.arrival;
    flight->waiters.push_back(waiter);
    waiter->flight = flight.get();
    flight->live = 1;
    flight->alone = true;
    flight->bind(pipeline);
    if (options.cancel.stop_possible()) flight->stop.emplace();
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    watch_cancel(shard_of(h), waiter, options.cancel);
    launch(pipeline, std::move(req), std::move(flight));
  }

  // The shared request ended: cache an ok value, hand the outcome to every live waiter,
  // or submit again for those that still want it.
  void finish(std::shared_ptr<Flight> f, Outcome<Value>&& out) noexcept {
    Shard& s = shard_of(f->hash);
    std::vector<std::shared_ptr<Waiter>> waiters;
    std::vector<detail::CacheCallback<Value>> to_call;
    std::vector<detail::CacheCallback<Value>> too_late;
    std::shared_ptr<Flight> again;
    {
      std::lock_guard lock(s.mu);
      auto it = s.flights->find(detail::KeyRef<Key>{&f->key, f->hash});
      if (it != s.flights->end() && it->second == f) s.flights->erase(it);
      waiters = std::move(f->waiters);
      for (auto& w : waiters) w->flight = nullptr;
      // Cancelled although somebody still wanted it, or past the leader's deadline:
      // those whose own deadline has not passed get it submitted again.
      const bool retry = out.status() == Status::cancelled || out.status() == Status::deadline_exceeded;
      const BatchTime now = retry ? f->pipeline_now(f->pipeline) : BatchTime{};
      for (auto& w : waiters) {
        if (!w->done) continue;  // cancelled already
        if (retry && w->deadline > now) {
          if (!again) {
            again = make_flight_nothrow(f, w->deadline);
            if (!again) {
              to_call.push_back(std::move(w->done));
              continue;
            }
          }
          again->deadline = std::min(again->deadline, w->deadline);
          again->waiters.push_back(w);
          w->flight = again.get();
          ++again->live;
        } else if (retry) {
          too_late.push_back(std::move(w->done));
        } else {
          to_call.push_back(std::move(w->done));
        }
      }
      if (again) {
        // Not cancellable in the Pipeline: which of its waiters could cancel is not
        // tracked, and a result nobody collects still lands in the cache.
        again->stop.reset();
        bool joined = false;
        if (!f->alone) {
          // Out of memory for the map node: it runs alone (nobody joins it).
          joined = !detail::call_guarded(
              [&] { s.flights->emplace(detail::KeyRef<Key>{&again->key, again->hash}, again); }, [](const char*) {});
        }
        again->alone = !joined;
        ++s.resubmitted;
      } else {
        in_flight_.fetch_sub(1, std::memory_order_relaxed);
      }
      if (out.ok()) {
        // On failure (a copy throws, out of memory) it is not cached; the waiters still
        // get their value.
        detail::call_guarded(
            [&] {
              Value v = out.value();
              insert_locked(s, Key(f->key), std::move(v), f->hash);
            },
            [](const char*) {});
      }
    }
    if (again) resubmit_nothrow(again);
    for (auto& d : too_late) {
      deliver_user(d, Outcome<Value>(Error{Status::deadline_exceeded, RejectReason::none,
                                           "tailbatch: the deadline passed before the request could run", {}}));
    }
    for (std::size_t i = 0; i < to_call.size(); ++i) {
      if (i + 1 == to_call.size()) {
        deliver_user(to_call[i], std::move(out));
      } else {
        deliver_copy(to_call[i], out);
      }
    }
    // waiters (and their cancellation registrations) are released here, outside the lock.
  }

  void deliver_copy(detail::CacheCallback<Value>& d, const Outcome<Value>& out) noexcept {
    std::optional<Outcome<Value>> copy;
    detail::call_guarded([&] { copy.emplace(out.ok() ? Outcome<Value>(out.value()) : Outcome<Value>(out.error())); },
                         [](const char*) {});
    if (copy) {
      deliver_user(d, std::move(*copy));
    } else {
      deliver_user(d, Outcome<Value>(Error{Status::failed, RejectReason::none,
                                           "tailbatch: ResultCache: copying the result failed", {}}));
    }
  }

  // Submits `again` to its Pipeline; if even copying its key fails, its waiters hear so.
  void resubmit_nothrow(const std::shared_ptr<Flight>& again) noexcept {
    if (detail::call_guarded([&] { again->resubmit(*this, again->pipeline, Key(again->key), again); },
                             [](const char*) {})) {
      finish(again, Outcome<Value>(Error{Status::failed, RejectReason::none,
                                         "tailbatch: ResultCache: out of memory submitting again", {}}));
    }
  }

  std::shared_ptr<Flight> make_flight_nothrow(const std::shared_ptr<Flight>& from, BatchTime deadline) noexcept {
    std::shared_ptr<Flight> f;
    detail::call_guarded(
        [&] {
          f = std::make_shared<Flight>(from->key, from->hash, deadline, from->priority);
          f->arrival = from->arrival;
          f->pipeline = from->pipeline;
          f->resubmit = from->resubmit;
          f->pipeline_now = from->pipeline_now;
          f->alone = from->alone;
          f->waiters.reserve(from->waiters.capacity());
        },
        [&](const char*) { f.reset(); });
    return f;
  }

  // ---- metrics -----------------------------------------------------------------------

  void register_metrics(MetricsRegistry& r) {
    auto m = std::make_unique<Metrics>();
    const Labels& base = config_.metric_labels;
    m->hits = &r.counter("tailbatch_cache_hits_total", "Lookups answered from the cache", base);
    m->misses = &r.counter("tailbatch_cache_misses_total", "Lookups not found in the cache", base);
    m->coalesced = &r.counter("tailbatch_cache_coalesced_total",
                              "Requests that joined an identical request in flight instead of taking a batch slot",
                              base);
    m->evicted = &r.counter("tailbatch_cache_evictions_total", "Entries removed from the cache, by reason",
                            join_labels(base, {{"reason", "capacity"}}));
    m->expired = &r.counter("tailbatch_cache_evictions_total", "Entries removed from the cache, by reason",
                            join_labels(base, {{"reason", "expired"}}));
    m->gauges.push_back(r.gauge_callback("tailbatch_cache_entries", "Entries held in the cache", base,
                                         [this] { return static_cast<double>(size_approx()); }));
    m->gauges.push_back(r.gauge_callback("tailbatch_cache_bytes", "Bytes held in the cache, as counted by size_of",
                                         base, [this] { return static_cast<double>(bytes_approx()); }));
    m->gauges.push_back(r.gauge_callback(
        "tailbatch_cache_in_flight", "Shared requests queued or executing in the Pipeline", base,
        [this] { return static_cast<double>(in_flight_.load(std::memory_order_relaxed)); }));
    metrics_ = std::move(m);
  }

  // ---- state -------------------------------------------------------------------------

  Config config_;
  Hash hash_;
  C clock_;
  std::unique_ptr<Shard[]> shards_;
  std::size_t shard_count_ = 1;
  std::size_t shard_mask_ = 0;
  alignas(64) std::atomic<std::ptrdiff_t> entries_{0};
  std::atomic<std::ptrdiff_t> bytes_{0};
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::uint64_t> callback_exceptions_{0};
  struct NoValue {};
  // An engaged optional, for try_get to copy (see there); never written after construction.
  [[no_unique_address]] std::conditional_t<Store::optimistic, std::optional<Value>, NoValue> engaged_{};
  // Last: destroyed first, so that no gauge callback reads a destroyed member.
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace tailbatch
