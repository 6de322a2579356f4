// A ResultCache in front of the reference classifier's Pipeline.
//
// Four clients send 4,000 requests drawn from 300 texts, a few of them very popular (the
// way real traffic repeats). Repeats already answered are hits and never reach the queue;
// repeats of a text still in flight join it (coalesced) instead of taking a batch slot;
// only the rest run the model. Prints where the requests went and the cache's metrics.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/result_cache.hpp>

namespace tb = tailbatch;
namespace ref = tailbatch::reference;
using namespace std::chrono_literals;

int main() {
  ref::ClassifierConfig cc;
  cc.hidden_dim = 4096;  // a smaller model than the default: the example runs in a second
  const ref::Classifier clf(cc);
  const ref::ClassifierModel model(clf);
  tb::HostLanes lanes(2);
  tb::MetricsRegistry registry;
  const tb::Labels labels = {{"model", "classifier"}};

  tb::PipelineConfig<std::string> pc;
  pc.metrics = &registry;
  pc.metric_labels = labels;
  tb::Pipeline<std::string, ref::Prediction, tb::FixedWindow> pipeline(model, tb::FixedWindow(32, 2ms), pc, lanes);

  // Bounded by entries and by bytes (a Prediction is fixed-size; the key's text is not).
  tb::ResultCache<std::string, ref::Prediction> cache({
      .max_entries = 100,
      .max_bytes = 64 * 1024,
      .size_of = [](const std::string& text, const ref::Prediction&) { return text.size() + sizeof(ref::Prediction); },
      .ttl = 60s,
      .metrics = &registry,
      .metric_labels = labels,
  });

  std::vector<std::string> texts;
  const char* moods[] = {"a great, moving film", "awful, boring plot", "an excellent, charming book",
                         "terrible service, rude staff", "the train leaves at noon"};
  for (int i = 0; i < 300; ++i) texts.push_back(std::string(moods[i % 5]) + " (review " + std::to_string(i) + ")");

  constexpr int clients = 4;
  constexpr int per_client = 1000;
  std::atomic<int> done{0};
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c) + 1);
      // A few texts take most of the traffic: index = 300 * u^3.
      std::uniform_real_distribution<double> u(0.0, 1.0);
      for (int i = 0; i < per_client; ++i) {
        const double x = u(rng);
        const auto k = static_cast<std::size_t>(300.0 * x * x * x);
        cache.submit(pipeline, texts[k % texts.size()], {}, [&](tb::Outcome<ref::Prediction>&& o) {
          if (o.ok()) ok.fetch_add(1, std::memory_order_relaxed);
          done.fetch_add(1, std::memory_order_release);
        });
        if (i % 8 == 0) std::this_thread::sleep_for(200us);  // clients pace themselves a little
      }
    });
  }
  for (auto& t : threads) t.join();
  while (done.load(std::memory_order_acquire) < clients * per_client) std::this_thread::sleep_for(1ms);
  pipeline.shutdown();

  const tb::ResultCacheStats s = cache.stats();
  const tb::PipelineStats p = pipeline.stats();
  std::printf("%d requests, %d ok\n", clients * per_client, ok.load());
  std::printf("  hits       %6llu  answered from the cache, never queued\n", static_cast<unsigned long long>(s.hits));
  std::printf("  coalesced  %6llu  joined an identical request in flight\n",
              static_cast<unsigned long long>(s.coalesced));
  std::printf("  misses     %6llu  ran the model\n", static_cast<unsigned long long>(s.misses));
  std::printf("the Pipeline saw %llu requests in %llu batches; the cache holds %zu entries, %zu bytes "
              "(%llu evicted)\n",
              static_cast<unsigned long long>(p.submitted), static_cast<unsigned long long>(p.batches()), s.entries,
              s.bytes, static_cast<unsigned long long>(s.evictions));

  std::printf("\n");
  const std::string text = registry.prometheus();
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    if (line.rfind("tailbatch_cache_", 0) == 0) std::printf("%s\n", line.c_str());
    pos = end == std::string::npos ? text.size() : end + 1;
  }
  return ok.load() == clients * per_client ? 0 : 1;
}
