// The reference classifier behind a Pipeline.
//
// Built as this plain C++ program it runs on two host lanes. Built by nvcc (the program
// classifier_pipeline_cuda, from examples/cuda/classifier_pipeline_cuda.cu, which includes
// this file) it runs on two CUDA stream lanes, or, when no GPU can be used, says why and
// falls back to host lanes: the log line comes from FallbackLanes through the sink given
// below, and the gauge tailbatch_lanes_host_fallback reports it to the metrics.
//
// It classifies a dozen sentences, then serves a burst from four client threads and prints
// what batching did (batches, mean batch size, latency percentiles).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#if defined(__CUDACC__)
#include <tailbatch/cuda.hpp>
#include <tailbatch/reference/cuda/classifier.hpp>
#endif

using namespace std::chrono_literals;
namespace tb = tailbatch;
namespace ref = tailbatch::reference;

int main() {
  const ref::Classifier clf;
  std::printf("model: vocabulary %u, embedding %u, hidden %u (%zu MiB first layer), CPU kernel %s\n",
              clf.config().vocab_size, clf.config().embed_dim, clf.config().hidden_dim,
              clf.first_layer_bytes() >> 20, std::string(ref::to_string(clf.kernel())).c_str());

  tb::MetricsRegistry registry;
  const tb::Labels labels = {{"pipeline", "classifier"}};

#if defined(__CUDACC__)
  using Lanes = tb::cuda::FallbackLanes;
  Lanes lanes(tb::cuda::FallbackLanesConfig{
      .device = tb::cuda::StreamPoolConfig{.lanes = 2},
      .host_lanes = 2,
      .log = [](std::string_view line) { std::printf("%.*s\n", static_cast<int>(line.size()), line.data()); },
      .metrics = &registry,
      .metric_labels = labels});
  std::optional<tb::cuda::DeviceClassifier> gpu;
  if (lanes.on_device()) gpu.emplace(clf, lanes.stream_pool()->device_info().device);
  const tb::cuda::DeviceClassifierModel model(clf, gpu ? &*gpu : nullptr);
#else
  using Lanes = tb::HostLanes;
  Lanes lanes(2);
  const ref::ClassifierModel model(clf);
  std::printf("running on 2 host lanes (built without CUDA)\n");
#endif

  tb::PipelineConfig<std::string> config;
  config.metrics = &registry;
  config.metric_labels = labels;
  tb::Pipeline<std::string, ref::Prediction, tb::FixedWindow, Lanes> pipeline(model, tb::FixedWindow(32, 2ms), config,
                                                                                lanes);

  const std::vector<std::string> sentences = {
      "a great, moving film",          "awful, boring plot",
      "Superb acting and a brilliant script!", "What a waste of time: dull and predictable.",
      "The package arrived on Tuesday.", "An excellent, charming little book.",
      "terrible service, rude staff",  "we watched it on a rainy sunday afternoon",
      "I loved every minute of it",    "The worst phone I ever owned",
      "meh",                           "The train leaves at noon from platform four"};
  std::vector<std::future<tb::Outcome<ref::Prediction>>> answers;
  for (const auto& s : sentences) answers.push_back(pipeline.submit(s));
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    auto outcome = answers[i].get();
    if (!outcome.ok()) {
      std::printf("  %-46s failed: %s\n", sentences[i].c_str(), std::string(outcome.message()).c_str());
      continue;
    }
    const ref::Prediction& p = outcome.value();
    std::printf("  %-46s %-8s %.2f\n", sentences[i].c_str(), std::string(ref::to_string(p.label)).c_str(),
                static_cast<double>(p.confidence()));
  }

  // A burst from four clients, with callback completion.
  constexpr int per_client = 250;
  std::atomic<int> ok{0};
  std::atomic<int> done{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < per_client; ++i) {
        pipeline.submit(sentences[static_cast<std::size_t>(c + i) % sentences.size()] + " #" + std::to_string(i),
                        [&](tb::Outcome<ref::Prediction>&& o) {
                          if (o.ok()) ok.fetch_add(1, std::memory_order_relaxed);
                          done.fetch_add(1, std::memory_order_release);
                        });
      }
    });
  }
  for (auto& t : clients) t.join();
  while (done.load(std::memory_order_acquire) < 4 * per_client) std::this_thread::sleep_for(1ms);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const tb::PipelineStats stats = pipeline.stats();
  const auto e2e = registry.histogram("tailbatch_pipeline_end_to_end_seconds", "End-to-end latency", labels).snapshot();
  const auto model_time = registry.histogram("tailbatch_pipeline_model_seconds", "Model time", labels).snapshot();
  std::printf("burst: %d of %d ok in %.2f s (%.0f requests/s)\n", ok.load(), 4 * per_client, seconds,
              4 * per_client / seconds);
  std::printf("batches: %llu, mean batch size %.1f\n", static_cast<unsigned long long>(stats.batches()),
              stats.batches() ? static_cast<double>(stats.batched_requests) / static_cast<double>(stats.batches()) : 0.0);
  std::printf("end to end: p50 %.2f ms, p99 %.2f ms; model per batch: p50 %.2f ms\n",
              static_cast<double>(e2e.percentile(50).count()) / 1e6, static_cast<double>(e2e.percentile(99).count()) / 1e6,
              static_cast<double>(model_time.percentile(50).count()) / 1e6);
#if defined(__CUDACC__)
  std::printf("tailbatch_lanes_host_fallback = %d\n", lanes.on_device() ? 0 : 1);
#endif
  return ok.load() == 4 * per_client ? 0 : 1;
}
