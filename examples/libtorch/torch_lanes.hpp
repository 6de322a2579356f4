// Lanes that own a libtorch module each, the model call a Pipeline makes on them, and the
// thread budget: lanes x intra-op threads against the cores.
//
//   TorchLanes lanes(2, "encoder.pt");          // two lanes, each loads its own module
//   set_intra_op_threads(lanes.size(), 0, 0, log);  // cores / lanes threads each; warns if over
//   Pipeline<TokenizedText, Encoding, TokenBudget, TorchLanes> p(EncoderModel{}, policy, config,
//   lanes);
//
// A lane is a HostLanes slot (capacity one) with a module of its own and its batch buffers:
// one batch at a time runs on a module, and no module is shared between threads, so no
// lock is taken around a forward call.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tailbatch/lanes.hpp>
#include <thread>
#include <utility>
#include <vector>

#include "encoder.hpp"

namespace tailbatch_libtorch {

// One lane: its index, its module and its batch buffers. Lives as long as its TorchLanes.
// Not thread-safe: used by the one batch that holds its lease.
class TorchLane {
 public:
  TorchLane(std::size_t index, Encoder module) : index_(index), module_(std::move(module)) {}
  // The lane's index in [0, TorchLanes::size()). Thread-safe.
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  [[nodiscard]] Encoder& module() noexcept { return module_; }
  [[nodiscard]] BatchScratch& scratch() noexcept { return scratch_; }

 private:
  std::size_t index_;
  Encoder module_;
  BatchScratch scratch_;
};

// A LaneBackend (tailbatch/lanes.hpp) of `lanes` lanes of capacity one, each owning a
// module loaded from the same weights file. Leasing is HostLanes' (least loaded, first
// come first served). Thread-safety: every member but lane() is thread-safe. Exceptions:
// the constructor throws what load_encoder throws (std::runtime_error naming the file),
// std::invalid_argument for zero lanes, std::bad_alloc; nothing else throws.
class TorchLanes {
 public:
  using Lane = TorchLane;

  class Lease {
   public:
    // Move-only, as the HostLanes lease it holds; destroying it returns the slot.
    // The leased lane. Precondition: not moved from. Not thread-safe: one owner at a time.
    [[nodiscard]] TorchLane& lane() const noexcept { return owner_->lanes_[slot_.index()]; }
    [[nodiscard]] std::size_t index() const noexcept { return slot_.index(); }

   private:
    friend class TorchLanes;
    Lease(TorchLanes* owner, tailbatch::HostLanes::Lease slot) noexcept
        : owner_(owner), slot_(std::move(slot)) {}
    TorchLanes* owner_;
    tailbatch::HostLanes::Lease slot_;
  };

  // Loads one module per lane from `weights` (each lane its own copy). Blocks on the file.
  TorchLanes(std::size_t lanes, const std::filesystem::path& weights) : slots_(lanes, 1) {
    lanes_.reserve(lanes);
    for (std::size_t i = 0; i < lanes; ++i) lanes_.emplace_back(i, load_encoder(weights));
  }
  TorchLanes(const TorchLanes&) = delete;
  TorchLanes& operator=(const TorchLanes&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return lanes_.size(); }
  [[nodiscard]] std::size_t lane_capacity() const noexcept { return 1; }
  [[nodiscard]] std::optional<Lease> try_acquire() noexcept { return wrap(slots_.try_acquire()); }
  [[nodiscard]] std::optional<Lease> acquire_for(std::chrono::nanoseconds timeout) {
    return wrap(slots_.acquire_for(timeout));
  }
  [[nodiscard]] std::size_t free_slots_approx() const noexcept {
    return slots_.free_slots_approx();
  }

  // Lane i, for calling its module directly (a benchmark's baseline, a test). Not
  // thread-safe: only while no Pipeline runs on these lanes.
  [[nodiscard]] TorchLane& lane(std::size_t i) noexcept { return lanes_[i]; }

 private:
  std::optional<Lease> wrap(std::optional<tailbatch::HostLanes::Lease> slot) noexcept {
    if (!slot) return std::nullopt;
    return Lease(this, std::move(*slot));
  }

  tailbatch::HostLanes slots_;
  std::vector<TorchLane> lanes_;
};

static_assert(tailbatch::LaneBackend<TorchLanes>);

// The Pipeline's model: one batch on the lane's own module. Thread-safe (each lane is used
// by one batch at a time). Throws what encode_batch throws; the Pipeline turns it into the
// batch's `failed` outcomes.
struct EncoderModel {
  void operator()(std::span<const TokenizedText> in, std::span<Encoding> out,
                  TorchLane& lane) const {
    encode_batch(lane.module(), in, out, lane.scratch());
  }
};

// How many threads the lanes and libtorch's intra-op pool will run on, against the cores.
struct ThreadPlan {
  std::size_t lanes = 1;
  std::size_t threads_per_lane = 1;  // libtorch's intra-op threads, per model call
  std::size_t cores = 1;
  [[nodiscard]] std::size_t threads() const noexcept { return lanes * threads_per_lane; }
  [[nodiscard]] bool oversubscribed() const noexcept { return threads() > cores; }
};

// Sets libtorch's intra-op threads (torch::set_num_threads) for `lanes` lanes running at
// once: threads_per_lane of them (0: cores / lanes, at least 1) on `cores` cores (0: the
// hardware's). Each lane's model call runs its own team of that many threads (libtorch's
// OpenMP backend), so lanes x threads_per_lane threads compete for the cores: when that
// exceeds them, writes one warning line to `log` (when set) and returns the plan with
// oversubscribed() true. Call it before the lanes' threads first run the model: a thread
// takes the count at its first parallel operation. The setting is libtorch's, process
// wide. Allocates only to write the warning. Not thread-safe: call once, at start-up.
inline ThreadPlan set_intra_op_threads(std::size_t lanes, std::size_t threads_per_lane = 0,
                                       std::size_t cores = 0,
                                       const std::function<void(std::string_view)>& log = {}) {
  ThreadPlan plan;
  plan.lanes = std::max<std::size_t>(lanes, 1);
  plan.cores = cores != 0 ? cores : std::max<std::size_t>(std::thread::hardware_concurrency(), 1);
  plan.threads_per_lane =
      threads_per_lane != 0 ? threads_per_lane : std::max<std::size_t>(plan.cores / plan.lanes, 1);
  torch::set_num_threads(static_cast<int>(plan.threads_per_lane));
  if (plan.oversubscribed() && log) {
    log("libtorch: " + std::to_string(plan.lanes) + " lanes x " +
        std::to_string(plan.threads_per_lane) +
        " intra-op threads = " + std::to_string(plan.threads()) + " threads on " +
        std::to_string(plan.cores) + " cores: oversubscribed; use at most " +
        std::to_string(std::max<std::size_t>(plan.cores / plan.lanes, 1)) +
        " thread(s) per lane, or fewer lanes");
  }
  return plan;
}

}  // namespace tailbatch_libtorch
