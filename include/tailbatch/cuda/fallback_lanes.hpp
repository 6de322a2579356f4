// FallbackLanes: CUDA streams when the GPU can be used, host lanes when it cannot.
//
// At construction it tries to open a StreamPool. If that fails (no driver, a driver older
// than the runtime, no device, out of memory) and fall_back_to_host is set, it runs on
// HostLanes instead, and says so: one line to the user's log sink naming the cause, and
// the gauge tailbatch_lanes_host_fallback set to 1 (0 when the streams opened). With
// fall_back_to_host unset the StreamPool's exception propagates.
//
// The model receives an AnyLane and asks it where it is:
//
//   [&](std::span<const Req> in, std::span<Resp> out, cuda::AnyLane& lane) {
//     if (cuda::StreamLane* gpu = lane.device_lane()) run_on_gpu(in, out, *gpu);
//     else run_on_cpu(in, out);
//   }
//
// A Pipeline<Req, Resp, Policy, cuda::FallbackLanes> is then "configured to fall back".
// There is no global logger: the log sink is a std::function the user supplies (stderr,
// spdlog, syslog...); it is called from the constructor's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/stream_pool.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/metrics.hpp>

namespace tailbatch::cuda {

struct FallbackLanesConfig {
  // The StreamPool tried first (its metrics fields are ignored: set metrics below).
  StreamPoolConfig device{};
  // On a StreamPool failure: true runs on host lanes (and logs why), false rethrows.
  bool fall_back_to_host = true;
  // The host lanes used on fallback.
  std::size_t host_lanes = 1;
  std::size_t host_lane_capacity = 1;
  // Receives one line saying which backend runs and, on fallback, why. May be empty.
  std::function<void(std::string_view)> log{};
  // tailbatch_lanes_host_fallback (and the StreamPool's metrics), with these labels.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// The lane a model receives from FallbackLanes: a CUDA stream slot or a host lane.
// Immutable; thread-safe (the StreamLane it points to is not: see StreamLane).
class AnyLane {
 public:
  // Whether this lane is a CUDA stream. Thread-safe.
  [[nodiscard]] bool on_device() const noexcept { return device_ != nullptr; }
  // The CUDA lane, or nullptr on host lanes. Thread-safe.
  [[nodiscard]] StreamLane* device_lane() const noexcept { return device_; }
  // The host lane, or nullptr on CUDA lanes. Thread-safe.
  [[nodiscard]] HostLane* host_lane() const noexcept { return host_; }
  // The lane's index (the stream's, or the host lane's). Thread-safe.
  [[nodiscard]] std::size_t index() const noexcept { return device_ != nullptr ? device_->index() : host_->index(); }

 private:
  friend class FallbackLanes;
  AnyLane(StreamLane* d, HostLane* h) noexcept : device_(d), host_(h) {}
  StreamLane* device_;
  HostLane* host_;
};

// A LaneBackend over a StreamPool or, failing that, HostLanes. See the file comment.
//
// Thread-safety: as StreamPool and HostLanes (every LaneBackend member is thread-safe).
// Exceptions: the constructor throws std::invalid_argument for bad host lane counts, and
// the StreamPool's exception when fall_back_to_host is false; std::bad_alloc; nothing else
// throws.
class FallbackLanes {
 public:
  using Lane = AnyLane;

  class Lease {
   public:
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&&) noexcept = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() = default;

    // The leased lane. Precondition: not moved from. Not thread-safe: one owner at a time.
    [[nodiscard]] AnyLane& lane() const noexcept { return *lane_; }
    // The leased lane's index. Not thread-safe: one owner at a time.
    [[nodiscard]] std::size_t index() const noexcept {
      return std::holds_alternative<StreamPool::Lease>(inner_) ? std::get<StreamPool::Lease>(inner_).index()
                                                               : std::get<HostLanes::Lease>(inner_).index();
    }

   private:
    friend class FallbackLanes;
    template <class Inner>
    Lease(Inner&& inner, AnyLane* lane) noexcept : inner_(std::forward<Inner>(inner)), lane_(lane) {}
    std::variant<StreamPool::Lease, HostLanes::Lease> inner_;
    AnyLane* lane_;
  };

  // Tries the StreamPool, falls back as configured, logs and sets the gauge. Blocks while
  // the device initializes. Throws as the class comment says.
  explicit FallbackLanes(FallbackLanesConfig config = {}) : config_(std::move(config)) {
    if (config_.host_lanes < 1) tailbatch::detail::throw_invalid_argument("FallbackLanes: host_lanes must be >= 1");
    if (config_.host_lane_capacity < 1) tailbatch::detail::throw_invalid_argument("FallbackLanes: host_lane_capacity must be >= 1");
    StreamPoolConfig pool_config = config_.device;
    pool_config.metrics = config_.metrics;
    pool_config.metric_labels = config_.metric_labels;
    try {
      pool_.emplace(std::move(pool_config));
    } catch (const CudaError& e) {
      if (!config_.fall_back_to_host) throw;
      reason_ = e.what();
    }
    if (pool_) {
      StreamPool& p = *pool_;
      for (std::size_t s = 0; s < p.size() * p.lane_capacity(); ++s) lanes_.push_back(AnyLane(&p.slot_lane(s), nullptr));
      say("tailbatch: running on " + std::to_string(p.size()) + " CUDA stream lane(s) on device " +
          std::to_string(p.device_info().device) + " (" + p.device_info().name + ")");
    } else {
      host_.emplace(config_.host_lanes, config_.host_lane_capacity);
      host_lane_objects_.reserve(config_.host_lanes);
      for (std::size_t i = 0; i < config_.host_lanes; ++i) host_lane_objects_.emplace_back(i);
      for (HostLane& h : host_lane_objects_) lanes_.push_back(AnyLane(nullptr, &h));
      say("tailbatch: falling back to " + std::to_string(config_.host_lanes) + " host lane(s): " + reason_);
    }
    if (config_.metrics != nullptr) {
      config_.metrics
          ->gauge("tailbatch_lanes_host_fallback",
                  "1 when CUDA lanes could not be opened and batches run on host lanes instead",
                  config_.metric_labels)
          .set(pool_ ? 0.0 : 1.0);
    }
  }

  FallbackLanes(const FallbackLanes&) = delete;
  FallbackLanes& operator=(const FallbackLanes&) = delete;

  // Whether batches run on CUDA streams. Thread-safe.
  [[nodiscard]] bool on_device() const noexcept { return pool_.has_value(); }
  // Why the StreamPool could not be opened (its exception's message); empty on device.
  // Thread-safe.
  [[nodiscard]] const std::string& fallback_reason() const noexcept { return reason_; }
  // The StreamPool, or nullptr on host lanes. Thread-safe.
  [[nodiscard]] StreamPool* stream_pool() noexcept { return pool_ ? &*pool_ : nullptr; }
  // The host lanes, or nullptr on CUDA lanes. Thread-safe.
  [[nodiscard]] HostLanes* host_lanes() noexcept { return host_ ? &*host_ : nullptr; }

  // The number of lanes of the backend in use. Thread-safe.
  [[nodiscard]] std::size_t size() const noexcept { return pool_ ? pool_->size() : host_->size(); }
  // Leases per lane at once. Thread-safe.
  [[nodiscard]] std::size_t lane_capacity() const noexcept {
    return pool_ ? pool_->lane_capacity() : host_->lane_capacity();
  }

  // Lease slots free right now on the backend in use; racy. A Pipeline passes it to its
  // batch policy as BatchView::idle_lanes (lanes.hpp). Thread-safe.
  [[nodiscard]] std::size_t free_slots_approx() const noexcept {
    return pool_ ? pool_->free_slots_approx() : host_->free_slots_approx();
  }

  // As StreamPool::try_acquire / HostLanes::try_acquire. Never blocks on a full backend.
  // Thread-safe.
  [[nodiscard]] std::optional<Lease> try_acquire() noexcept {
    if (pool_) return wrap(pool_->try_acquire());
    return wrap(host_->try_acquire());
  }

  // As try_acquire, waiting up to `timeout`. Blocks. Thread-safe.
  [[nodiscard]] std::optional<Lease> acquire_for(std::chrono::nanoseconds timeout) {
    if (pool_) return wrap(pool_->acquire_for(timeout));
    return wrap(host_->acquire_for(timeout));
  }

 private:
  void say(const std::string& line) const {
    if (config_.log) config_.log(line);
  }

  std::optional<Lease> wrap(std::optional<StreamPool::Lease> inner) noexcept {
    if (!inner) return std::nullopt;
    const StreamLane& s = inner->lane();
    AnyLane* lane = &lanes_[s.index() * pool_->lane_capacity() + s.slot()];
    return Lease(std::move(*inner), lane);
  }

  std::optional<Lease> wrap(std::optional<HostLanes::Lease> inner) noexcept {
    if (!inner) return std::nullopt;
    AnyLane* lane = &lanes_[inner->index()];
    return Lease(std::move(*inner), lane);
  }

  FallbackLanesConfig config_;
  std::string reason_;
  std::optional<StreamPool> pool_;
  std::optional<HostLanes> host_;
  std::vector<HostLane> host_lane_objects_;
  std::vector<AnyLane> lanes_;  // one per lease slot (CUDA) or per lane (host); never resized after construction
};

static_assert(LaneBackend<FallbackLanes>);

}  // namespace tailbatch::cuda
