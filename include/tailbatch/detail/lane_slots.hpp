// Slot accounting shared by the lane backends (HostLanes, cuda::StreamPool): `lanes` lanes
// of `capacity` slots each. A take picks the least-loaded lane below its cap (the lowest
// index among equals) and a free slot in it; slot s belongs to lane s / capacity.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

namespace tailbatch::detail {

// Thread-safe. The constructor allocates (std::bad_alloc); nothing else throws.
class LaneSlots {
 public:
  LaneSlots(std::size_t lanes, std::size_t capacity)
      : capacity_(capacity), in_flight_(lanes, 0), busy_(lanes * capacity, false) {}

  [[nodiscard]] std::size_t lanes() const noexcept { return in_flight_.size(); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t lane_of(std::size_t slot) const noexcept { return slot / capacity_; }

  // A free slot, or nullopt when every lane is at its cap. Never blocks on a full set.
  [[nodiscard]] std::optional<std::size_t> try_take() noexcept {
    std::lock_guard lock(mu_);
    return take_locked();
  }

  // As try_take, waiting up to `timeout` for a slot to be given back. Blocks.
  [[nodiscard]] std::optional<std::size_t> take_for(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mu_);
    std::optional<std::size_t> slot = take_locked();
    if (slot) return slot;
    freed_.wait_for(lock, timeout, [&] {
      slot = take_locked();
      return slot.has_value();
    });
    return slot;
  }

  // Returns a slot taken by try_take or take_for, exactly once.
  void give_back(std::size_t slot) noexcept {
    {
      std::lock_guard lock(mu_);
      busy_[slot] = false;
      --in_flight_[lane_of(slot)];
    }
    freed_.notify_one();
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

 private:
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
    return slot;
  }

  std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::size_t> in_flight_;
  std::vector<bool> busy_;
};

}  // namespace tailbatch::detail
