// Ingress: where a request is queued.
//
// Submitters append to one of several separately locked submit shards and never wait for
// the batch leader. A thread claims a shard of its own on its first submit (one near the
// shard its id hashes to, while any there is free) and keeps to it, so that its requests
// stay in order. Each shard holds, per sub-queue (priority, bucket), a chain of
// fixed-capacity chunks being filled: requests never move while they wait, and whole
// chains change hands when the leader takes a shard (take()).
//
// The queue's capacity is a pool of places: a shard claims a few at a time (a block, so
// that the pool's atomic is touched once per block), and the leader gives back those of
// the requests it took off the queue (publish_dequeued()). The capacity is never exceeded;
// with several shards a submit may be refused while places other shards hold are unused
// (together less than 1/16 of the capacity).
//
// Thread-safety: push(), shard_of_this_thread(), the *_approx() observers and
// accepted_exact() may be called from any thread; take(), drain_taken(), take_entered() and
// publish_dequeued() only by the one thread leading batch formation at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <tailbatch/submit_options.hpp>
#include <tailbatch/detail/pipeline/cycle_stamp.hpp>

namespace tailbatch::detail {

// A hint to the processor that this thread is spinning.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Locks m, trying a little first: its holders keep it for tens of nanoseconds, far less
// than a sleep and wake-up in the kernel costs the waiter and the holder.
inline void lock_spinning(std::mutex& m) {
  for (int i = 0; i < 32; ++i) {
    if (m.try_lock()) return;
    cpu_relax();
  }
  m.lock();
}

// Asks for the cache line at p in a state fit for writing, ahead of the write.
inline void prefetch_for_write([[maybe_unused]] const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 1);
#endif
}

// Submit times of requests, summed (modulo 2^64) for the occupancy integrals: clock
// readings (BatchDuration ticks since the clock's epoch) and cycle-counter readings.
struct EnteredSums {
  std::uint64_t ns_sum = 0;
  std::uint64_t ns_count = 0;
  std::uint64_t cycles_sum = 0;
  std::uint64_t cycles_count = 0;

  void add(const EnteredSums& o) noexcept {
    ns_sum += o.ns_sum;
    ns_count += o.ns_count;
    cycles_sum += o.cycles_sum;
    cycles_count += o.cycles_count;
  }
};

// The sum of the ages at `now` of the requests summed in `in` (n x now - the sum of their
// submit times, exact modulo 2^64 and small), the cycle-stamped ones converted at
// ns_per_cycle from the counter reading `cycles` taken with `now`.
[[nodiscard]] inline BatchDuration entered_age_sum(const EnteredSums& in, BatchTime now, std::uint64_t cycles,
                                                   double ns_per_cycle) noexcept {
  const auto now_ticks = static_cast<std::uint64_t>(now.time_since_epoch().count());
  double age =
      static_cast<double>(std::max<std::int64_t>(0, static_cast<std::int64_t>(in.ns_count * now_ticks - in.ns_sum)));
  if (in.cycles_count > 0) {
    const auto ticks = static_cast<std::int64_t>(in.cycles_count * cycles - in.cycles_sum);
    const double ns = static_cast<double>(std::max<std::int64_t>(0, ticks)) * ns_per_cycle;
    age += std::chrono::duration<double, BatchDuration::period>(std::chrono::duration<double, std::nano>(ns)).count();
  }
  return BatchDuration(static_cast<BatchDuration::rep>(age));
}

template <class Entry>
class SubmitShards {
 public:
  static constexpr std::size_t max_shards = 64;  // one bit each in dirty_
  static constexpr std::size_t shard_probe = 8;  // shards a thread may claim: home and the next 7
  static constexpr std::size_t max_capacity = std::size_t{1} << 62;  // fits free_places_

  using Chunk = std::vector<Entry>;
  using Chain = std::vector<Chunk>;

  // What push() did.
  enum class Push : std::uint8_t { queued, queue_full, closed };

  // shards submit shards (1..max_shards; 0: automatic, 4 per hardware thread, 16 to 64),
  // sub_count sub-queues each, `capacity` places in all. Allocates; throws std::bad_alloc.
  SubmitShards(std::size_t shards, std::size_t sub_count, std::size_t capacity)
      : count_(shards != 0 ? std::min(shards, max_shards) : auto_count()),
        capacity_(std::min(capacity, max_capacity)),
        shards_(std::make_unique<Shard[]>(count_)),
        owner_(std::make_unique<std::atomic<std::uint64_t>[]>(count_)) {
    free_places_.store(static_cast<std::int64_t>(capacity_), std::memory_order_relaxed);
    // A shard claims up to this many places at once; all shards together then hold back
    // less than 1/16 of the capacity.
    block_ = std::clamp<std::size_t>(capacity / (16 * count_), 1, 32);
    for (std::size_t i = 0; i < count_; ++i) {
      shards_[i].incoming.resize(sub_count);
      shards_[i].dirty.reserve(sub_count);
    }
    // The leader may take every shard's every chain at once, and hands each an empty one.
    taken_.reserve(count_ * sub_count);
    spare_chains_.resize(count_ * sub_count);
    chunk_entries_ = std::clamp<std::size_t>(4096 / sizeof(Entry), 16, 1024);
  }

  SubmitShards(const SubmitShards&) = delete;
  SubmitShards& operator=(const SubmitShards&) = delete;

  // The number of shards. Thread-safe.
  [[nodiscard]] std::size_t count() const noexcept { return count_; }

  // The submit shard of the calling thread. On its first submit a thread claims a free
  // shard near the one its id hashes to (one of shard_probe); once those are all claimed
  // it shares that one. Either way a thread keeps to one shard. Thread-safe.
  [[nodiscard]] std::size_t shard_of_this_thread() noexcept {
    if (count_ == 1) return 0;
    const std::uint64_t key = std::hash<std::thread::id>{}(std::this_thread::get_id()) | 1;  // never 0: free
    const std::uint64_t mixed = (key ^ (key >> 29)) * 0x9E3779B97F4A7C15ULL;  // spread the bits
    const auto home = static_cast<std::size_t>(((mixed >> 32) * count_) >> 32);
    const std::size_t probes = std::min(shard_probe, count_);
    for (std::size_t j = 0, i = home; j < probes; ++j, i = i + 1 == count_ ? 0 : i + 1) {
      std::uint64_t owner = owner_[i].load(std::memory_order_relaxed);
      if (owner == key) return i;
      if (owner == 0 && owner_[i].compare_exchange_strong(owner, key, std::memory_order_relaxed)) return i;
    }
    return home;
  }

  // Queues one request in shard `shard`, sub-queue `sub`, submitted at `stamp` (a clock
  // reading or a cycle-counter stamp): under the shard's lock, unless `closing` is set
  // (closed) or no place is free (queue_full), claims a place and calls
  // make(std::vector<Entry>& chunk), which must emplace exactly one entry at the back of
  // chunk (the room is there: it never reallocates) and not throw. `closing` is read under
  // the lock: the leader, once it has seen it set, takes every shard, so no request is
  // queued after that. Throws std::bad_alloc (a new chunk) with nothing changed and make
  // not called. Thread-safe.
  template <class Make>
  Push push(std::size_t shard, std::size_t sub, const std::atomic<bool>& closing, BatchTime stamp, Make&& make) {
    Shard& s = shards_[shard];
    lock_spinning(s.mu);
    std::lock_guard lock(s.mu, std::adopt_lock);
    if (closing.load(std::memory_order_relaxed)) return Push::closed;
    if (s.slots == 0 && !claim_places(s)) return Push::queue_full;
    Chain& chain = s.incoming[sub];
    if (chain.empty() || chain.back().size() == chain.back().capacity()) new_chunk_locked(s, chain);
    --s.slots;
    Chunk& chunk = chain.back();
    make(chunk);
    if (stamp_is_cycles(stamp)) {
      s.entered.cycles_sum += stamp_cycles(stamp);
      ++s.entered.cycles_count;
    } else {
      s.entered.ns_sum += static_cast<std::uint64_t>(stamp.time_since_epoch().count());
      ++s.entered.ns_count;
    }
    // The next request's place, for the write that comes with it.
    if (chunk.size() < chunk.capacity()) prefetch_for_write(chunk.data() + chunk.size());
    s.accepted.store(s.accepted.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (s.dirty.empty()) {
      // Pairs with the leader's store to its sleeping flag and its look at any_dirty()
      // before it sleeps: either it sees this shard, or this sees it asleep. (A shard
      // already dirty is seen, or is being taken.)
      dirty_.fetch_or(std::uint64_t{1} << shard, std::memory_order_seq_cst);
    }
    if (chain.size() == 1 && chunk.size() == 1) s.dirty.push_back(static_cast<std::uint32_t>(sub));
    return Push::queued;
  }

  // Whether some shard has requests the leader has not taken. Thread-safe.
  [[nodiscard]] bool any_dirty(std::memory_order order) const noexcept { return dirty_.load(order) != 0; }

  // Requests queued since construction, over all shards. Racy. Thread-safe.
  [[nodiscard]] std::uint64_t accepted_approx() const noexcept {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < count_; ++i) n += shards_[i].accepted.load(std::memory_order_relaxed);
    return n;
  }
  // The same, each shard read under its lock. Thread-safe.
  [[nodiscard]] std::uint64_t accepted_exact() const {
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < count_; ++i) {
      std::lock_guard lock(shards_[i].mu);
      n += shards_[i].accepted.load(std::memory_order_relaxed);
    }
    return n;
  }
  // Requests queued and not yet taken off the queue (see publish_dequeued). Racy.
  // Thread-safe.
  [[nodiscard]] std::size_t queued_approx() const noexcept {
    const std::uint64_t out = dequeued_.load(std::memory_order_relaxed);
    const std::uint64_t in = accepted_approx();
    return in > out ? static_cast<std::size_t>(in - out) : 0;
  }
  // Places not in the pool (one load): the queue, plus the places shards have claimed
  // and not used yet. Racy. Thread-safe.
  [[nodiscard]] std::size_t places_in_use_approx() const noexcept {
    const std::int64_t free = std::max<std::int64_t>(0, free_places_.load(std::memory_order_relaxed));
    return static_cast<std::size_t>(static_cast<std::int64_t>(capacity_) - free);
  }

  // ---- the leader's side -------------------------------------------------------------

  // Takes the requests of every shard that has some (all: of every shard, whatever the
  // flags say, as shutdown needs). `recycle(std::vector<Chunk>& free_list, std::size_t most)`
  // refills a shard's free list with emptied chunks (at most `most`, within its
  // capacity). Never allocates. Leader only.
  template <class Recycle>
  void take(bool all, Recycle&& recycle) noexcept {
    std::uint64_t mask = dirty_.exchange(0, std::memory_order_relaxed);
    if (all) mask = count_ == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << count_) - 1;
    for (; mask != 0; mask &= mask - 1) take_shard(static_cast<std::size_t>(std::countr_zero(mask)), recycle);
  }

  // Calls f(std::size_t sub, Chain& chain) for each chain take() took (in the order taken);
  // f moves the entries it wants out of each chunk; the chains are then emptied and kept
  // for the next take. Leader only.
  template <class F>
  void drain_taken(F&& f) noexcept {
    for (auto& [s, chain] : taken_) {
      f(s, chain);
      chain.clear();
      spare_chains_.push_back(std::move(chain));  // within the reserved capacity
    }
    taken_.clear();
  }

  // The submit times of what take() took since the last call. Leader only.
  [[nodiscard]] EnteredSums take_entered() noexcept { return std::exchange(entered_, EnteredSums{}); }
  // Requests take() has taken since construction. Leader only.
  [[nodiscard]] std::uint64_t taken_total() const noexcept { return taken_total_; }

  // Records that `total` requests have been taken off the queue since construction: their
  // places go back to the pool, and queued_approx() no longer counts them. Leader only.
  void publish_dequeued(std::uint64_t total) noexcept {
    if (total == dequeued_published_) return;
    free_places_.fetch_add(static_cast<std::int64_t>(total - dequeued_published_), std::memory_order_relaxed);
    dequeued_.store(total, std::memory_order_relaxed);
    dequeued_published_ = total;
  }

 private:
  // One of the queues submitters append to. Everything in it is under its mu.
  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::vector<Chain> incoming;           // per sub-queue
    std::vector<std::uint32_t> dirty;      // sub-queues with something incoming
    std::vector<Chunk> free_chunks;        // emptied chunks, capacity kept
    std::size_t chunks_made = 0;
    std::size_t slots = 0;                 // queue places claimed, not yet used
    EnteredSums entered;                   // of the requests incoming here
    // Requests queued here since construction (written under mu, read without it).
    std::atomic<std::uint64_t> accepted{0};
  };

  static std::size_t auto_count() noexcept {
    const std::size_t hw = std::max(1U, std::thread::hardware_concurrency());
    return std::clamp<std::size_t>(4 * hw, 16, max_shards);
  }

  // Moves up to block_ places from the pool to the shard. Under shard.mu. False: none is
  // free (the queue is full, or the free places are held by other shards).
  bool claim_places(Shard& shard) noexcept {
    std::int64_t free = free_places_.load(std::memory_order_relaxed);
    while (free > 0) {
      const std::int64_t n = std::min<std::int64_t>(free, static_cast<std::int64_t>(block_));
      if (free_places_.compare_exchange_weak(free, free - n, std::memory_order_relaxed)) {
        shard.slots += static_cast<std::size_t>(n);
        return true;
      }
    }
    return false;
  }

  // Appends an empty chunk to chain: a recycled one, or a new one. Under shard.mu.
  // Throws std::bad_alloc with nothing changed.
  void new_chunk_locked(Shard& shard, Chain& chain) {
    if (chain.size() == chain.capacity()) chain.reserve(std::max<std::size_t>(4, 2 * chain.capacity()));
    if (shard.free_chunks.empty()) {
      Chunk fresh;
      fresh.reserve(chunk_entries_);
      // Room for every chunk this shard made to come back at once (the leader fills the
      // free list only up to its capacity).
      shard.free_chunks.reserve(shard.chunks_made + 1);
      ++shard.chunks_made;
      chain.push_back(std::move(fresh));
    } else {
      chain.push_back(std::move(shard.free_chunks.back()));
      shard.free_chunks.pop_back();
    }
  }

  // Takes a shard's incoming chains (whole chains of chunks change hands; no request
  // moves) and refills its free list.
  template <class Recycle>
  void take_shard(std::size_t i, Recycle& recycle) noexcept {
    Shard& shard = shards_[i];
    lock_spinning(shard.mu);
    std::lock_guard lock(shard.mu, std::adopt_lock);
    std::size_t chunks = 0;
    for (const std::uint32_t s : shard.dirty) {
      for (const Chunk& chunk : shard.incoming[s]) taken_total_ += chunk.size();
      chunks += shard.incoming[s].size();
      taken_.emplace_back(s, std::move(shard.incoming[s]));  // within the reserved capacity
      shard.incoming[s] = std::move(spare_chains_.back());  // an empty chain with capacity
      spare_chains_.pop_back();
    }
    shard.dirty.clear();
    entered_.add(std::exchange(shard.entered, EnteredSums{}));
    // As many recycled chunks as were taken, and one more, up to the free list's
    // capacity (never allocates): the lock is held for a few moves, whatever the pool
    // holds.
    recycle(shard.free_chunks, chunks + 1);
  }

  std::size_t count_;
  std::size_t capacity_;
  std::unique_ptr<Shard[]> shards_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> owner_;  // per shard: its thread's id hash, or 0
  std::size_t chunk_entries_ = 256;
  std::size_t block_ = 1;
  // Free places in the queue, not yet claimed by a shard.
  alignas(64) std::atomic<std::int64_t> free_places_{0};
  std::atomic<std::uint64_t> dirty_{0};     // bit i: shard i has something incoming
  std::atomic<std::uint64_t> dequeued_{0};  // taken off the queue; written by the leader

  // The leader's.
  alignas(64) std::vector<std::pair<std::size_t, Chain>> taken_;
  std::vector<Chain> spare_chains_;  // one per (shard, sub-queue)
  EnteredSums entered_;
  std::uint64_t taken_total_ = 0;
  std::uint64_t dequeued_published_ = 0;
};

}  // namespace tailbatch::detail
