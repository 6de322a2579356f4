// FallbackLanes and the classifier adapter behind a Pipeline. Runs everywhere: without a
// GPU the StreamPool cannot open (no driver, no device) and the lanes fall back to the
// host; with one, the streams open, and a StreamPool asked for 4 TiB of pinned memory
// fails with out-of-memory and falls back instead. Either way the fallback must be logged
// (to the user's sink) and visible in the metrics, and the Pipeline's answers must equal
// the CPU twin's.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <tailbatch/cuda.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/cuda/classifier.hpp>

#include "cuda_test_support.hpp"
#include "reference_test_support.hpp"

using namespace std::chrono_literals;
using namespace tailbatch;
using namespace tailbatch::cuda;
using namespace tailbatch::reference;

namespace {

// Runs texts through a Pipeline on `lanes` and compares with the CPU twin: logits bit for
// bit (the GPU computes them in the same order), labels equal.
void check_pipeline(FallbackLanes& lanes, const Classifier& clf) {
  std::optional<DeviceClassifier> gpu;
  if (lanes.on_device()) gpu.emplace(clf, lanes.stream_pool()->device_info().device);
  const DeviceClassifierModel model(clf, gpu ? &*gpu : nullptr);
  Pipeline<std::string, Prediction, FixedWindow, FallbackLanes> pipeline(model, FixedWindow(8, 1ms), {}, lanes);
  const std::vector<std::string> texts = {"a great, moving film", "awful, boring plot", "The package arrived on Tuesday.",
                                          "superb", "dull dull dull", "", "the the the", "a moving, awful film"};
  std::vector<std::future<tailbatch::Outcome<Prediction>>> futures;
  for (int round = 0; round < 5; ++round) {
    for (const auto& t : texts) futures.push_back(pipeline.submit(t));
  }
  std::size_t mismatched = 0;
  for (std::size_t i = 0; i < futures.size(); ++i) {
    if (futures[i].wait_for(30s) != std::future_status::ready) {
      CHECK(false);
      return;
    }
    auto outcome = futures[i].get();
    CHECK(outcome.ok());
    if (!outcome.ok()) {
      std::fprintf(stderr, "request failed: %s\n", std::string(outcome.message()).c_str());
      continue;
    }
    const Prediction want = clf.classify(texts[i % texts.size()]);
    const Prediction& got = outcome.value();
    mismatched += !tailbatch::test::same_logits(got, want) || got.label != want.label;
  }
  CHECK(mismatched == 0);
}

}  // namespace

int main() {
  const std::string why = tailbatch::cuda_test::why_no_device();
  std::printf("%s\n", why.empty() ? "a GPU is present: forcing the fallback with an impossible allocation"
                                  : ("no GPU here (" + why + "): the fallback is the real one").c_str());
  try {
    CHECK_THROWS_AS(FallbackLanes(FallbackLanesConfig{.host_lanes = 0}), std::invalid_argument);

    const Classifier clf(ClassifierConfig{.vocab_size = 4096, .embed_dim = 64, .hidden_dim = 1024});

    // The fallback: logged, counted, and it works.
    std::vector<std::string> log;
    MetricsRegistry registry;
    FallbackLanesConfig config{.host_lanes = 2,
                               .log = [&](std::string_view line) { log.emplace_back(line); },
                               .metrics = &registry,
                               .metric_labels = {{"pipeline", "classifier"}}};
    if (why.empty()) config.device.staging_bytes = std::size_t{1} << 42;  // 4 TiB pinned: out of memory
    {
      FallbackLanes lanes(config);
      CHECK(!lanes.on_device());
      CHECK(lanes.size() == 2);
      CHECK(lanes.host_lanes() != nullptr);
      CHECK(lanes.stream_pool() == nullptr);
      CHECK(lanes.free_slots_approx() == 2);  // host lanes of capacity 1, none leased
      {
        auto lease = lanes.try_acquire();
        CHECK(lease.has_value());
        CHECK(lanes.free_slots_approx() == (lease ? 1u : 2u));
      }
      CHECK(lanes.free_slots_approx() == 2);
      std::printf("fallback reason: %s\n", lanes.fallback_reason().c_str());
      CHECK(contains(lanes.fallback_reason(), "StreamPool: "));
      if (why.empty()) CHECK(contains(lanes.fallback_reason(), "cudaErrorMemoryAllocation"));
      CHECK(log.size() == 1);
      if (!log.empty()) {
        std::printf("log: %s\n", log[0].c_str());
        CHECK(contains(log[0], "falling back to 2 host lane(s)"));
        CHECK(contains(log[0], lanes.fallback_reason()));
      }
      const std::string exposition = registry.prometheus();
      CHECK(contains(exposition, "tailbatch_lanes_host_fallback{pipeline=\"classifier\"} 1"));
      CHECK(!contains(exposition, "tailbatch_cuda_lane"));  // a pool that never opened registers nothing
      check_pipeline(lanes, clf);
    }

    // Without permission to fall back, the StreamPool's error propagates.
    config.fall_back_to_host = false;
    config.metrics = nullptr;
    CHECK_THROWS_AS(FallbackLanes{config}, CudaError);

    if (why.empty()) {
      // A GPU: the streams open, the log says so, and the Pipeline runs on the device.
      log.clear();
      MetricsRegistry device_registry;
      FallbackLanes lanes(FallbackLanesConfig{.device = StreamPoolConfig{.lanes = 2},
                                              .log = [&](std::string_view line) { log.emplace_back(line); },
                                              .metrics = &device_registry});
      CHECK(lanes.on_device());
      CHECK(log.size() == 1 && contains(log[0], "CUDA stream lane(s)"));
      CHECK(contains(device_registry.prometheus(), "tailbatch_lanes_host_fallback 0"));
      check_pipeline(lanes, clf);
      CHECK(lanes.stream_pool()->device_time().snapshot().count() > 0);
    } else {
      std::printf("note: the on-device branch of this test needs a GPU and did not run\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  return tailbatch::cuda_test::finish("test_fallback_lanes");
}
