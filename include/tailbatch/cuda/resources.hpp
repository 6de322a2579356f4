// Move-only owners of CUDA streams, events, pinned host memory and device memory, all
// built on one RAII template, UniqueHandle<Handle, Destroy>.
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

// Owns one handle: calls Destroy(handle) when destroyed or reset, unless the handle is
// Handle{} (empty). Move-only; a moved-from UniqueHandle is empty. Never throws.
// Thread-safety: not thread-safe (one owner thread at a time).
template <class Handle, void (*Destroy)(Handle) noexcept>
class UniqueHandle {
 public:
  // Empty. Never throws. Not thread-safe.
  UniqueHandle() noexcept = default;
  // Takes ownership of `handle`. Never throws. Not thread-safe.
  explicit UniqueHandle(Handle handle) noexcept : handle_(handle) {}
  UniqueHandle(UniqueHandle&& other) noexcept : handle_(std::exchange(other.handle_, Handle{})) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    if (this != &other) reset(std::exchange(other.handle_, Handle{}));
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  // The handle (Handle{} when empty). Never throws. Not thread-safe.
  [[nodiscard]] const Handle& get() const noexcept { return handle_; }
  // Destroys the held handle, if any, and holds `handle` instead. Never throws. Not
  // thread-safe.
  void reset(Handle handle = Handle{}) noexcept {
    const Handle old = std::exchange(handle_, handle);
    if (!(old == Handle{})) Destroy(old);
  }

 private:
  Handle handle_{};
};

namespace detail {

inline void destroy_stream(cudaStream_t s) noexcept { (void)cudaStreamDestroy(s); }
inline void destroy_event(cudaEvent_t e) noexcept { (void)cudaEventDestroy(e); }

// A block of memory and its size, so that both move (and empty) together.
struct Allocation {
  void* data = nullptr;
  std::size_t size = 0;
  friend bool operator==(const Allocation&, const Allocation&) = default;
};
inline void free_pinned(Allocation a) noexcept {
  if (a.data != nullptr) (void)cudaFreeHost(a.data);
}
inline void free_device(Allocation a) noexcept {
  if (a.data != nullptr) (void)cudaFree(a.data);
}

// Allocate `bytes` into *p, throwing CudaError (named after the runtime call) on failure.
inline void allocate_pinned(void** p, std::size_t bytes) { TAILBATCH_CUDA_CHECK(cudaMallocHost(p, bytes)); }
inline void allocate_device(void** p, std::size_t bytes) { TAILBATCH_CUDA_CHECK(cudaMalloc(p, bytes)); }

// What PinnedBuffer and DeviceBuffer share: an Allocation owned through UniqueHandle,
// obtained from Allocate (allocate_pinned or allocate_device).
template <void (*Allocate)(void**, std::size_t), void (*Free)(Allocation) noexcept>
class OwnedMemory {
 public:
  OwnedMemory() noexcept = default;
  explicit OwnedMemory(std::size_t bytes) {
    if (bytes == 0) return;
    void* data = nullptr;
    Allocate(&data, bytes);
    memory_.reset(Allocation{data, bytes});
  }

  [[nodiscard]] void* data() const noexcept { return memory_.get().data; }
  [[nodiscard]] std::size_t size() const noexcept { return memory_.get().size; }
  // The memory as an array of T (the caller keeps within size()). Not thread-safe.
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(memory_.get().data);
  }
  // Makes the buffer at least `bytes` large, discarding its contents if it must grow (to
  // twice the old size or `bytes`, whichever is larger). Throws CudaError; on failure the
  // buffer is left empty. Not thread-safe.
  void reserve(std::size_t bytes) {
    if (bytes <= size()) return;
    const std::size_t grown = bytes > 2 * size() ? bytes : 2 * size();
    memory_.reset();
    *this = OwnedMemory(grown);
  }

 private:
  UniqueHandle<Allocation, Free> memory_;
};

}  // namespace detail

// A cudaStream_t created with cudaStreamNonBlocking: work on it never waits for the legacy
// default stream (and so for other libraries' default-stream work).
class Stream {
 public:
  // Creates a non-blocking stream on the current device. Throws CudaError. Not thread-safe.
  Stream() {
    cudaStream_t s = nullptr;
    TAILBATCH_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_.reset(s);
  }

  // The handle (nullptr once moved from). Not thread-safe.
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_.get(); }
  // Blocks until all work on the stream is done. Throws CudaError. Not thread-safe.
  void synchronize() const { TAILBATCH_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }

 private:
  UniqueHandle<cudaStream_t, detail::destroy_stream> stream_;
};

// A cudaEvent_t. Timing events (the default) measure elapsed device time between two
// records; cudaEventDisableTiming makes a lighter event for synchronization only.
class Event {
 public:
  // Creates an event with `flags` (cudaEventDefault, cudaEventDisableTiming, ...). Throws
  // CudaError. Not thread-safe.
  explicit Event(unsigned flags = cudaEventDefault) {
    cudaEvent_t e = nullptr;
    TAILBATCH_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    event_.reset(e);
  }

  // The handle (nullptr once moved from). Not thread-safe.
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_.get(); }
  // Records the event on `stream`. Never blocks. Throws CudaError. Not thread-safe.
  void record(cudaStream_t stream) const { TAILBATCH_CUDA_CHECK(cudaEventRecord(event_.get(), stream)); }
  // Blocks until the recorded work is done. Throws CudaError. Not thread-safe.
  void synchronize() const { TAILBATCH_CUDA_CHECK(cudaEventSynchronize(event_.get())); }
  // Milliseconds of device time from `start` to this event; both recorded and complete.
  // Throws CudaError. Not thread-safe.
  [[nodiscard]] float elapsed_ms_since(const Event& start) const {
    float ms = 0.0f;
    TAILBATCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), event_.get()));
    return ms;
  }

 private:
  UniqueHandle<cudaEvent_t, detail::destroy_event> event_;
};

// Page-locked ("pinned") host memory: the only host memory that cudaMemcpyAsync copies
// without staging it through a driver buffer, and so the only kind whose copies can overlap
// kernels running on other streams. PinnedBuffer() holds nothing; PinnedBuffer(bytes)
// allocates (slow: it maps and locks pages; allocate once and reuse) and throws CudaError
// (cudaErrorMemoryAllocation). data(), size(), as<T>() and reserve(bytes) as in
// detail::OwnedMemory. Not thread-safe.
class PinnedBuffer : public detail::OwnedMemory<detail::allocate_pinned, detail::free_pinned> {
 public:
  using OwnedMemory::OwnedMemory;
};

// Device memory from cudaMalloc on the current device. DeviceBuffer() holds nothing;
// DeviceBuffer(bytes) allocates on the current device and throws CudaError
// (cudaErrorMemoryAllocation). reserve(bytes) as PinnedBuffer's; cudaFree synchronizes the
// device, so grow rarely (reserve for the largest batch up front). Not thread-safe.
class DeviceBuffer : public detail::OwnedMemory<detail::allocate_device, detail::free_device> {
 public:
  using OwnedMemory::OwnedMemory;
};

}  // namespace tailbatch::cuda
