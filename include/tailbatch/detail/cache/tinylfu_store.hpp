// One shard's entries, kept by W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly
// Efficient Cache Admission Policy", 2017; the policy of Java's Caffeine):
//
//   window     an LRU list of about 1 % of the entries: every new entry lands here, so a
//              burst of new keys is cached at once and has time to prove itself;
//   probation  the main area's entries not hit since they entered it (LRU);
//   protected  main-area entries hit again while in probation (about 80 % of the main
//              area); when it overflows its oldest go back to probation. Ordered by
//              CLOCK's second chance rather than exact LRU: a hit marks the entry, and a
//              marked entry reaching the cold end is moved back to the hot end instead of
//              leaving, so hits on the hottest entries write nothing but one flag.
//
// When the window overflows while the shard is full, its oldest entry (the candidate)
// competes with the main area's next victim (probation's oldest): the one the frequency
// sketch has seen more often stays, the other is evicted. A scan of keys each seen once
// therefore passes through the window and leaves, and never flushes the hot main area.
// Ties go to the incumbent.
//
// Hits are cheap (hit()): their sightings and list moves wait in a 32-entry buffer and are
// applied in a batch, its sketch blocks prefetched together, when it fills or before any
// change to the entries, so every admission decision sees every hit and no buffered
// entry is ever freed. A key whose four counters are saturated skips the sketch until the
// next aging (recording it would change nothing). A hit on a protected entry already
// marked since its last second chance, the hottest kind, is counted one time in four with
// weight four: the expected count is the exact one, at a quarter of the sketch traffic.
//
// Bounded by entries and by bytes (each entry's size is given by the caller). Not
// thread-safe: ResultCache holds one per shard, under the shard's lock; except that, for
// trivially copyable keys and values (optimistic_eligible), the entries' lookup table is
// an OptimisticIndex holding a copy of each key, value and expiry, which probe() reads
// without the lock (detail/cache/optimistic_index.hpp); slots_ then stays empty. The index's
// settled mark on an entry tells such readers that the entry is protected and marked,
// so that its hits may be sampled (see mark()).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>
#include <utility>

#include <tailbatch/detail/cache/frequency_sketch.hpp>
#include <tailbatch/detail/cache/optimistic_index.hpp>

namespace tailbatch::detail {

// A key by address with its precomputed (mixed) hash: maps look keys up without hashing
// them again.
template <class Key>
struct KeyRef {
  const Key* key;
  std::uint64_t hash;
};

struct KeyRefHash {
  template <class Key>
  std::size_t operator()(const KeyRef<Key>& r) const noexcept {
    return static_cast<std::size_t>(r.hash);
  }
};

template <class Key, class KeyEqual>
struct KeyRefEqual {
  KeyEqual eq;
  bool operator()(const KeyRef<Key>& a, const KeyRef<Key>& b) const {
    return a.key == b.key || (a.hash == b.hash && eq(*a.key, *b.key));
  }
};

// What one call evicted.
struct EvictionTally {
  std::uint64_t capacity = 0;  // evicted for room (including admission losers)
  std::uint64_t expired = 0;   // dropped because their time-to-live had passed
};

template <class Key, class Value, class KeyEqual, class TimePoint>
class TinyLfuStore {
 public:
  // Whether probe() exists: entries are mirrored in a lock-free readable index.
  static constexpr bool optimistic = optimistic_eligible<Key, Value, TimePoint>;

  enum class Segment : std::uint8_t { window, probation, protect };

  struct Node {
    Node(Key k, Value v, std::uint64_t h, std::size_t b, TimePoint e)
        : key(std::move(k)), value(std::move(v)), hash(h), bytes(b), expires(e) {}
    Key key;
    Value value;
    std::uint64_t hash;
    std::size_t bytes;
    TimePoint expires;
    Node* prev = nullptr;  // toward the most recently used end
    Node* next = nullptr;  // toward the least recently used end
    Segment segment = Segment::window;
    bool referenced = false;  // protected only: hit since it last reached the cold end
    // The sketch's epoch in which this key's counters were seen saturated (0: not): its
    // hits until the next aging skip the sketch's block (see FrequencySketch::record_slot).
    std::uint32_t saturated_epoch = 0;
  };

  // max_entries >= 1; max_bytes: the byte bound (SIZE_MAX: none). Allocates.
  TinyLfuStore(std::size_t max_entries, std::size_t max_bytes, KeyEqual eq)
      : eq_(std::move(eq)),
        slots_(optimistic ? 0 : 16),
        sketch_(max_entries),
        max_entries_(max_entries),
        max_bytes_(max_bytes) {
    window_cap_ = std::max<std::size_t>(1, max_entries / 100);
    const std::size_t main_cap = max_entries > window_cap_ ? max_entries - window_cap_ : 0;
    protected_cap_ = main_cap * 8 / 10;
  }

  TinyLfuStore(const TinyLfuStore&) = delete;
  TinyLfuStore& operator=(const TinyLfuStore&) = delete;
  ~TinyLfuStore() { clear(); }

  // The entry for key (hash h), or nullptr. Counts nothing. Throws what KeyEqual throws.
  [[nodiscard]] Node* find(const Key& key, std::uint64_t h) const {
    if constexpr (optimistic) return index_.handle_of(h, key, eq_);
    for (std::size_t i = home(h);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.node == nullptr) return nullptr;
      if (s.hash == h && eq_(s.node->key, key)) return s.node;
    }
  }

  // The key's value and expiry, read without the owner's lock (see OptimisticIndex::find).
  // Never blocks, writes nothing shared, never throws. Safe from any thread.
  // Found::settled: a hit would change little (see mark()), so the reader may sample it.
  auto probe(const Key& key, std::uint64_t h) const noexcept
    requires optimistic
  {
    return index_.find(h, key, eq_);
  }

  // The entry with mixed hash h, bit 0 ignored (the first one probed if several match),
  // or nullptr: for hits recorded by hash alone. Never throws.
  [[nodiscard]] Node* find_hash(std::uint64_t h) const noexcept {
    if constexpr (optimistic) return index_.handle_by_hash(h);
    for (std::size_t i = home(h);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.node == nullptr || (s.hash ^ h) <= 1) return s.node;
    }
  }

  // Starts loading h's sketch block; safe without the shard's lock (see
  // FrequencySketch::prefetch), so that the load overlaps taking the lock and the probe.
  void prefetch_frequency(std::uint64_t h) const noexcept { sketch_.prefetch(h); }

  // Counts one lookup of the key in the frequency sketch.
  void record(std::uint64_t h) noexcept { sketch_.record(h); }
  // The sketch's estimate for h, pending hits included.
  [[nodiscard]] unsigned frequency(std::uint64_t h) noexcept {
    drain_hits();
    return sketch_.estimate(h);
  }

  // A hit on n: buffered, not applied. The sighting and the move toward the front of n's
  // segment (touch) happen in a batch when the buffer fills or before the next change to
  // the entries (insert, erase, clear, erase_expired), so that a hit itself writes one
  // pointer and the batch overlaps its sketch loads. Nothing is dropped, and no node is
  // freed while it is buffered: every path that frees one drains first.
  // A key whose counters are all saturated in the current aging epoch is counted at once
  // (its block would not change) and touched at once.
  // weight > 1: a sampled hit standing for that many (see ResultCache's read path).
  void hit(Node* n, unsigned weight = 1) noexcept {
    if (weight > 1) {
      if (n->saturated_epoch == sketch_.epoch()) {
        sketch_.record_saturated(weight);
        touch(n);
        return;
      }
      weights_[pending_] = static_cast<std::uint8_t>(std::min(weight, 255u));
      hits_[pending_++] = n;
      if (pending_ == hits_.size()) drain_hits();
      return;
    }
    if (n->saturated_epoch == sketch_.epoch()) {
      sketch_.record_saturated();
      if (n->segment == Segment::protect) {
        mark(n);  // touch's protected case, inline
      } else {
        touch(n);
      }
      return;
    }
    if (n->segment == Segment::protect && n->referenced) {
      // Hit again since its last second chance: the hottest entries. One such hit in
      // hit_sampling is counted, with that weight (the expected count is unchanged); the
      // rest only keep the mark, and touch the sketch not at all.
      if (++sampled_ % hit_sampling != 0) return;  // marked already
      weight = hit_sampling;
    }
    weights_[pending_] = static_cast<std::uint8_t>(weight);
    hits_[pending_++] = n;
    if (pending_ == hits_.size()) drain_hits();
  }

  // Applies the buffered hits in arrival order (see hit). Never throws.
  void drain_hits() noexcept {
    const std::size_t n = pending_;
    if (n == 0) return;
    pending_ = 0;
    std::array<std::uint64_t, std::tuple_size_v<decltype(hits_)>> slot;
    for (std::size_t i = 0; i < n; ++i) {
      slot[i] = FrequencySketch::slot_of(hits_[i]->hash);
      sketch_.prefetch_slot(slot[i]);
    }
    for (std::size_t i = 0; i < n; ++i) {
      Node* x = hits_[i];
      if (sketch_.record_slot(slot[i], weights_[i])) x->saturated_epoch = sketch_.epoch();
      touch(x);
    }
  }

  // A hit on n: moves it toward the front of its segment (probation promotes to protected).
  void touch(Node* n) noexcept {
    switch (n->segment) {
      case Segment::window:
        window_.move_to_front(n);
        break;
      case Segment::probation:
        probation_.unlink(n);
        n->segment = Segment::protect;
        protected_.push_front(n);
        while (protected_.count > protected_cap_ && protected_.tail != nullptr) {
          Node* d = protected_.tail;
          if (d->referenced) {  // a second chance: hit since it was last here
            d->referenced = false;
            settle(d, false);
            protected_.move_to_front(d);
            continue;
          }
          protected_.unlink(d);
          d->segment = Segment::probation;
          probation_.push_front(d);
        }
        break;
      case Segment::protect:
        // Marked, not moved: the list is reordered only when its cold end is reached
        // (CLOCK's second chance), which spares a hit the writes to two neighbours.
        mark(n);
        break;
    }
  }

  // Sets n's second-chance mark, writing only when it was clear: a hit on a marked entry
  // then leaves its cache line clean, shared by every core that reads it. A marked
  // protected entry is what the index calls settled: until its mark is taken (second
  // chance) or it leaves protected, a hit only adds to its count.
  void mark(Node* n) noexcept {
    if (!n->referenced) {
      n->referenced = true;
      settle(n, true);
    }
  }

  // Removes n. Never throws (KeyEqual must not).
  void erase(Node* n) noexcept {
    drain_hits();
    remove(n);
  }

  // Inserts (key, value) or replaces the value of an existing entry, then evicts until
  // within bounds. Returns false when the entry is not in the store afterwards (larger
  // than the byte bound alone, or evicted at once). Strong guarantee when it throws
  // (std::bad_alloc, or what Key/Value moves or KeyEqual throw): nothing changed.
  bool insert(Key&& key, Value&& value, std::uint64_t h, std::size_t bytes, TimePoint expires,
              EvictionTally& tally) {
    drain_hits();
    if (Node* n = find(key, h)) {
      if (bytes > max_bytes_) {
        erase(n);
        ++tally.capacity;
        return false;
      }
      n->value = std::move(value);
      bytes_ = bytes_ - n->bytes + bytes;
      n->bytes = bytes;
      n->expires = expires;
      if constexpr (optimistic) index_.put(h, n->key, n->value, expires, eq_);
      touch(n);
      return evict(n, tally);
    }
    if (bytes > max_bytes_) return false;
    // Strong: nothing changes if these throw.
    if constexpr (optimistic) {
      index_.reserve(count_ + 1);
    } else if (2 * (count_ + 1) > slots_.size()) {
      grow();
    }
    Node* n = new Node(std::move(key), std::move(value), h, bytes, expires);
    if constexpr (optimistic) {
      index_.put(h, n->key, n->value, expires, eq_, n);  // the only table
    } else {
      place(Slot{h, n});
    }
    ++count_;
    n->segment = Segment::window;
    window_.push_front(n);
    bytes_ += bytes;
    // The window's overflow moves to the main area: freely while there is room, else
    // through the frequency filter against the main area's victim.
    while (window_.count > window_cap_) {
      Node* candidate = window_.tail;
      window_.unlink(candidate);
      if (!over_limits()) {
        candidate->segment = Segment::probation;
        probation_.push_front(candidate);
        continue;
      }
      Node* victim = main_victim();
      if (victim != nullptr && sketch_.estimate(candidate->hash) > sketch_.estimate(victim->hash)) {
        remove(victim);
        candidate->segment = Segment::probation;
        probation_.push_front(candidate);
      } else {
        bytes_ -= candidate->bytes;
        erase_node(candidate);
      }
      ++tally.capacity;
    }
    return evict(n, tally);
  }

  // Drops every entry whose expiry is at or before now. Returns how many. Never throws.
  std::size_t erase_expired(TimePoint now) noexcept {
    drain_hits();
    std::size_t n = 0;
    for (List* l : {&window_, &probation_, &protected_}) {
      for (Node* x = l->head; x != nullptr;) {
        Node* next = x->next;
        if (x->expires <= now) {
          remove(x);
          ++n;
        }
        x = next;
      }
    }
    return n;
  }

  // Drops every entry and the frequency history. Never throws.
  void clear() noexcept {
    pending_ = 0;
    if constexpr (optimistic) {
      index_.clear();
      for (List* l : {&window_, &probation_, &protected_}) {
        for (Node* x = l->head; x != nullptr;) {
          Node* next = x->next;
          delete x;
          x = next;
        }
      }
    } else {
      for (Slot& s : slots_) {
        delete s.node;
        s = Slot{};
      }
    }
    window_ = {};
    probation_ = {};
    protected_ = {};
    count_ = 0;
    bytes_ = 0;
    sketch_.clear();
  }

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t max_entries() const noexcept { return max_entries_; }
  [[nodiscard]] std::size_t max_bytes() const noexcept { return max_bytes_; }
  [[nodiscard]] std::size_t window_capacity() const noexcept { return window_cap_; }
  [[nodiscard]] Segment segment_of(const Node* n) const noexcept { return n->segment; }

 private:
  struct List {
    Node* head = nullptr;
    Node* tail = nullptr;
    std::size_t count = 0;

    void push_front(Node* n) noexcept {
      n->prev = nullptr;
      n->next = head;
      if (head != nullptr) head->prev = n;
      head = n;
      if (tail == nullptr) tail = n;
      ++count;
    }
    void unlink(Node* n) noexcept {
      if (n->prev != nullptr) n->prev->next = n->next; else head = n->next;
      if (n->next != nullptr) n->next->prev = n->prev; else tail = n->prev;
      n->prev = n->next = nullptr;
      --count;
    }
    void move_to_front(Node* n) noexcept {
      if (head == n) return;
      unlink(n);
      push_front(n);
    }
  };

  List& list_of(Segment s) noexcept {
    switch (s) {
      case Segment::window: return window_;
      case Segment::probation: return probation_;
      case Segment::protect: return protected_;
    }
    return window_;
  }

  [[nodiscard]] bool over_limits() const noexcept { return count_ > max_entries_ || bytes_ > max_bytes_; }

  [[nodiscard]] Node* main_victim() const noexcept {
    if (probation_.tail != nullptr) return probation_.tail;
    return protected_.tail;
  }

  void settle([[maybe_unused]] Node* n, [[maybe_unused]] bool on) noexcept {
    if constexpr (optimistic) index_.settle(n->hash, n->key, eq_, on);
  }

  // Unlinks n from its list and frees it.
  void remove(Node* n) noexcept {
    list_of(n->segment).unlink(n);
    bytes_ -= n->bytes;
    erase_node(n);
  }

  // Frees n (already unlinked, its bytes already taken off). Its slot is found by
  // identity, and the probe run behind it shifted back (no tombstones): no user code runs.
  void erase_node(Node* n) noexcept {
    if constexpr (optimistic) {
      index_.erase(n->hash, n->key, eq_);  // the only table
      --count_;
      delete n;
      return;
    }
    std::size_t i = home(n->hash);
    while (slots_[i].node != n) i = (i + 1) & mask();
    for (std::size_t j = (i + 1) & mask(); slots_[j].node != nullptr; j = (j + 1) & mask()) {
      const std::size_t k = home(slots_[j].hash);
      // Move j back into the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --count_;
    delete n;
  }

  // The open-addressing table: linear probing, at most half full, keyed by the mixed
  // hash (its top bits pick the home slot: the low ones picked the shard).
  struct Slot {
    std::uint64_t hash = 0;
    Node* node = nullptr;
  };
  [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }
  [[nodiscard]] std::size_t home(std::uint64_t h) const noexcept { return static_cast<std::size_t>(h >> shift_); }
  void place(Slot s) noexcept {
    std::size_t i = home(s.hash);
    while (slots_[i].node != nullptr) i = (i + 1) & mask();
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> bigger(slots_.size() * 2);  // may throw: nothing changed yet
    bigger.swap(slots_);
    --shift_;
    for (const Slot& s : bigger) {
      if (s.node != nullptr) place(s);
    }
  }

  // Evicts main-area victims, then window entries, until within bounds. Returns whether
  // `kept` survived.
  bool evict(const Node* kept, EvictionTally& tally) noexcept {
    bool survived = true;
    while (over_limits()) {
      Node* v = main_victim();
      if (v == nullptr) v = window_.tail;
      if (v == nullptr) break;
      if (v == kept) survived = false;
      remove(v);
      ++tally.capacity;
    }
    return survived;
  }

  // What a hit reads and writes first, together.
  KeyEqual eq_;
  std::vector<Slot> slots_;
  unsigned shift_ = 64 - 4;  // 16 slots
  unsigned sampled_ = 0;     // hits on marked protected entries, for hit_sampling
  std::size_t pending_ = 0;  // hits buffered in hits_
  FrequencySketch sketch_;
  std::size_t count_ = 0;
  List window_;
  List probation_;
  List protected_;
  std::size_t max_entries_;
  std::size_t max_bytes_;
  std::size_t window_cap_ = 1;
  std::size_t protected_cap_ = 0;
  std::size_t bytes_ = 0;
  // Hits not yet applied (see hit()), with the sightings each stands for.
  std::array<Node*, 32> hits_{};
  std::array<std::uint8_t, 32> weights_{};
  static constexpr unsigned hit_sampling = 4;
  struct NoIndex {};
  // The lock-free readable copy of the entries (optimistic types only).
  // For them it is the only table: slots_ stays empty.
  [[no_unique_address]] std::conditional_t<optimistic, OptimisticIndex<Key, Value, TimePoint, Node*>, NoIndex> index_;
};

}  // namespace tailbatch::detail
