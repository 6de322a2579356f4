// StreamPool: the error macro and configuration errors (checked everywhere), then, on a
// machine with a GPU, leasing (least-loaded, per-lane cap, waiting), event timing, the
// slots' reusable buffers, end-of-lease synchronization, out-of-memory at construction,
// metrics, and leasing from many threads. Without a GPU it checks the construction error
// and exits 77 (skipped).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/cuda.hpp>
#include <tailbatch/metrics.hpp>

#include "cuda_test_support.hpp"

using namespace std::chrono_literals;
using tailbatch::cuda::CudaError;
using tailbatch::cuda::StreamLane;
using tailbatch::cuda::StreamPool;
using tailbatch::cuda::StreamPoolConfig;

namespace {

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Keeps the device busy for about `ns` nanoseconds.
__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_ns();
  while (global_ns() - start < ns) {
  }
}

void check_error_macro() {
  try {
    TAILBATCH_CUDA_CHECK(cudaErrorInvalidValue);
    CHECK(false);
  } catch (const CudaError& e) {
    const std::string what = e.what();
    std::printf("CudaError reads: %s\n", what.c_str());
    CHECK(e.code() == cudaErrorInvalidValue);
    CHECK(std::string(e.name()) == "cudaErrorInvalidValue");
    CHECK(what.rfind("cudaErrorInvalidValue: ", 0) == 0);
    CHECK(contains(what, "test_stream_pool.cu:"));
    const CudaError wrapped("StreamPool: creating lanes", e);
    CHECK(std::string(wrapped.what()).rfind("StreamPool: creating lanes: cudaErrorInvalidValue", 0) == 0);
    CHECK(wrapped.code() == cudaErrorInvalidValue);
  }
  // The macro evaluates its argument once and passes success through.
  int calls = 0;
  TAILBATCH_CUDA_CHECK((++calls, cudaSuccess));
  CHECK(calls == 1);
}

void check_config_errors() {
  CHECK_THROWS_AS(StreamPool(StreamPoolConfig{.lanes = 0}), std::invalid_argument);
  CHECK_THROWS_AS(StreamPool(StreamPoolConfig{.lane_capacity = 0}), std::invalid_argument);
  CHECK_THROWS_AS(StreamPool(StreamPoolConfig{.device = -1}), std::invalid_argument);
  try {
    StreamPool p(StreamPoolConfig{.lanes = 0});
  } catch (const std::invalid_argument& e) {
    CHECK(contains(e.what(), "StreamPool: lanes"));
  }
}

void check_leasing() {
  StreamPool pool(StreamPoolConfig{.lanes = 3, .lane_capacity = 2});
  std::printf("device %d: %s (sm_%d%d)\n", pool.device_info().device, pool.device_info().name.c_str(),
              pool.device_info().compute_major, pool.device_info().compute_minor);
  CHECK(pool.size() == 3);
  CHECK(pool.lane_capacity() == 2);
  std::vector<StreamPool::Lease> held;
  for (std::size_t expected : {0u, 1u, 2u, 0u, 1u, 2u}) {
    auto lease = pool.try_acquire();
    CHECK(lease.has_value());
    if (!lease) return;
    CHECK(lease->index() == expected);
    held.push_back(std::move(*lease));
  }
  CHECK(!pool.try_acquire().has_value());
  CHECK(!pool.acquire_for(1ms).has_value());
  // The two slots of one stream share it but own separate buffers.
  CHECK(held[0].lane().raw_stream() == held[3].lane().raw_stream());
  CHECK(held[0].lane().slot() != held[3].lane().slot());
  CHECK(held[0].lane().staging(64).data() != held[3].lane().staging(64).data());
  CHECK(held[0].lane().raw_stream() != held[1].lane().raw_stream());
  CHECK(pool.in_flight_approx(1) == 2);
  held.erase(held.begin() + 1);  // frees a slot of stream 1
  CHECK(pool.in_flight_approx(1) == 1);
  auto again = pool.try_acquire();
  CHECK(again.has_value() && again->index() == 1);
}

void check_waiting() {
  StreamPool pool(StreamPoolConfig{.lanes = 1, .lane_capacity = 1});
  auto first = pool.try_acquire();
  CHECK(first.has_value());
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    first.reset();
  });
  auto second = pool.acquire_for(10s);  // bounded: a bug fails here instead of hanging
  CHECK(second.has_value());
  releaser.join();
}

void check_timing_and_buffers() {
  tailbatch::MetricsRegistry registry;
  StreamPool pool(StreamPoolConfig{.lanes = 1, .staging_bytes = 4096, .scratch_bytes = 4096, .metrics = &registry,
                                   .metric_labels = {{"pipeline", "test"}}});
  void* staging = nullptr;
  void* scratch = nullptr;
  {
    auto lease = pool.try_acquire();
    CHECK(lease.has_value());
    StreamLane& lane = lease->lane();
    CHECK(lane.staging().size() >= 4096);
    CHECK(lane.scratch().size() >= 4096);
    staging = lane.staging().data();
    scratch = lane.scratch().data();
    spin_kernel<<<1, 1, 0, lane.stream()>>>(2'000'000);  // about 2 ms
    TAILBATCH_CUDA_CHECK(cudaGetLastError());
    lane.synchronize();
    std::printf("2 ms spin timed at %.3f ms\n", static_cast<double>(lane.last_device_time().count()) / 1e6);
    CHECK(lane.last_device_time() >= 1ms);  // globaltimer ticks coarsely on some GPUs
    CHECK(lane.last_device_time() < 500ms);
  }
  CHECK(pool.device_time().snapshot().count() == 1);
  CHECK(registry.histogram("tailbatch_cuda_lane_device_seconds", "x", {{"pipeline", "test"}}).snapshot().count() == 1);
  CHECK(contains(registry.prometheus(), "tailbatch_cuda_lanes_in_flight"));
  {
    // The next lease of the slot finds the same buffers: nothing is allocated per batch.
    auto lease = pool.try_acquire();
    CHECK(lease->lane().staging(1024).data() == staging);
    CHECK(lease->lane().scratch(1024).data() == scratch);
    // A batch that enqueues work and never synchronizes (its model threw) is waited for when
    // the lease ends, so the next holder finds the stream idle.
    spin_kernel<<<1, 1, 0, lease->lane().stream()>>>(5'000'000);
  }
  auto lease = pool.try_acquire();
  CHECK(cudaStreamQuery(lease->lane().raw_stream()) == cudaSuccess);
  // A slot's buffers grow on demand.
  CHECK(lease->lane().staging(1 << 20).size() >= (1u << 20));
}

void check_construction_errors() {
  int count = 0;
  TAILBATCH_CUDA_CHECK(cudaGetDeviceCount(&count));
  CHECK_THROWS_AS(StreamPool(StreamPoolConfig{.device = count}), std::invalid_argument);
  try {
    StreamPool p(StreamPoolConfig{.lanes = 1, .staging_bytes = std::size_t{1} << 42});  // 4 TiB of pinned memory
    CHECK(false);
  } catch (const CudaError& e) {
    std::printf("out of memory reads: %s\n", e.what());
    CHECK(contains(e.what(), "StreamPool: creating 1 lanes on device"));
    CHECK(e.code() == cudaErrorMemoryAllocation);
  }
}

void check_many_threads() {
  StreamPool pool(StreamPoolConfig{.lanes = 2, .lane_capacity = 2});
  std::atomic<int> per_lane[2] = {0, 0};
  std::atomic<int> over_cap{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 7; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto lease = pool.acquire_for(10s);
        if (!lease) continue;
        const int now = ++per_lane[lease->index()];
        if (now > 2) ++over_cap;
        spin_kernel<<<1, 1, 0, lease->lane().stream()>>>(20'000);
        lease->lane().synchronize();
        --per_lane[lease->index()];
        ++done;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(over_cap.load() == 0);
  CHECK(done.load() == 7 * 50);
  CHECK(pool.device_time().snapshot().count() == 7 * 50);
}

}  // namespace

int main() {
  check_error_macro();
  check_config_errors();
  const std::string why = tailbatch::cuda_test::why_no_device();
  if (!why.empty()) {
    // What a user sees without a GPU: an exception naming the cause.
    try {
      StreamPool pool;
      CHECK(false);
    } catch (const CudaError& e) {
      std::printf("StreamPool without a GPU throws: %s\n", e.what());
      CHECK(contains(e.what(), "StreamPool: "));
    }
    if (tailbatch::cuda_test::failures() != 0) return tailbatch::cuda_test::finish("test_stream_pool");
    tailbatch::cuda_test::skip("StreamPool on a device not tested: " + why);
  }
  try {
    check_leasing();
    check_waiting();
    check_timing_and_buffers();
    check_construction_errors();
    check_many_threads();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  return tailbatch::cuda_test::finish("test_stream_pool");
}
