// bench_libtorch: the libtorch encoder of examples/libtorch/ (2 layers, d_model 64) on one
// lane with one intra-op thread, requests of 9 to 16 tokens (one TokenBudget bucket).
//
//   BM_Libtorch_Batch/b       the module called directly on batches of b (1, 8, 32):
//                             throughput by batch size (items = requests)
//   BM_Libtorch_Direct/32     a loop calling the module on consecutive batches of 32
//   BM_Libtorch_Pipeline/32   the same requests submitted one by one to a Pipeline
//                             (TokenBudget, max_batch 32), which forms the same batches of 32
//                             and runs them on its lane: tailbatch's overhead at saturation
//                             is the gap between the two (goal: at most 3 % fewer items/s)
//
// Each Direct and Pipeline iteration runs 4 batches (128 requests); both are timed in real
// time. The Pipeline is kept saturated: a round of 128 stays queued ahead of the lane. Not shown:
// several lanes, or the cost of a window (the requests here arrive all at once, so every batch
// closes by its size).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "encoder_pipeline.hpp"

namespace tl = tailbatch_libtorch;

namespace {

constexpr std::size_t batches_per_iteration = 4;

struct Setup {
  std::filesystem::path weights;
  std::vector<tl::TokenizedText> requests;  // 9 to 16 tokens each

  Setup() {
    weights = std::filesystem::temp_directory_path() /
              ("tailbatch_bench_libtorch_" +
               std::to_string(static_cast<unsigned long>(::getpid())) + ".pt");
    tl::save_encoder(tl::make_encoder(tl::EncoderConfig{}, 7), weights);
    const tl::TextTokenizer tokenize{tl::EncoderConfig{}};
    for (const std::string& t : tl::sample_texts(20000)) {
      tl::TokenizedText r = tokenize(t, requests.size());
      if (r.ids.size() >= 9 && r.ids.size() <= 16) requests.push_back(std::move(r));
      if (requests.size() == 4096) break;
    }
    tl::set_intra_op_threads(1, 1);
  }
  ~Setup() {
    std::error_code ec;
    std::filesystem::remove(weights, ec);
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

// Calls the module on `count` consecutive batches of b requests from `at` (wrapping to the
// start), advancing `at`.
void encode_slices(tl::TorchLane& lane, const std::vector<tl::TokenizedText>& requests,
                   std::size_t& at, std::size_t b, std::size_t count,
                   std::vector<tl::Encoding>& out) {
  if (at + b * count > requests.size()) at = 0;
  for (std::size_t k = 0; k < count; ++k, at += b) {
    tl::encode_batch(lane.module(), std::span(requests.data() + at, b), out, lane.scratch());
    benchmark::DoNotOptimize(out.data());
  }
}

// The module alone on batches of b (1 batch an iteration), or on `count` batches of b an
// iteration (Direct), on lane 0 of a fresh TorchLanes.
void run_direct(benchmark::State& state, std::size_t count) {
  const auto b = static_cast<std::size_t>(state.range(0));
  Setup& s = setup();
  tl::TorchLanes lanes(1, s.weights);
  std::vector<tl::Encoding> out(b);
  std::size_t at = 0;
  for (auto _ : state) encode_slices(lanes.lane(0), s.requests, at, b, count, out);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(b * count));
}

void BM_Libtorch_Batch(benchmark::State& state) { run_direct(state, 1); }
BENCHMARK(BM_Libtorch_Batch)->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Libtorch_Direct(benchmark::State& state) { run_direct(state, batches_per_iteration); }
BENCHMARK(BM_Libtorch_Direct)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Libtorch_Pipeline(benchmark::State& state) {
  const auto b = static_cast<std::size_t>(state.range(0));
  const std::size_t n = b * batches_per_iteration;
  Setup& s = setup();
  tl::TorchLanes lanes(1, s.weights);
  std::atomic<std::size_t> done{0};  // outlives the Pipeline, whose callbacks count here
  // A window long enough that a batch never leaves short: it closes at b requests.
  tl::EncoderPipeline pipeline(tl::EncoderModel{},
                               tl::encoder_policy(b, std::chrono::milliseconds(50)),
                               tl::encoder_pipeline_config(), lanes);
  std::size_t at = 0, submitted = 0;
  auto submit_round = [&] {
    if (at + n > s.requests.size()) at = 0;
    for (std::size_t i = 0; i < n; ++i, ++at) {
      pipeline.submit(s.requests[at], [&done](tailbatch::Outcome<tl::Encoding>&& o) {
        benchmark::DoNotOptimize(o);
        done.fetch_add(1, std::memory_order_release);
        done.notify_one();
      });
    }
    submitted += n;
  };
  auto wait_until = [&done](std::size_t count) {
    for (std::size_t d = done.load(std::memory_order_acquire); d < count;
         d = done.load(std::memory_order_acquire)) {
      done.wait(d, std::memory_order_acquire);
    }
  };
  // One round stays queued ahead of the lane, so that it never waits for the next round's
  // submits: each iteration submits a round and waits for the round before it. The same
  // round is in flight when the timer starts and when it stops.
  submit_round();
  for (auto _ : state) {
    submit_round();
    wait_until(submitted - n);
  }
  wait_until(submitted);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  if (pipeline.stats().count(tailbatch::Status::ok) != submitted)
    state.SkipWithError("a request did not complete ok");
}
BENCHMARK(BM_Libtorch_Pipeline)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
