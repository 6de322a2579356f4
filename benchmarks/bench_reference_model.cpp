// The reference classifier on the CPU: what batching buys through weight reuse, and what
// tokenization costs on its own.
//
//   BM_Classifier_CPU/<batch>           the model (automatic kernel) on pre-tokenized
//                                       requests; items_per_second = requests per second.
//                                       Batch 1 is the baseline: the ratio batch 32 / batch 1
//                                       is the figure docs/performance.md records.
//   BM_Classifier_CPU_Portable/<batch>  the same with the portable kernel (SSE2 on x86-64),
//                                       which any build runs: it shows how much of the gain
//                                       depends on wide SIMD.
//   BM_Tokenize                         text to ids for one review-sized text;
//                                       items_per_second = texts per second.
//
// What it does not show: the Pipeline around the model (bench_batcher), queueing, or a
// GPU (benchmarks/cuda/, run by benchmarks/gpu/run.sh).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tailbatch/reference/classifier.hpp>

namespace {

using namespace tailbatch::reference;

// Review-like texts built from a fixed word list (deterministic, about 20 words each).
std::vector<std::string> make_corpus(std::size_t count) {
  static constexpr std::string_view words[] = {
      "the", "film", "was", "a", "great", "boring", "plot", "and", "acting", "with", "moving", "score",
      "of", "this", "book", "is", "not", "awful", "script", "director", "cast", "camera", "scene", "to",
      "in", "it", "story", "phone", "battery", "screen", "delivery", "service", "excellent", "slow",
      "ending", "characters", "music", "pacing", "dull", "beautiful", "hotel", "room", "staff", "food"};
  std::vector<std::string> corpus;
  std::uint64_t state = 42;
  for (std::size_t i = 0; i < count; ++i) {
    std::string text;
    for (int w = 0; w < 20; ++w) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      text += words[(state >> 33) % std::size(words)];
      text += (w % 7 == 6) ? ". " : " ";
    }
    corpus.push_back(std::move(text));
  }
  return corpus;
}

const Classifier& model(CpuKernel kernel) {
  static const Classifier automatic{};
  static const Classifier portable{ClassifierConfig{.cpu_kernel = CpuKernel::portable}};
  return kernel == CpuKernel::portable ? portable : automatic;
}

void run_classifier(benchmark::State& state, CpuKernel kernel) {
  const Classifier& clf = model(kernel);
  const auto batch = static_cast<std::size_t>(state.range(0));
  const std::vector<std::string> corpus = make_corpus(256);
  std::vector<std::vector<std::uint32_t>> ids;
  for (const auto& text : corpus) ids.push_back(clf.tokenizer().tokenize(text));
  std::vector<std::span<const std::uint32_t>> requests(batch);
  std::vector<Prediction> out(batch);
  ClassifierWorkspace ws;
  std::size_t next = 0;
  for (auto _ : state) {
    for (auto& r : requests) {
      r = ids[next];
      next = (next + 1) % ids.size();
    }
    clf.forward(requests, out, ws);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * batch));
  state.SetLabel(std::string(to_string(clf.kernel())) + ", first layer " +
                 std::to_string(clf.first_layer_bytes() >> 20) + " MiB");
}

void BM_Classifier_CPU(benchmark::State& state) { run_classifier(state, CpuKernel::automatic); }
void BM_Classifier_CPU_Portable(benchmark::State& state) { run_classifier(state, CpuKernel::portable); }

void BM_Tokenize(benchmark::State& state) {
  const Classifier& clf = model(CpuKernel::automatic);
  const std::vector<std::string> corpus = make_corpus(256);
  std::vector<std::uint32_t> ids;
  ids.reserve(256);
  std::size_t next = 0;
  std::int64_t bytes = 0;
  for (auto _ : state) {
    ids.clear();
    const std::string& text = corpus[next];
    next = (next + 1) % corpus.size();
    benchmark::DoNotOptimize(clf.tokenizer().tokenize(text, ids));
    benchmark::DoNotOptimize(ids.data());
    bytes += static_cast<std::int64_t>(text.size());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(bytes);
}

}  // namespace

BENCHMARK(BM_Classifier_CPU)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Classifier_CPU_Portable)->Arg(1)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Tokenize)->Unit(benchmark::kNanosecond);

BENCHMARK_MAIN();
