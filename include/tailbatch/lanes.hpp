// Lanes: where a formed batch runs.
//
// A lane is one place a model call can run: a host worker slot here, a CUDA stream in the
// StreamPool (tailbatch/cuda/stream_pool.hpp). A Pipeline leases a lane slot only once it
// has a batch to run, hands the lane to the user's model as `Lane&`, and returns the slot
// when the model call returns. The backend picks the least-loaded lane that is below its
// per-lane in-flight cap, so that work spreads evenly and no lane is oversubscribed.
//
// The backend owns no threads: the Pipeline's workers do the waiting. A backend may be
// shared by several Pipelines; each lease is independent, an idle Pipeline holds no
// slot, and takers that wait are served first come, first served, so that busy Pipelines
// take turns.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tailbatch/detail/lanes/slots.hpp>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

// What a Pipeline needs of an execution-lane backend.
//
//   B::Lane            the handle the model receives as `Lane&` (a host index, a stream...).
//                      Lanes live as long as the backend, at stable addresses.
//   B::Lease           RAII, move-only: while it lives, one in-flight slot of one lane is
//                      held. lease.lane() is that lane; lease.index() its index in
//                      [0, size()). Destroying (or moving from and destroying) the lease
//                      returns the slot. A lease must not outlive its backend.
//   b.size()           the number of lanes (>= 1). Never blocks.
//   b.lane_capacity()  the most leases one lane grants at once (>= 1). Never blocks.
//   b.try_acquire()    a lease on the least-loaded lane below its cap, or nullopt when every
//                      lane is at its cap. Never blocks, never throws.
//   b.acquire_for(d)   as try_acquire, but waits up to d for a slot to free; nullopt on
//                      timeout. May block; must not throw for a non-negative d.
//   b.free_slots_approx()  optional: slots free right now (racy). A Pipeline tells its
//                      batch policy how many are idle (BatchView::idle_lanes); without
//                      this member it counts only its own batches as busy.
//
// All members must be thread-safe: leases are taken and returned from many threads.
template <class B>
concept LaneBackend = requires(B& b, const B& cb, std::chrono::nanoseconds d) {
  typename B::Lane;
  typename B::Lease;
  requires std::movable<typename B::Lease>;
  requires !std::copy_constructible<typename B::Lease>;
  { cb.size() } noexcept -> std::same_as<std::size_t>;
  { cb.lane_capacity() } noexcept -> std::same_as<std::size_t>;
  { b.try_acquire() } noexcept -> std::same_as<std::optional<typename B::Lease>>;
  { b.acquire_for(d) } -> std::same_as<std::optional<typename B::Lease>>;
  requires requires(typename B::Lease& lease) {
    { lease.lane() } noexcept -> std::same_as<typename B::Lane&>;
    { lease.index() } noexcept -> std::same_as<std::size_t>;
  };
};

// A host lane: nothing but its index. Models that run on the CPU (or manage their own
// device state per index) receive this. Immutable; thread-safe.
class HostLane {
 public:
  explicit HostLane(std::size_t index) noexcept : index_(index) {}
  // The lane's index in [0, HostLanes::size()). Thread-safe.
  [[nodiscard]] std::size_t index() const noexcept { return index_; }

 private:
  std::size_t index_;
};

// Host execution lanes: `lanes` lanes, each granting up to `lane_capacity` leases at once.
//
// With the default (one lane, capacity one) a Pipeline runs one batch at a time on one
// worker thread, which suits a model that is itself multi-threaded or not reentrant. A
// model that is reentrant and single-threaded per call scales with more lanes.
//
// Thread-safety: every member is thread-safe. Exceptions: the constructor throws
// std::invalid_argument for a zero count and std::bad_alloc; nothing else throws.
class HostLanes {
 public:
  using Lane = HostLane;

  // Move-only; holds one slot of one lane until destroyed (LaneBackend in this file).
  using Lease = detail::SlotLease<HostLanes, HostLane>;

  // `lanes` lanes of `lane_capacity` slots each. Allocates. Throws std::invalid_argument
  // ("HostLanes: lanes must be >= 1", "HostLanes: lane_capacity must be >= 1").
  explicit HostLanes(std::size_t lanes = 1, std::size_t lane_capacity = 1)
      : slots_(lanes, lane_capacity) {
    if (lanes < 1) detail::throw_invalid_argument("HostLanes: lanes must be >= 1");
    if (lane_capacity < 1) detail::throw_invalid_argument("HostLanes: lane_capacity must be >= 1");
    lanes_.reserve(lanes);
    for (std::size_t i = 0; i < lanes; ++i) lanes_.emplace_back(i);
  }

  HostLanes(const HostLanes&) = delete;
  HostLanes& operator=(const HostLanes&) = delete;

  // The number of lanes. Thread-safe.
  [[nodiscard]] std::size_t size() const noexcept { return lanes_.size(); }
  // The most leases one lane grants at once. Thread-safe.
  [[nodiscard]] std::size_t lane_capacity() const noexcept { return slots_.capacity(); }

  // A lease on the least-loaded lane below its cap (the lowest index among equals), or
  // nullopt when all are at their cap or another taker is waiting in acquire_for (waiters
  // come first). Never blocks on a full backend (takes a short internal lock), never
  // allocates. Thread-safe.
  [[nodiscard]] std::optional<Lease> try_acquire() noexcept { return lease(slots_.try_take()); }

  // As try_acquire, but waits up to `timeout` for a slot to free. Waiters are served
  // first come, first served: a slot given back goes to the longest waiter. Blocks.
  // Returns nullopt on timeout. Throws only std::system_error (the condition variable).
  // Thread-safe.
  [[nodiscard]] std::optional<Lease> acquire_for(std::chrono::nanoseconds timeout) {
    return lease(slots_.take_for(timeout));
  }

  // Slots (over all lanes) free right now; racy by nature. Never blocks. Thread-safe.
  [[nodiscard]] std::size_t free_slots_approx() const noexcept { return slots_.free_approx(); }

  // Leases held on lane `index` right now; racy by nature. Thread-safe.
  [[nodiscard]] std::size_t in_flight_approx(std::size_t index) const noexcept {
    return slots_.in_flight(index);
  }

 private:
  friend Lease;

  std::optional<Lease> lease(std::optional<std::size_t> slot) noexcept {
    if (!slot) return std::nullopt;
    return Lease(this, *slot);
  }
  HostLane& leased_lane(std::size_t slot) noexcept { return lanes_[slots_.lane_of(slot)]; }
  std::size_t leased_index(std::size_t slot) const noexcept { return slots_.lane_of(slot); }
  void give_back(std::size_t slot) noexcept { slots_.give_back(slot); }

  std::vector<HostLane> lanes_;
  detail::LaneSlots slots_;
};

static_assert(LaneBackend<HostLanes>);

}  // namespace tailbatch
