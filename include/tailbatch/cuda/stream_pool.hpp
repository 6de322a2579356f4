// StreamPool: CUDA streams as execution lanes (a LaneBackend, like HostLanes).
//
// A pool of `lanes` non-blocking CUDA streams on one device, each granting up to
// `lane_capacity` leases at once. A Pipeline's worker leases the least-loaded stream for a
// batch and hands the model a StreamLane: the stream, a pair of timing events, and a
// pinned host staging buffer and a device scratch buffer that belong to that lease slot
// and are reused batch after batch. The model enqueues its copies and kernels on
// lane.stream() and calls lane.synchronize() before it returns; copies staged through
// pinned memory on one stream overlap kernels running on the others (measured on an NVIDIA
// H200: 1.41x with 2 streams, 2.38x with 4; docs/performance.md, "GPU: the CUDA path on an
// NVIDIA H200").
//
//   cuda::StreamPool pool({.device = 0, .lanes = 2});
//   Pipeline<Req, Resp, FixedWindow, cuda::StreamPool> p(model, FixedWindow(32, 5ms), {}, pool);
//
// Timing: the first call to lane.stream() in a batch records a start event, synchronize()
// records a stop event, waits for it, and records the elapsed device time into
// device_time() (and the metric tailbatch_cuda_lane_device_seconds): one sample per
// synchronize(). Host work done before the first stream() call is not counted. With
// lane_capacity > 1, two batches share a stream and each one's time includes any work the
// other enqueued in between: what it waited for on that stream.
//
// Errors: the constructor throws CudaError naming the cause when no CUDA driver is
// installed, the driver is older than the runtime, there is no device, or memory runs out,
// each with cudaGetErrorName, the message and where (see error.hpp); and
// std::invalid_argument naming a bad field. tailbatch/cuda/fallback_lanes.hpp turns such
// a failure into host lanes, if asked to.
//
// Threads: the pool starts none. Leases are taken and returned from any thread (the
// Pipeline's workers); a StreamLane is used by the one thread holding its lease. The CUDA
// device is made current on that thread by stream() and by buffer growth.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/resources.hpp>
#include <tailbatch/detail/lanes/slots.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>

namespace tailbatch::cuda {

struct StreamPoolConfig {
  // The CUDA device the streams live on.
  int device = 0;
  // Streams (>= 1). Two already overlap one batch's copies with another's kernels.
  std::size_t lanes = 2;
  // Leases one stream grants at once (>= 1). More than one lets a batch's host work
  // (tokenizing, packing) run while another batch's kernels occupy the same stream.
  std::size_t lane_capacity = 1;
  // Pinned host bytes and device bytes allocated up front for each lease slot (they grow
  // on demand; sizing them for the largest batch keeps allocation off the request path).
  std::size_t staging_bytes = 0;
  std::size_t scratch_bytes = 0;
  // Wait in synchronize() by sleeping on the event (cudaEventBlockingSync) instead of
  // spinning: frees a core per waiting lane, costs some microseconds of wake-up latency.
  bool blocking_sync = false;
  // Metrics (tailbatch_cuda_lane_device_seconds, tailbatch_cuda_lanes_in_flight),
  // registered at construction with these labels. nullptr: none.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// What the pool found on the device it opened.
struct DeviceInfo {
  int device = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  std::size_t total_memory = 0;
  int driver_version = 0;   // e.g. 12040 for 12.4
  int runtime_version = 0;
};

namespace detail {

inline std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// Checks that `device` can be used and makes it current on this thread. Throws CudaError
// whose message names the cause (prefixed with `who`), or std::invalid_argument for a
// device index that does not exist.
inline DeviceInfo open_device(int device, std::string_view who) {
  DeviceInfo info;
  info.device = device;
  const std::string w(who);
  TAILBATCH_CUDA_CHECK_IN(w, cudaRuntimeGetVersion(&info.runtime_version));
  TAILBATCH_CUDA_CHECK_IN(w + ": cannot read the CUDA driver version", cudaDriverGetVersion(&info.driver_version));
  if (info.driver_version == 0) {
    throw_cuda_error(cudaErrorInsufficientDriver, "cudaDriverGetVersion", __FILE__, __LINE__,
                     w + ": no CUDA driver is installed (no NVIDIA GPU, or its driver is missing)");
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver || (e != cudaSuccess && info.driver_version < info.runtime_version)) {
    throw_cuda_error(e, "cudaGetDeviceCount(&count)", __FILE__, __LINE__,
                     w + ": the CUDA driver (" + cuda_version_text(info.driver_version) +
                         ") is older than the CUDA runtime (" + cuda_version_text(info.runtime_version) +
                         ") this program was built with; update the NVIDIA driver");
  }
  if (e != cudaSuccess) {
    throw_cuda_error(e, "cudaGetDeviceCount(&count)", __FILE__, __LINE__, w + ": no usable CUDA device");
  }
  if (count == 0) {
    throw_cuda_error(cudaErrorNoDevice, "cudaGetDeviceCount(&count)", __FILE__, __LINE__,
                     w + ": no CUDA device found");
  }
  if (device < 0 || device >= count) {
    tailbatch::detail::throw_invalid_argument(w + ": device must be in [0, " + std::to_string(count) + "), not " +
                                std::to_string(device));
  }
  TAILBATCH_CUDA_CHECK_IN(w, cudaSetDevice(device));
  cudaDeviceProp prop{};
  TAILBATCH_CUDA_CHECK_IN(w, cudaGetDeviceProperties(&prop, device));
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  return info;
}

}  // namespace detail

class StreamPool;

// One lease slot of one stream: what the model receives as Lane&.
//
// Thread-safety: not thread-safe; it is used by the thread holding its lease, one batch at
// a time. Exceptions: members that call CUDA throw CudaError; the lease's end never throws.
class StreamLane {
 public:
  StreamLane(const StreamLane&) = delete;
  StreamLane& operator=(const StreamLane&) = delete;

  // The stream's index in [0, StreamPool::size()). Not thread-safe.
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  // This slot's index in [0, lane_capacity()) within its stream. Not thread-safe.
  [[nodiscard]] std::size_t slot() const noexcept { return slot_; }
  // The CUDA device. Not thread-safe.
  [[nodiscard]] int device() const noexcept { return device_; }

  // The stream to enqueue this batch's work on. The first call of a batch makes the device
  // current on this thread and records the start event. Never blocks. Throws CudaError.
  // Not thread-safe.
  [[nodiscard]] cudaStream_t stream() {
    if (!open_) {
      TAILBATCH_CUDA_CHECK(cudaSetDevice(device_));
      start_.record(stream_);
      open_ = true;
    }
    return stream_;
  }

  // The stream, without starting the batch's timing. Not thread-safe.
  [[nodiscard]] cudaStream_t raw_stream() const noexcept { return stream_; }

  // This slot's pinned host buffer, grown to at least min_bytes (contents discarded when it
  // grows; growing is slow, so size it in StreamPoolConfig). Do not grow it while copies
  // from it are in flight. Throws CudaError. Not thread-safe.
  PinnedBuffer& staging(std::size_t min_bytes = 0) {
    if (min_bytes > staging_.size()) {
      TAILBATCH_CUDA_CHECK(cudaSetDevice(device_));
      staging_.reserve(min_bytes);
    }
    return staging_;
  }

  // This slot's device buffer, grown to at least min_bytes (as staging(); cudaFree
  // synchronizes the device, another reason to size it up front). Throws CudaError. Not
  // thread-safe.
  DeviceBuffer& scratch(std::size_t min_bytes = 0) {
    if (min_bytes > scratch_.size()) {
      TAILBATCH_CUDA_CHECK(cudaSetDevice(device_));
      scratch_.reserve(min_bytes);
    }
    return scratch_;
  }

  // Waits for the work enqueued on the stream so far. If stream() started the batch's
  // timing, records the stop event, waits for it (spinning, or sleeping with
  // blocking_sync) and records the device time since the start event; a later stream()
  // call starts a new timed segment. Blocks. Throws CudaError (an asynchronous error of an
  // earlier kernel or copy surfaces here). Not thread-safe.
  void synchronize() {
    if (!open_) {
      TAILBATCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    open_ = false;
    stop_.record(stream_);
    stop_.synchronize();
    const float ms = stop_.elapsed_ms_since(start_);
    last_ = std::chrono::nanoseconds(std::llround(static_cast<double>(ms) * 1e6));
    histogram_->record(last_);
  }

  // The device time of the last synchronize() that closed a timed segment. Not thread-safe.
  [[nodiscard]] std::chrono::nanoseconds last_device_time() const noexcept { return last_; }

 private:
  friend class StreamPool;
  StreamLane(std::size_t index, std::size_t slot, int device, cudaStream_t stream, const StreamPoolConfig& config,
             LatencyHistogram* histogram)
      : index_(index),
        slot_(slot),
        device_(device),
        stream_(stream),
        start_(cudaEventDefault),
        stop_(config.blocking_sync ? cudaEventBlockingSync : cudaEventDefault),
        staging_(config.staging_bytes),
        scratch_(config.scratch_bytes),
        histogram_(histogram) {}

  // At the end of a lease: a batch that enqueued work and did not synchronize (its model
  // threw) is waited for, so that the next lease finds the slot's buffers idle.
  void end_lease() noexcept {
    if (open_) {
      open_ = false;
      (void)cudaStreamSynchronize(stream_);
      (void)cudaGetLastError();
    }
  }

  std::size_t index_;
  std::size_t slot_;
  int device_;
  cudaStream_t stream_;
  Event start_;
  Event stop_;
  PinnedBuffer staging_;
  DeviceBuffer scratch_;
  LatencyHistogram* histogram_;
  bool open_ = false;
  std::chrono::nanoseconds last_{0};
};

// CUDA streams as a LaneBackend. See the file comment.
//
// Thread-safety: size(), lane_capacity(), try_acquire(), acquire_for(), in_flight_approx(),
// free_slots_approx(), device_info() and device_time() are thread-safe. Exceptions: the constructor throws
// CudaError (the cause named), std::invalid_argument (a bad field) and std::bad_alloc;
// nothing else throws. The destructor waits for work still queued on the streams; leases
// must not outlive the pool.
class StreamPool {
 public:
  using Lane = StreamLane;

  // Move-only; holds one slot of one stream until destroyed, then returns it, waiting for
  // the stream first if the batch left work unsynchronized (LaneBackend in lanes.hpp).
  using Lease = tailbatch::detail::SlotLease<StreamPool, StreamLane>;

  // Opens the device, creates the streams, events and buffers. Blocks (device
  // initialization can take a second). Throws as the class comment says.
  explicit StreamPool(StreamPoolConfig config = {})
      : config_(validate(std::move(config))),
        info_(detail::open_device(config_.device, "StreamPool")),
        lane_slots_(config_.lanes, config_.lane_capacity) {
    try {
      streams_.reserve(config_.lanes);
      slots_.reserve(config_.lanes * config_.lane_capacity);
      for (std::size_t i = 0; i < config_.lanes; ++i) {
        streams_.emplace_back();
        for (std::size_t s = 0; s < config_.lane_capacity; ++s) {
          slots_.emplace_back(new StreamLane(i, s, config_.device, streams_.back().get(), config_, nullptr));
        }
      }
    } catch (const CudaError& e) {
      throw CudaError("StreamPool: creating " + std::to_string(config_.lanes) + " lanes on device " +
                          std::to_string(config_.device) + " (" + info_.name + ")",
                      e);
    }
    // Metrics are registered only once the lanes exist, so that a pool that failed to open
    // (and a FallbackLanes that fell back) leaves no empty CUDA series behind.
    if (config_.metrics != nullptr) {
      histogram_ = &config_.metrics->histogram("tailbatch_cuda_lane_device_seconds",
                                               "Device time of each batch on a CUDA lane, timed by events",
                                               config_.metric_labels);
    } else {
      own_histogram_ = std::make_unique<LatencyHistogram>();
      histogram_ = own_histogram_.get();
    }
    for (auto& slot : slots_) slot->histogram_ = histogram_;
    if (config_.metrics != nullptr) {
      in_flight_gauge_ = config_.metrics->gauge_callback(
          "tailbatch_cuda_lanes_in_flight", "Batches holding a CUDA lane right now", config_.metric_labels, [this] { return static_cast<double>(lane_slots_.total_in_flight()); });
    }
  }

  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  ~StreamPool() {
    in_flight_gauge_.reset();
    // Pinned buffers must not be freed under copies still queued on a stream.
    for (const Stream& s : streams_) (void)cudaStreamSynchronize(s.get());
  }

  // The number of streams. Thread-safe.
  [[nodiscard]] std::size_t size() const noexcept { return streams_.size(); }
  // The most leases one stream grants at once. Thread-safe.
  [[nodiscard]] std::size_t lane_capacity() const noexcept { return config_.lane_capacity; }

  // A lease on the least-loaded stream below its cap (the lowest index among equals), or
  // nullopt when all are at their cap. Takes a short lock; never allocates. Thread-safe.
  [[nodiscard]] std::optional<Lease> try_acquire() noexcept { return lease(lane_slots_.try_take()); }

  // As try_acquire, waiting up to `timeout` for a slot to free. Blocks. Thread-safe.
  [[nodiscard]] std::optional<Lease> acquire_for(std::chrono::nanoseconds timeout) {
    return lease(lane_slots_.take_for(timeout));
  }

  // Leases held on stream `index` right now; racy. Thread-safe.
  [[nodiscard]] std::size_t in_flight_approx(std::size_t index) const noexcept {
    return lane_slots_.in_flight(index);
  }

  // Lease slots free right now over all streams; racy. A Pipeline passes it to its batch
  // policy as BatchView::idle_lanes (lanes.hpp). Thread-safe.
  [[nodiscard]] std::size_t free_slots_approx() const noexcept { return lane_slots_.free_approx(); }

  // Lease slot i (stream i / lane_capacity(), slot i % lane_capacity()), for backends that
  // wrap the pool; use it only under a lease of that slot. Thread-safe.
  [[nodiscard]] StreamLane& slot_lane(std::size_t i) const noexcept { return *slots_[i]; }

  // The device the pool opened. Thread-safe.
  [[nodiscard]] const DeviceInfo& device_info() const noexcept { return info_; }
  // Device time per synchronize(), across all lanes. Thread-safe.
  [[nodiscard]] LatencyHistogram& device_time() noexcept { return *histogram_; }
  // The configuration in use. Thread-safe.
  [[nodiscard]] const StreamPoolConfig& config() const noexcept { return config_; }

 private:
  static StreamPoolConfig validate(StreamPoolConfig c) {
    if (c.lanes < 1) tailbatch::detail::throw_invalid_argument("StreamPool: lanes must be >= 1");
    if (c.lane_capacity < 1) tailbatch::detail::throw_invalid_argument("StreamPool: lane_capacity must be >= 1");
    if (c.device < 0) tailbatch::detail::throw_invalid_argument("StreamPool: device must be >= 0");
    return c;
  }

  friend Lease;

  std::optional<Lease> lease(std::optional<std::size_t> slot) noexcept {
    if (!slot) return std::nullopt;
    return Lease(this, *slot);
  }
  StreamLane& leased_lane(std::size_t slot) const noexcept { return *slots_[slot]; }
  std::size_t leased_index(std::size_t slot) const noexcept { return slots_[slot]->index(); }

  void give_back(std::size_t slot) noexcept {
    slots_[slot]->end_lease();
    lane_slots_.give_back(slot);
  }

  StreamPoolConfig config_;
  DeviceInfo info_;
  std::unique_ptr<LatencyHistogram> own_histogram_;
  LatencyHistogram* histogram_ = nullptr;
  std::vector<Stream> streams_;
  std::vector<std::unique_ptr<StreamLane>> slots_;  // stream i's slots at [i * capacity, (i + 1) * capacity)
  tailbatch::detail::LaneSlots lane_slots_;
  CallbackRegistration in_flight_gauge_;  // last: unregistered before the rest is destroyed
};

static_assert(LaneBackend<StreamPool>);

}  // namespace tailbatch::cuda
