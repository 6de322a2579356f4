// The Pipeline's staged queue: where queued requests wait while batches form.
//
// Only the thread leading batch formation touches it (no locking inside). Requests are
// never moved while they wait: submitters append them to fixed-capacity chunks, one chain
// per (priority, bucket), and the leader moves whole chunks over to the matching
// sub-queue.
// A fifo sub-queue is read chunk by chunk; an earliest-deadline sub-queue also keeps a
// sorted list of small keys that point into its chunks. A request taken out (into a
// batch, or completed early) is marked gone by the caller; a chunk is recycled once
// nothing in it is live, so that after warm-up no step allocates.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <tailbatch/batch_policy.hpp>
#include <utility>
#include <vector>

namespace tailbatch::detail {

// Traits: static bool gone(const Entry&), static BatchTime deadline(const Entry&).
template <class Entry, class Traits>
class StagedQueue {
 public:
  // (serial, index) also orders a sub-queue's entries by arrival: ties between equal
  // deadlines go to the earlier arrival.
  struct Key {
    BatchTime deadline;
    std::uint64_t serial;  // the chunk's serial number in its sub-queue
    std::size_t index;     // the entry's index in that chunk
  };

  struct Chunk {
    std::vector<Entry> entries;
    std::size_t head = 0;  // entries before head are gone (fifo)
    std::size_t live = 0;
  };

  struct Sub {
    std::deque<Chunk> chunks;
    std::uint64_t front_serial = 0;  // serial of chunks.front()
    std::size_t live = 0;
    // earliest_deadline only:
    std::vector<Key> keys;
    std::size_t key_head = 0;
    std::size_t sorted_end = 0;
  };

  // Where an entry is. Valid until the next compact() of its sub-queue
  // (chunks in a deque keep their address while others come and go at the ends).
  struct Pos {
    Entry* entry;
    Chunk* chunk;
    std::uint32_t sub;
  };

  StagedQueue(std::size_t lanes, std::size_t buckets, BatchOrder order)
      : lanes_(lanes),
        buckets_(buckets),
        edf_(order == BatchOrder::earliest_deadline),
        subs_(lanes * buckets),
        bucket_live_(buckets, 0) {}

  [[nodiscard]] std::size_t size() const noexcept { return live_; }
  [[nodiscard]] bool edf() const noexcept { return edf_; }
  [[nodiscard]] std::size_t lanes() const noexcept { return lanes_; }
  [[nodiscard]] std::size_t buckets() const noexcept { return buckets_; }
  [[nodiscard]] std::size_t sub_count() const noexcept { return subs_.size(); }
  [[nodiscard]] std::size_t live_in_bucket(std::size_t bucket) const noexcept {
    return bucket_live_[bucket];
  }
  [[nodiscard]] std::size_t live_in_sub(std::size_t sub) const noexcept { return subs_[sub].live; }
  [[nodiscard]] std::size_t sub_index(std::size_t lane, std::size_t bucket) const noexcept {
    return bucket * lanes_ + lane;
  }

  // Moves up to `most` emptied chunk vectors (capacity kept) to the back of out, for
  // submitters to fill again, as many as out has room for; never allocates. The rest
  // wait here.
  void give_back_chunks(std::vector<std::vector<Entry>>& out, std::size_t most) noexcept {
    for (; most > 0 && !pool_.empty() && out.size() < out.capacity(); --most) {
      out.push_back(std::move(pool_.back()));
      pool_.pop_back();
    }
  }

  // Appends a chunk of entries (all of this sub-queue) in arrival order. Allocates a
  // little (deque blocks, keys) until warmed up; throws std::bad_alloc with nothing changed
  // but `entries` kept by the caller on failure.
  void add_chunk(std::size_t s, std::vector<Entry>& entries) {
    if (entries.empty()) return;
    Sub& q = subs_[s];
    if (edf_ && q.keys.capacity() < q.keys.size() + entries.size()) {
      q.keys.reserve(std::max(2 * q.keys.capacity(), q.keys.size() + entries.size()));
    }
    // compact() recycles into the pool without allocating: room for every chunk.
    if (pool_.capacity() < pool_.size() + chunks_ + 1)
      pool_.reserve(2 * (pool_.size() + chunks_ + 1));
    q.chunks.emplace_back();
    ++chunks_;
    Chunk& c = q.chunks.back();
    c.entries.swap(entries);
    c.live = c.entries.size();
    const std::uint64_t serial = q.front_serial + q.chunks.size() - 1;
    if (edf_) {
      for (std::size_t i = 0; i < c.entries.size(); ++i) {
        q.keys.push_back(Key{Traits::deadline(c.entries[i]), serial, i});
      }
      dirty_ = true;
    }
    q.live += c.live;
    bucket_live_[s / lanes_] += c.live;
    live_ += c.live;
  }

  // Restores earliest-deadline order after add_chunk. Allocates only while the scratch
  // buffer grows (std::bad_alloc leaves the order as it was).
  void settle() {
    if (!dirty_) return;
    dirty_ = false;
    const auto less = [](const Key& a, const Key& b) {
      if (a.deadline != b.deadline) return a.deadline < b.deadline;
      return a.serial != b.serial ? a.serial < b.serial : a.index < b.index;
    };
    for (Sub& q : subs_) {
      q.sorted_end = std::max(q.sorted_end, q.key_head);
      if (q.sorted_end >= q.keys.size()) continue;
      const auto mid = q.keys.begin() + static_cast<std::ptrdiff_t>(q.sorted_end);
      std::sort(mid, q.keys.end(), less);
      if (q.sorted_end > q.key_head) {
        scratch_.clear();
        scratch_.reserve(q.keys.size() - q.key_head);
        std::merge(q.keys.begin() + static_cast<std::ptrdiff_t>(q.key_head), mid, mid, q.keys.end(),
                   std::back_inserter(scratch_), less);
        q.keys.swap(scratch_);
        q.key_head = 0;
      }
      q.sorted_end = q.keys.size();
    }
  }

  [[nodiscard]] Entry& at(const Pos& p) noexcept { return *p.entry; }

  // Calls f(Entry&, Pos) for the live entries of sub-queue s in order until f returns
  // false. f may mark the entry it is given removed (and nothing else).
  template <class F>
  void for_each(std::size_t s, F&& f) {
    Sub& q = subs_[s];
    const auto sub = static_cast<std::uint32_t>(s);
    if (!edf_) {
      for (Chunk& c : q.chunks) {
        if (c.live == 0) continue;
        Entry* const end = c.entries.data() + c.entries.size();
        for (Entry* e = c.entries.data() + c.head; e != end; ++e) {
          if (Traits::gone(*e)) continue;
          if (!f(*e, Pos{e, &c, sub})) return;
        }
      }
      return;
    }
    for (std::size_t k = q.key_head; k < q.keys.size(); ++k) {
      const Key& key = q.keys[k];
      if (key.serial < q.front_serial) continue;
      Chunk& c = q.chunks[static_cast<std::size_t>(key.serial - q.front_serial)];
      Entry& e = c.entries[key.index];
      if (Traits::gone(e)) continue;
      if (!f(e, Pos{&e, &c, sub})) return;
    }
  }

  // As for_each, newest first (adaptive LIFO). With earliest-deadline order, the deadline
  // order still holds: the same as for_each.
  template <class F>
  void for_each_reverse(std::size_t s, F&& f) {
    if (edf_) return for_each(s, f);
    Sub& q = subs_[s];
    const auto sub = static_cast<std::uint32_t>(s);
    for (auto c = q.chunks.rbegin(); c != q.chunks.rend(); ++c) {
      if (c->live == 0) continue;
      Entry* const begin = c->entries.data() + c->head;
      for (Entry* e = c->entries.data() + c->entries.size(); e != begin;) {
        --e;
        if (Traits::gone(*e)) continue;
        if (!f(*e, Pos{e, &*c, sub})) return;
      }
    }
  }

  // The serial number of sub-queue s's newest chunk (valid after an add_chunk).
  [[nodiscard]] std::uint64_t last_serial(std::size_t s) const noexcept {
    return subs_[s].front_serial + subs_[s].chunks.size() - 1;
  }
  // The entries of the chunk with this serial number in sub-queue s.
  [[nodiscard]] std::vector<Entry>& chunk_entries(std::size_t s, std::uint64_t serial) noexcept {
    return subs_[s].chunks[static_cast<std::size_t>(serial - subs_[s].front_serial)].entries;
  }
  // Where the entry (serial, index) of sub-queue s is, if it is still live.
  [[nodiscard]] bool locate(std::size_t s, std::uint64_t serial, std::size_t index,
                            Pos& out) noexcept {
    Sub& q = subs_[s];
    if (serial < q.front_serial) return false;
    const auto k = static_cast<std::size_t>(serial - q.front_serial);
    if (k >= q.chunks.size()) return false;
    Chunk& c = q.chunks[k];
    if (index >= c.entries.size() || Traits::gone(c.entries[index])) return false;
    out = Pos{&c.entries[index], &c, static_cast<std::uint32_t>(s)};
    return true;
  }
  // The first live entry of sub-queue s and where it is; false when none.
  [[nodiscard]] bool first_pos(std::size_t s, Pos& out) noexcept {
    bool found = false;
    if (subs_[s].live == 0) return found;
    for_each(s, [&](Entry&, const Pos& p) {
      out = p;
      found = true;
      return false;
    });
    return found;
  }

  // The first live entry of sub-queue s, or nullptr.
  [[nodiscard]] Entry* first(std::size_t s) noexcept {
    Entry* out = nullptr;
    if (subs_[s].live == 0) return out;
    for_each(s, [&](Entry& e, const Pos&) {
      out = &e;
      return false;
    });
    return out;
  }

  // Records that the entry at p is gone (the caller has moved its contents out).
  void removed(const Pos& p) noexcept {
    Sub& q = subs_[p.sub];
    --p.chunk->live;
    --q.live;
    --bucket_live_[p.sub / lanes_];
    --live_;
  }

  // Drops what is gone from the front of sub-queue s and recycles emptied chunks. Never
  // allocates (the pool has room, reserved in add_chunk).
  void compact(std::size_t s) noexcept {
    Sub& q = subs_[s];
    while (!q.chunks.empty()) {
      Chunk& c = q.chunks.front();
      if (c.live > 0) {
        if (!edf_) {
          while (c.head < c.entries.size() && Traits::gone(c.entries[c.head])) ++c.head;
        }
        break;
      }
      c.entries.clear();
      pool_.push_back(std::move(c.entries));
      q.chunks.pop_front();
      --chunks_;
      ++q.front_serial;
    }
    if (!edf_) return;
    while (q.key_head < q.keys.size()) {
      const Key& key = q.keys[q.key_head];
      if (key.serial >= q.front_serial &&
          !Traits::gone(
              q.chunks[static_cast<std::size_t>(key.serial - q.front_serial)].entries[key.index])) {
        break;
      }
      ++q.key_head;
    }
    if (q.key_head == q.keys.size()) {
      q.keys.clear();
      q.key_head = 0;
      q.sorted_end = 0;
    } else if (q.key_head >= 256 && q.key_head * 2 >= q.keys.size()) {
      q.keys.erase(q.keys.begin(), q.keys.begin() + static_cast<std::ptrdiff_t>(q.key_head));
      q.sorted_end -= std::min(q.sorted_end, q.key_head);
      q.key_head = 0;
    }
  }

 private:
  std::size_t lanes_;
  std::size_t buckets_;
  bool edf_;
  std::vector<Sub> subs_;
  std::vector<std::size_t> bucket_live_;
  std::vector<std::vector<Entry>> pool_;
  std::vector<Key> scratch_;
  std::size_t live_ = 0;
  std::size_t chunks_ = 0;
  bool dirty_ = false;
};

}  // namespace tailbatch::detail
