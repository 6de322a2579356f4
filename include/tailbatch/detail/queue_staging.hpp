// The Pipeline's staged queue: where queued requests wait while batches form.
//
// Only the thread leading batch formation touches it (no locking inside). Requests live in
// a slot store at fixed indices; each (priority, bucket) pair has its own sub-queue of
// small keys kept in the policy's order (arrival, or earliest deadline), so that EDF
// reordering moves 24-byte keys, never requests. A removed request leaves a tombstone key
// that the sub-queue skips and compacts away.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <tailbatch/batch_window.hpp>

namespace tailbatch::detail {

template <class Entry>
class StagedQueue {
 public:
  static constexpr std::uint32_t tombstone = 0xffffffffu;

  struct Key {
    BatchTime order_time;  // the deadline under earliest_deadline order; unused under fifo
    std::uint64_t seq;     // arrival order, unique
    std::uint32_t slot;    // index into the slot store, or tombstone
  };

  struct SubQueue {
    std::vector<Key> keys;
    std::size_t head = 0;         // keys before head are all tombstones
    std::size_t sorted_end = 0;   // keys from here on arrived since the last settle()
    std::size_t live = 0;
  };

  StagedQueue(std::size_t lanes, std::size_t buckets, BatchOrder order)
      : lanes_(lanes), buckets_(buckets), order_(order), subs_(lanes * buckets), bucket_live_(buckets, 0) {}

  [[nodiscard]] std::size_t size() const noexcept { return live_; }
  [[nodiscard]] std::size_t lanes() const noexcept { return lanes_; }
  [[nodiscard]] std::size_t buckets() const noexcept { return buckets_; }
  [[nodiscard]] std::size_t live_in_bucket(std::size_t bucket) const noexcept { return bucket_live_[bucket]; }
  [[nodiscard]] std::size_t sub_index(std::size_t lane, std::size_t bucket) const noexcept {
    return bucket * lanes_ + lane;
  }
  [[nodiscard]] SubQueue& sub(std::size_t index) noexcept { return subs_[index]; }
  [[nodiscard]] Entry& entry(std::uint32_t slot) noexcept { return *slots_[slot]; }

  // Stages e. Allocates only while the store grows past its high-water mark.
  // Exception-safe: everything that allocates happens before e is moved from, so if
  // this throws (std::bad_alloc) e is intact and nothing changed.
  void push(Entry&& e, std::size_t lane, std::size_t bucket, BatchTime order_time, std::uint64_t seq) {
    SubQueue& q = subs_[sub_index(lane, bucket)];
    if (q.keys.size() == q.keys.capacity()) q.keys.reserve(std::max<std::size_t>(16, 2 * q.keys.capacity()));
    std::uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      slots_[slot].emplace(std::move(e));
      free_.pop_back();
    } else {
      if (slots_.size() == slots_.capacity()) slots_.reserve(std::max<std::size_t>(64, 2 * slots_.capacity()));
      // take() pushes onto free_ without allocating: room for every slot.
      if (free_.capacity() < slots_.capacity()) free_.reserve(slots_.capacity());
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back(std::in_place, std::move(e));
    }
    q.keys.push_back(Key{order_time, seq, slot});
    ++q.live;
    ++bucket_live_[bucket];
    ++live_;
    if (order_ == BatchOrder::earliest_deadline) dirty_ = true;
  }

  // Restores the order after pushes (earliest_deadline only: fifo is ordered by arrival).
  // Allocates only while a scratch buffer grows.
  void settle() {
    if (!dirty_) return;
    dirty_ = false;
    const auto less = [](const Key& a, const Key& b) {
      return a.order_time != b.order_time ? a.order_time < b.order_time : a.seq < b.seq;
    };
    for (SubQueue& q : subs_) {
      q.sorted_end = std::max(q.sorted_end, q.head);
      if (q.sorted_end >= q.keys.size()) continue;
      const auto mid = q.keys.begin() + static_cast<std::ptrdiff_t>(q.sorted_end);
      std::sort(mid, q.keys.end(), less);
      if (q.sorted_end > q.head) {
        scratch_.clear();
        std::merge(q.keys.begin() + static_cast<std::ptrdiff_t>(q.head), mid, mid, q.keys.end(),
                   std::back_inserter(scratch_), less);
        q.keys.swap(scratch_);
        q.head = 0;
      }
      q.sorted_end = q.keys.size();
    }
  }

  // Moves the entry at key position pos of sub-queue s out and leaves a tombstone.
  [[nodiscard]] Entry take(std::size_t s, std::size_t pos) {
    SubQueue& q = subs_[s];
    Key& k = q.keys[pos];
    std::optional<Entry>& cell = slots_[k.slot];
    Entry out(std::move(*cell));
    cell.reset();
    free_.push_back(k.slot);
    k.slot = tombstone;
    --q.live;
    --bucket_live_[s / lanes_];
    --live_;
    return out;
  }

  // Drops the tombstones at the front of sub-queue s, and the dead prefix once it is long.
  void compact(std::size_t s) noexcept {
    SubQueue& q = subs_[s];
    while (q.head < q.keys.size() && q.keys[q.head].slot == tombstone) ++q.head;
    if (q.head == q.keys.size()) {
      q.keys.clear();
      q.head = 0;
      q.sorted_end = 0;
    } else if (q.head >= 256 && q.head * 2 >= q.keys.size()) {
      q.keys.erase(q.keys.begin(), q.keys.begin() + static_cast<std::ptrdiff_t>(q.head));
      q.sorted_end -= std::min(q.sorted_end, q.head);
      q.head = 0;
    }
  }

 private:
  std::size_t lanes_;
  std::size_t buckets_;
  BatchOrder order_;
  std::vector<SubQueue> subs_;
  std::vector<std::size_t> bucket_live_;
  std::vector<std::optional<Entry>> slots_;
  std::vector<std::uint32_t> free_;
  std::vector<Key> scratch_;
  std::size_t live_ = 0;
  bool dirty_ = false;
};

}  // namespace tailbatch::detail
