// Slot accounting and the lease shared by the lane backends (HostLanes, cuda::StreamPool):
// `lanes` lanes of `capacity` slots each. A take picks the least-loaded lane below its cap (the
// lowest index among equals) and a free slot in it; slot s belongs to lane s / capacity.
//
// Fair among takers: a taker that has to wait joins a first-come, first-served line, and
// a slot given back goes to the first in line; while anyone waits, try_take finds
// nothing. Several Pipelines sharing one backend therefore take turns for its slots, and
// none can starve another by taking a freed slot again and again before a waiter wakes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace tailbatch::detail {

// The lease of a lane backend (LaneBackend::Lease in lanes.hpp): move-only, it holds one
// slot of `Owner` and gives it back exactly once, when destroyed or assigned over. Only
// the owner makes one. The owner provides, privately (befriending this class):
//   Lane& leased_lane(std::size_t slot) const noexcept        the slot's lane
//   std::size_t leased_index(std::size_t slot) const noexcept  that lane's index
//   void give_back(std::size_t slot) noexcept                  returns the slot
template <class Owner, class Lane>
class SlotLease {
 public:
  SlotLease(SlotLease&& other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)), slot_(other.slot_) {}
  SlotLease& operator=(SlotLease&& other) noexcept {
    if (this != &other) {
      release();
      owner_ = std::exchange(other.owner_, nullptr);
      slot_ = other.slot_;
    }
    return *this;
  }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  // Returns the slot (a backend may wait for the lane first: the StreamPool for its stream).
  ~SlotLease() { release(); }

  // The leased lane. Precondition: the lease was not moved from. Not thread-safe: one
  // owner at a time.
  [[nodiscard]] Lane& lane() const noexcept { return owner_->leased_lane(slot_); }
  // The leased lane's index. Precondition: not moved from. Not thread-safe: one owner at
  // a time.
  [[nodiscard]] std::size_t index() const noexcept { return owner_->leased_index(slot_); }

 private:
  friend Owner;
  SlotLease(Owner* owner, std::size_t slot) noexcept : owner_(owner), slot_(slot) {}
  void release() noexcept {
    if (owner_ != nullptr) std::exchange(owner_, nullptr)->give_back(slot_);
  }

  Owner* owner_;
  std::size_t slot_;
};

// Thread-safe. The constructor allocates (std::bad_alloc); nothing else throws, except
// take_for (std::system_error, from the condition variable).
class LaneSlots {
 public:
  LaneSlots(std::size_t lanes, std::size_t capacity)
      : capacity_(capacity), in_flight_(lanes, 0), busy_(lanes * capacity, false), free_(lanes * capacity) {}

  [[nodiscard]] std::size_t lanes() const noexcept { return in_flight_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t lane_of(std::size_t slot) const noexcept { return slot / capacity_; }

  // A free slot, or nullopt when every lane is at its cap or someone is waiting for a
  // slot (they come first). Never blocks on a full set.
  [[nodiscard]] std::optional<std::size_t> try_take() noexcept {
    std::lock_guard lock(mu_);
    if (head_ != nullptr) return std::nullopt;
    return take_locked();
  }

  // As try_take, waiting up to `timeout` in line for a slot to be given back. Blocks.
  [[nodiscard]] std::optional<std::size_t> take_for(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    if (head_ == nullptr) {
      if (std::optional<std::size_t> slot = take_locked()) return slot;
    }
    if (timeout <= std::chrono::nanoseconds::zero()) return std::nullopt;
    Waiter w;
    if (tail_ == nullptr) {
      head_ = &w;
    } else {
      tail_->next = &w;
    }
    tail_ = &w;
    // Leaves the line however the wait ends (a wait that throws returns with the lock
    // held), unless a slot was handed over.
    struct Leave {
      LaneSlots* self;
      Waiter* w;
      ~Leave() {
        if (!w->slot) self->unlink(w);
      }
    } leave{this, &w};
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!w.slot && w.cv.wait_until(lock, until) != std::cv_status::timeout) {
    }
    return w.slot;
  }

  // Returns a slot taken by try_take or take_for, exactly once. Hands it (or another
  // free one) to the first in line.
  void give_back(std::size_t slot) noexcept {
    std::lock_guard lock(mu_);
    busy_[slot] = false;
    --in_flight_[lane_of(slot)];
    free_.fetch_add(1, std::memory_order_relaxed);
    while (head_ != nullptr) {
      std::optional<std::size_t> s = take_locked();
      if (!s) break;
      Waiter* w = head_;
      head_ = w->next;
      if (head_ == nullptr) tail_ = nullptr;
      w->slot = s;
      // Under the lock: once it is released the waiter may return and take its
      // condition variable with it.
      w->cv.notify_one();
    }
  }

  // Slots held on `lane` right now (0 for an index out of range); racy by nature.
  [[nodiscard]] std::size_t in_flight(std::size_t lane) const noexcept {
    std::lock_guard lock(mu_);
    return lane < in_flight_.size() ? in_flight_[lane] : 0;
  }

  // Slots held across all lanes right now; racy by nature.
  [[nodiscard]] std::size_t total_in_flight() const noexcept {
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (std::size_t c : in_flight_) n += c;
    return n;
  }

  // Slots free right now (no lock); racy by nature.
  [[nodiscard]] std::size_t free_approx() const noexcept { return free_.load(std::memory_order_relaxed); }

 private:
  // One taker waiting in line, on its own stack.
  struct Waiter {
    std::condition_variable cv;
    std::optional<std::size_t> slot;
    Waiter* next = nullptr;
  };

  std::optional<std::size_t> take_locked() noexcept {
    const std::size_t n = in_flight_.size();
    std::size_t best = n;
    for (std::size_t i = 0; i < n; ++i) {
      if (in_flight_[i] < capacity_ && (best == n || in_flight_[i] < in_flight_[best])) best = i;
    }
    if (best == n) return std::nullopt;
    std::size_t slot = best * capacity_;
    while (busy_[slot]) ++slot;  // a free slot exists: in_flight_[best] < capacity_
    busy_[slot] = true;
    ++in_flight_[best];
    free_.fetch_sub(1, std::memory_order_relaxed);
    return slot;
  }

  void unlink(Waiter* w) noexcept {
    Waiter* prev = nullptr;
    for (Waiter* p = head_; p != nullptr; prev = p, p = p->next) {
      if (p != w) continue;
      (prev == nullptr ? head_ : prev->next) = p->next;
      if (tail_ == p) tail_ = prev;
      return;
    }
  }

  std::size_t capacity_;
  mutable std::mutex mu_;
  std::vector<std::size_t> in_flight_;
  std::vector<bool> busy_;
  std::atomic<std::size_t> free_;
  Waiter* head_ = nullptr;  // the line, first come first served
  Waiter* tail_ = nullptr;
};

}  // namespace tailbatch::detail
