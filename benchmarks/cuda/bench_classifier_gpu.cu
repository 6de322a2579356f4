// The reference classifier on a GPU: batch scaling and lane (stream) overlap. Runs only on
// a machine with an NVIDIA GPU (benchmarks/gpu/run.sh); elsewhere it prints why and exits
// 77.
//
//   BM_Classifier_GPU/<batch>     one lane, batches of 1..64 pre-tokenized requests, each a
//                                 full round trip (pack, copy in, three kernels, copy out,
//                                 synchronize); items_per_second = requests per second.
//                                 Batch 1 is the baseline. Counter device_us_p50: the
//                                 event-timed device time of a batch.
//   BM_Lane_Overlap/<streams>     1, 2 or 4 host threads, each on its own stream of one
//                                 StreamPool, running batches of 32 back to back; wall time.
//                                 1 stream is the baseline: more streams pay when one
//                                 batch's copies and host work hide behind another's kernels.
//   BM_Classifier_CPU/<batch>     the CPU twin at 1 and 32 in the same binary, for scale.
//
// What it does not show: the Pipeline's queueing and batching delay (bench_batcher), nor
// tokenization (bench_reference_model's BM_Tokenize).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/cuda.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/cuda/classifier.hpp>

namespace {

using namespace tailbatch::cuda;
using namespace tailbatch::reference;

struct Fixture {
  Classifier cpu{};
  DeviceClassifier gpu{cpu, 0};
  std::vector<std::vector<std::uint32_t>> ids;

  Fixture() {
    std::uint64_t s = 1;
    for (int i = 0; i < 256; ++i) {
      std::vector<std::uint32_t> r(20);
      for (auto& t : r) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        t = static_cast<std::uint32_t>((s >> 33) % cpu.config().vocab_size);
      }
      ids.push_back(std::move(r));
    }
  }

  std::vector<std::span<const std::uint32_t>> batch(std::size_t n, std::size_t& next) const {
    std::vector<std::span<const std::uint32_t>> b(n);
    for (auto& r : b) {
      r = ids[next];
      next = (next + 1) % ids.size();
    }
    return b;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_Classifier_GPU(benchmark::State& state) {
  Fixture& f = fixture();
  const auto n = static_cast<std::size_t>(state.range(0));
  StreamPool pool(StreamPoolConfig{.lanes = 1, .staging_bytes = f.gpu.staging_bytes(64), .scratch_bytes = f.gpu.scratch_bytes(64)});
  std::vector<Prediction> out(n);
  std::size_t next = 0;
  auto lease = pool.try_acquire();
  for (int warm = 0; warm < 3; ++warm) f.gpu.forward(f.batch(n, next), out, lease->lane());
  pool.device_time().reset();
  for (auto _ : state) {
    const auto b = f.batch(n, next);
    f.gpu.forward(b, out, lease->lane());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["device_us_p50"] =
      static_cast<double>(pool.device_time().snapshot().percentile(50).count()) / 1e3;
}

void BM_Lane_Overlap(benchmark::State& state) {
  Fixture& f = fixture();
  const auto streams = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t batch = 32;
  constexpr int batches_per_thread = 20;
  StreamPool pool(StreamPoolConfig{.lanes = streams, .staging_bytes = f.gpu.staging_bytes(batch),
                                   .scratch_bytes = f.gpu.scratch_bytes(batch)});
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < streams; ++t) {
      threads.emplace_back([&, t] {
        auto lease = pool.try_acquire();
        std::vector<Prediction> out(batch);
        std::size_t next = t * 37;
        for (int i = 0; i < batches_per_thread; ++i) f.gpu.forward(f.batch(batch, next), out, lease->lane());
      });
    }
    for (auto& th : threads) th.join();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * streams * batch * batches_per_thread));
}

void BM_Classifier_CPU(benchmark::State& state) {
  Fixture& f = fixture();
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<Prediction> out(n);
  ClassifierWorkspace ws;
  std::size_t next = 0;
  for (auto _ : state) {
    f.cpu.forward(f.batch(n, next), out, ws);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
}

}  // namespace

BENCHMARK(BM_Classifier_GPU)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Lane_Overlap)->Arg(1)->Arg(2)->Arg(4)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Classifier_CPU)->Arg(1)->Arg(32)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  int driver = 0;
  int count = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0 || cudaGetDeviceCount(&count) != cudaSuccess ||
      count == 0) {
    std::fprintf(stderr, "bench_classifier_gpu: no usable CUDA device on this machine; nothing measured\n");
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
