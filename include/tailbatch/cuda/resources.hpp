// Move-only owners of CUDA streams, events, pinned host memory and device memory.
//
// Each owner creates its handle in its constructor (throwing CudaError on failure) and
// releases it in its destructor, which never throws: an error while releasing (a device
// that has gone away) is ignored, since there is nothing left to do about it. A moved-from
// owner holds nothing. None is thread-safe: an owner has one owner thread at a time; the
// handles themselves follow the CUDA runtime's rules (a stream or event may be used from
// any thread).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include <tailbatch/cuda/error.hpp>

namespace tailbatch::cuda {

// A cudaStream_t created with cudaStreamNonBlocking: work on it never waits for the legacy
// default stream (and so for other libraries' default-stream work).
class Stream {
 public:
  // Creates a non-blocking stream on the current device. Throws CudaError. Not thread-safe.
  Stream() { TAILBATCH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  // The handle (nullptr once moved from). Not thread-safe.
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  // Blocks until all work on the stream is done. Throws CudaError. Not thread-safe.
  void synchronize() const { TAILBATCH_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  void reset() noexcept {
    if (stream_ != nullptr) (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
  }
  cudaStream_t stream_ = nullptr;
};

// A cudaEvent_t. Timing events (the default) measure elapsed device time between two
// records; cudaEventDisableTiming makes a lighter event for synchronization only.
class Event {
 public:
  // Creates an event with `flags` (cudaEventDefault, cudaEventDisableTiming, ...). Throws
  // CudaError. Not thread-safe.
  explicit Event(unsigned flags = cudaEventDefault) { TAILBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&event_, flags)); }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { reset(); }

  // The handle. Not thread-safe.
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }
  // Records the event on `stream`. Never blocks. Throws CudaError. Not thread-safe.
  void record(cudaStream_t stream) const { TAILBATCH_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  // Blocks until the recorded work is done. Throws CudaError. Not thread-safe.
  void synchronize() const { TAILBATCH_CUDA_CHECK(cudaEventSynchronize(event_)); }
  // Milliseconds of device time from `start` to this event; both recorded and complete.
  // Throws CudaError. Not thread-safe.
  [[nodiscard]] float elapsed_ms_since(const Event& start) const {
    float ms = 0.0f;
    TAILBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  void reset() noexcept {
    if (event_ != nullptr) (void)cudaEventDestroy(std::exchange(event_, nullptr));
  }
  cudaEvent_t event_ = nullptr;
};

// Page-locked ("pinned") host memory: the only host memory that cudaMemcpyAsync copies
// without staging it through a driver buffer, and so the only kind whose copies overlap
// kernels running on other streams.
class PinnedBuffer {
 public:
  // Holds nothing. Never throws. Not thread-safe.
  PinnedBuffer() noexcept = default;
  // Allocates `bytes` of pinned memory (slow: it maps and locks pages; allocate once and
  // reuse). Throws CudaError (cudaErrorMemoryAllocation). Not thread-safe.
  explicit PinnedBuffer(std::size_t bytes) : size_(bytes) {
    if (bytes > 0) TAILBATCH_CUDA_CHECK(cudaMallocHost(&data_, bytes));
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // The memory as an array of T (the caller keeps within size()). Not thread-safe.
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  // Makes the buffer at least `bytes` large, discarding its contents if it must grow
  // (to twice the old size or `bytes`, whichever is larger). Throws CudaError; on failure
  // the buffer is left empty. Not thread-safe.
  void reserve(std::size_t bytes) {
    if (bytes <= size_) return;
    const std::size_t grown = bytes > 2 * size_ ? bytes : 2 * size_;
    reset();
    *this = PinnedBuffer(grown);
  }

 private:
  void reset() noexcept {
    if (data_ != nullptr) (void)cudaFreeHost(std::exchange(data_, nullptr));
    size_ = 0;
  }
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// Device memory from cudaMalloc on the current device.
class DeviceBuffer {
 public:
  // Holds nothing. Never throws. Not thread-safe.
  DeviceBuffer() noexcept = default;
  // Allocates `bytes` on the current device. Throws CudaError (cudaErrorMemoryAllocation).
  // Not thread-safe.
  explicit DeviceBuffer(std::size_t bytes) : size_(bytes) {
    if (bytes > 0) TAILBATCH_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(data_);
  }
  // As PinnedBuffer::reserve. cudaFree synchronizes the device, so grow rarely (reserve
  // for the largest batch up front). Throws CudaError. Not thread-safe.
  void reserve(std::size_t bytes) {
    if (bytes <= size_) return;
    const std::size_t grown = bytes > 2 * size_ ? bytes : 2 * size_;
    reset();
    *this = DeviceBuffer(grown);
  }

 private:
  void reset() noexcept {
    if (data_ != nullptr) (void)cudaFree(std::exchange(data_, nullptr));
    size_ = 0;
  }
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tailbatch::cuda
