// ResultCache's lock-free read path: a copy of one shard's entries that readers probe
// without the shard's lock and without writing to any shared cache line, and the striped
// buffers in which those readers leave their hits for the lock holder.
//
// OptimisticIndex is a sequence lock (seqlock) around an open-addressing table whose
// slots hold the key, the value and the expiry inline, as arrays of std::atomic words.
// A writer (the shard's lock holder) makes the sequence odd, changes slots, and makes it
// even again; a reader reads the sequence, probes, copies what it found into locals, and
// reads the sequence again: a changed sequence means the copy may be torn, and the reader
// tries again or takes the locked path. Every word a reader touches while a writer may
// change it is an atomic (acquire loads against release stores), so there is no data race
// for the language or for ThreadSanitizer, and a torn copy is never used: the key is
// compared (KeyEqual) only after the sequence was confirmed.
//
// That is why only trivially copyable keys and values, 64 bytes together at most, use it
// (optimistic_eligible): they can be copied word by word and rebuilt with bit_cast. Other
// types keep the locked path. Copies in the table are the reason for the size limit: each
// entry is stored twice (once as a node for the eviction policy, once here).
//
// Tables only grow (at most three quarters full, doubling), and a grown-out table is kept
// until the index is destroyed, because a reader may still be probing it: no reclamation
// scheme is needed, at the cost of the old tables' memory (less than the current table's).
// A table's contents are stale once replaced, which the sequence check catches. The owner
// keeps a handle per entry (its node) in an array beside the slots, which readers never
// read. Slots are aligned so that none straddles two cache lines.
//
// Not thread-safe on the writer side (callers hold the shard's lock); find() is safe from
// any thread at any time.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <functional>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

namespace tailbatch::detail {

// Whether Key, Value and the expiry (TimePoint) can be read without the lock.
template <class Key, class Value, class TimePoint>
inline constexpr bool optimistic_eligible =
    std::is_trivially_copyable_v<Key> && std::is_trivially_copyable_v<Value> &&
    std::is_trivially_copyable_v<TimePoint> && sizeof(Key) + sizeof(Value) <= 64 && sizeof(TimePoint) <= 16;

// A trivially copyable T kept as relaxed/acquire-readable 64-bit words.
template <class T>
class AtomicWords {
 public:
  static constexpr std::size_t words = (sizeof(T) + 7) / 8;
  using Raw = std::array<std::uint64_t, words>;

  static Raw raw_of(const T& v) noexcept {
    Raw r{};
    std::memcpy(r.data(), &v, sizeof(T));
    return r;
  }
  static T make(const Raw& r) noexcept {
    std::array<unsigned char, sizeof(T)> bytes;
    std::memcpy(bytes.data(), r.data(), sizeof(T));
    return std::bit_cast<T>(bytes);
  }

  void store(const Raw& r) noexcept {
    for (std::size_t i = 0; i < words; ++i) w_[i].store(r[i], std::memory_order_release);
  }
  [[nodiscard]] Raw load() const noexcept {
    Raw r;
    for (std::size_t i = 0; i < words; ++i) r[i] = w_[i].load(std::memory_order_acquire);
    return r;
  }

 private:
  std::array<std::atomic<std::uint64_t>, words> w_{};
};

// What a lock-free lookup found. hit: a consistent copy of the entry; absent: the key was
// not there at one moment during the call; busy: writers kept changing the shard (take
// the lock).
enum class Probe : std::uint8_t { hit, absent, busy };

// Handle: what the owner keeps per entry beside the copy (its node), never read by
// readers; a trivially copyable type of at most 8 bytes (a pointer).
template <class Key, class Value, class TimePoint, class Handle = void*>
class OptimisticIndex {
  static_assert(std::is_trivially_copyable_v<Handle> && sizeof(Handle) <= 8);
  static_assert(optimistic_eligible<Key, Value, TimePoint>, "only trivially copyable keys and values, 64 bytes at most");

 public:

  // Allocates a 16-slot table; throws std::bad_alloc.
  OptimisticIndex() { table_.store(adopt(make_table(4)), std::memory_order_relaxed); }
  OptimisticIndex(const OptimisticIndex&) = delete;
  OptimisticIndex& operator=(const OptimisticIndex&) = delete;
  ~OptimisticIndex() = default;

  // ---- readers: any thread, no lock ---------------------------------------------------

  // What find() returns: on a hit, a consistent copy of the entry, as words (value()
  // rebuilds the Value), its expiry and its settled mark (see settle()).
  struct Found {
    Probe probe = Probe::busy;
    bool settled = false;
    typename AtomicWords<Value>::Raw words{};
    TimePoint expires{};
    [[nodiscard]] Value value() const noexcept { return AtomicWords<Value>::make(words); }
  };

  // Looks key (mixed hash h) up (see Probe). Never blocks, writes nothing shared. eq must
  // not throw.
  template <class KeyEqual>
  Found find(std::uint64_t h, const Key& key, const KeyEqual& eq) const noexcept {
    Found f;
    const std::uint64_t tag = tag_of(h);
    for (int attempt = 0; attempt < 4; ++attempt) {
      const std::uint64_t s0 = seq_.load(std::memory_order_acquire);
      if ((s0 & 1) != 0) continue;
      const Table* t = table_.load(std::memory_order_acquire);
      std::size_t i = home(*t, h);
      bool torn = false;
      for (std::size_t steps = 0; steps <= t->mask; ++steps, i = (i + 1) & t->mask) {
        const Slot& s = t->slots[i];
        const std::uint64_t st = s.tag.load(std::memory_order_acquire);
        if (st == 0) {
          if (seq_.load(std::memory_order_relaxed) == s0) {
            f.probe = Probe::absent;
            return f;
          }
          torn = true;
          break;
        }
        if ((st & ~settled_bit) != tag) continue;
        const auto k = s.key.load();
        const auto v = s.value.load();
        const auto e = s.expires.load();
        if (seq_.load(std::memory_order_relaxed) != s0) {
          torn = true;
          break;
        }
        // Confirmed untorn: only now is the copy turned back into a Key and compared.
        if (!eq(KeyWords::make(k), key)) continue;
        f.probe = Probe::hit;
        f.settled = (st & settled_bit) != 0;
        f.words = v;
        f.expires = TimeWords::make(e);
        return f;
      }
      if (!torn) return f;  // busy: probed every slot, which only a writer in between can cause
    }
    return f;  // busy
  }

  // ---- writers: under the owner's lock ------------------------------------------------

  // Makes room for `count` entries without a reallocation in put(). Strong guarantee:
  // throws std::bad_alloc and changes nothing.
  void reserve(std::size_t count) {
    const Table* t = table_.load(std::memory_order_relaxed);
    // At most three quarters full: linear probing stays short, and the table (the
    // shard's only one) stays small enough to keep in cache.
    if (4 * count <= 3 * (t->mask + 1)) return;
    unsigned bits = t->bits;
    while (4 * count > 3 * (std::size_t{1} << bits)) ++bits;
    retired_.reserve(retired_.size() + 1);
    std::unique_ptr<Table> bigger = make_table(bits);
    for (std::size_t i = 0; i <= t->mask; ++i) {
      const Slot& s = t->slots[i];
      const std::uint64_t st = s.tag.load(std::memory_order_relaxed);
      if (st != 0) copy_slot(*bigger, free_slot(*bigger, st), *t, i);
    }
    begin();
    table_.store(adopt(std::move(bigger)), std::memory_order_release);
    end();
  }

  // The handle stored with key (mixed hash h), or Handle{} when absent. Never throws.
  template <class KeyEqual>
  [[nodiscard]] Handle handle_of(std::uint64_t h, const Key& key, const KeyEqual& eq) const noexcept {
    const Table& t = *table_.load(std::memory_order_relaxed);
    const std::size_t i = locate(t, h, key, eq);
    return i == npos ? Handle{} : t.handles[i];
  }
  // The handle of the first entry probed whose mixed hash matches h (its two low bits
  // ignored), or Handle{}. Never throws.
  [[nodiscard]] Handle handle_by_hash(std::uint64_t h) const noexcept {
    const Table& t = *table_.load(std::memory_order_relaxed);
    for (std::size_t i = home(t, h);; i = (i + 1) & t.mask) {
      const std::uint64_t st = t.slots[i].tag.load(std::memory_order_relaxed);
      if (st == 0) return Handle{};
      if ((st & ~settled_bit) == tag_of(h)) return t.handles[i];
    }
  }

  // Inserts key (mixed hash h) with handle, or replaces its value and expiry (the handle
  // stays). Room must have been reserved for a new key. Never throws (eq must not).
  template <class KeyEqual>
  void put(std::uint64_t h, const Key& key, const Value& value, TimePoint expires, const KeyEqual& eq,
           Handle handle = Handle{}) noexcept {
    Table& t = *table_.load(std::memory_order_relaxed);
    begin();
    std::size_t i = locate(t, h, key, eq);
    if (i == npos) {
      i = free_slot(t, tag_of(h));
      t.handles[i] = handle;
      t.slots[i].key.store(KeyWords::raw_of(key));
      t.slots[i].tag.store(tag_of(h), std::memory_order_release);
    }
    t.slots[i].value.store(ValueWords::raw_of(value));
    t.slots[i].expires.store(TimeWords::raw_of(expires));
    end();
  }

  // Removes key (mixed hash h) if present; the probe run behind it is shifted back (no
  // tombstones). Never throws (eq must not).
  template <class KeyEqual>
  void erase(std::uint64_t h, const Key& key, const KeyEqual& eq) noexcept {
    Table& t = *table_.load(std::memory_order_relaxed);
    std::size_t i = locate(t, h, key, eq);
    if (i == npos) return;
    begin();
    for (std::size_t j = (i + 1) & t.mask;; j = (j + 1) & t.mask) {
      const std::uint64_t jt = t.slots[j].tag.load(std::memory_order_relaxed);
      if (jt == 0) break;
      const std::size_t k = home(t, jt);
      // Move j back into the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (!stays) {
        copy_slot(t, i, t, j);
        i = j;
      }
    }
    t.slots[i].tag.store(0, std::memory_order_release);
    end();
  }

  // Sets or clears key's settled mark, a hint to readers that needs no write section
  // (either value is a valid reading): the owner's policy gains little from most hits on
  // a settled entry, so readers sample them. No-op when key is absent. Never throws.
  template <class KeyEqual>
  void settle(std::uint64_t h, const Key& key, const KeyEqual& eq, bool on) noexcept {
    Table& t = *table_.load(std::memory_order_relaxed);
    const std::size_t i = locate(t, h, key, eq);
    if (i == npos) return;
    const std::uint64_t st = t.slots[i].tag.load(std::memory_order_relaxed);
    const std::uint64_t want = on ? (st | settled_bit) : (st & ~settled_bit);
    if (want != st) t.slots[i].tag.store(want, std::memory_order_relaxed);
  }

  // Removes every entry (the table keeps its size). Never throws.
  void clear() noexcept {
    Table& t = *table_.load(std::memory_order_relaxed);
    begin();
    for (std::size_t i = 0; i <= t.mask; ++i) t.slots[i].tag.store(0, std::memory_order_release);
    end();
  }

 private:
  using KeyWords = AtomicWords<Key>;
  using ValueWords = AtomicWords<Value>;
  using TimeWords = AtomicWords<TimePoint>;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  static constexpr std::uint64_t settled_bit = 2;

  // What a reader reads, aligned to a power of two so that no slot straddles two cache
  // lines: a probe costs one line.
  static constexpr std::size_t slot_words = 1 + KeyWords::words + ValueWords::words + TimeWords::words;
  struct alignas(std::min<std::size_t>(64, std::bit_ceil(slot_words * 8))) Slot {
    // The mixed hash with bit 0 set and bit 1 the settled mark; 0: empty.
    std::atomic<std::uint64_t> tag{0};
    KeyWords key;
    ValueWords value;
    TimeWords expires;
  };
  struct Table {
    std::size_t mask = 0;
    unsigned bits = 0;
    std::unique_ptr<Slot[]> slots;
    std::unique_ptr<Handle[]> handles;  // beside the slots: the owner's only
  };

  // The low bits picked the shard, so the home slot comes from the top ones; the tag's
  // two low bits are the marks, which does not change them (KeyEqual decides anyway).
  static std::uint64_t tag_of(std::uint64_t h) noexcept { return (h & ~std::uint64_t{3}) | 1u; }
  static std::size_t home(const Table& t, std::uint64_t h) noexcept {
    return static_cast<std::size_t>(h >> (64 - t.bits));
  }

  static std::unique_ptr<Table> make_table(unsigned bits) {
    auto t = std::make_unique<Table>();
    t->bits = bits;
    t->mask = (std::size_t{1} << bits) - 1;
    t->slots = std::make_unique<Slot[]>(t->mask + 1);
    t->handles = std::make_unique<Handle[]>(t->mask + 1);
    return t;
  }
  // Keeps t alive as long as the index (readers may hold it), returns it.
  Table* adopt(std::unique_ptr<Table> t) {
    retired_.push_back(std::move(t));  // capacity reserved by the caller after the first
    return retired_.back().get();
  }

  template <class KeyEqual>
  std::size_t locate(const Table& t, std::uint64_t h, const Key& key, const KeyEqual& eq) const noexcept {
    const std::uint64_t tag = tag_of(h);
    for (std::size_t i = home(t, h);; i = (i + 1) & t.mask) {
      const std::uint64_t st = t.slots[i].tag.load(std::memory_order_relaxed);
      if (st == 0) return npos;
      if ((st & ~settled_bit) == tag && eq(KeyWords::make(t.slots[i].key.load()), key)) return i;
    }
  }
  static std::size_t free_slot(const Table& t, std::uint64_t tag) noexcept {
    std::size_t i = home(t, tag);
    while (t.slots[i].tag.load(std::memory_order_relaxed) != 0) i = (i + 1) & t.mask;
    return i;
  }
  static void copy_slot(Table& t, std::size_t i, const Table& ft, std::size_t j) noexcept {
    Slot& s = t.slots[i];
    const Slot& from = ft.slots[j];
    s.key.store(from.key.load());
    s.value.store(from.value.load());
    s.expires.store(from.expires.load());
    t.handles[i] = ft.handles[j];
    s.tag.store(from.tag.load(std::memory_order_relaxed), std::memory_order_release);
  }

  // A write section: odd while slots change. The data stores are releases, so a reader
  // whose acquire load sees one of them also sees the odd sequence on its second read.
  void begin() noexcept { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  void end() noexcept { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  // Read by every reader, written once per write section: on its own line, away from
  // the owner's other fields.
  alignas(64) std::atomic<std::uint64_t> seq_{0};
  std::atomic<Table*> table_{nullptr};
  // Every table ever used, the current one last. Owner only.
  alignas(64) std::vector<std::unique_ptr<Table>> retired_;
};

// The calling thread, as a nonzero 64-bit tag that differs between live threads.
template <class Id>
[[nodiscard]] std::uint64_t thread_bits(const Id& id) noexcept {
  if constexpr (sizeof(Id) == sizeof(std::uint64_t) && std::is_trivially_copyable_v<Id>) {
    return std::bit_cast<std::uint64_t>(id);  // libstdc++, libc++: the pthread_t, no hashing
  } else {
    return static_cast<std::uint64_t>(std::hash<Id>{}(id));
  }
}
[[nodiscard]] inline std::uint64_t thread_tag() noexcept {
  const std::uint64_t t = thread_bits(std::this_thread::get_id());
  return t == 0 ? 1 : t;
}

// One thread's (usually) share of a shard's hit bookkeeping, alone on its cache line.
// The thread whose id claimed the stripe first counts its hits with a plain load and
// store; any other thread mapped here counts with an atomic add (exact either way).
// Sampled hits' hashes wait in `hashes` for the shard's lock holder; the buffer is lossy
// (a race between two appenders, or a drain racing an append, may lose or repeat one),
// which only blurs the admission statistics.
struct alignas(64) HitStripe {
  static constexpr std::uint32_t capacity = 4;
  std::atomic<std::uint64_t> owner{0};  // 0: unclaimed
  std::atomic<std::uint64_t> owner_hits{0};
  std::atomic<std::uint64_t> shared_hits{0};
  std::atomic<std::uint32_t> pending{0};
  std::array<std::atomic<std::uint64_t>, capacity> hashes{};

  // Counts one hit by the thread tagged `me` (never 0). Returns the stripe's count after
  // it, to sample from. Never blocks.
  std::uint64_t count(std::uint64_t me) noexcept {
    std::uint64_t o = owner.load(std::memory_order_relaxed);
    if (o == 0 && owner.compare_exchange_strong(o, me, std::memory_order_relaxed)) o = me;
    if (o == me) {
      const std::uint64_t n = owner_hits.load(std::memory_order_relaxed) + 1;
      owner_hits.store(n, std::memory_order_relaxed);
      return n;
    }
    return shared_hits.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  // Adds h to the buffer. Returns true when the buffer is full (drain or drop it).
  bool push(std::uint64_t h) noexcept {
    const std::uint32_t p = pending.load(std::memory_order_relaxed);
    if (p < capacity) {
      hashes[p].store(h, std::memory_order_relaxed);
      pending.store(p + 1, std::memory_order_release);
      return p + 1 == capacity;
    }
    return true;
  }
  [[nodiscard]] std::uint64_t hits() const noexcept {
    return owner_hits.load(std::memory_order_relaxed) + shared_hits.load(std::memory_order_relaxed);
  }
};
static_assert(sizeof(HitStripe) == 64);

}  // namespace tailbatch::detail
