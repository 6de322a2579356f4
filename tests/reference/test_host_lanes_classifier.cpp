// The reference classifier behind a Pipeline on host lanes: every response equals the
// request's prediction alone, bit for bit, whatever batch and lane it ran in.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/lanes.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier_model.hpp>

#include "reference_test_support.hpp"
#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using namespace tailbatch;
using namespace tailbatch::reference;

namespace {

using tailbatch::test::same_bits;

std::vector<std::string> texts(std::size_t n) { return tailbatch::test::sample_texts(n); }

}  // namespace

TEST_CASE("the classifier on host lanes answers each request as it would alone") {
  const Classifier clf(ClassifierConfig{.vocab_size = 4096, .embed_dim = 64, .hidden_dim = 1024});
  const ClassifierModel model(clf);
  HostLanes lanes(2, 1);
  PipelineConfig<std::string> config;
  config.drain_timeout = 10s;
  Pipeline<std::string, Prediction> pipeline(model, FixedWindow(16, 1ms), config, lanes);

  const std::vector<std::string> all = texts(400 / tailbatch::test::sanitizer_slowdown + 40);
  const std::size_t producers = 4;
  std::vector<std::vector<std::future<Outcome<Prediction>>>> futures(producers);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = p; i < all.size(); i += producers) futures[p].push_back(pipeline.submit(all[i]));
    });
  }
  for (auto& t : threads) t.join();

  std::size_t ok = 0;
  std::size_t mismatched = 0;
  for (std::size_t p = 0; p < producers; ++p) {
    for (std::size_t k = 0; k < futures[p].size(); ++k) {
      REQUIRE(futures[p][k].wait_for(30s) == std::future_status::ready);
      Outcome<Prediction> o = futures[p][k].get();
      REQUIRE(o.ok());
      ++ok;
      mismatched += !same_bits(o.value(), clf.classify(all[p + k * producers]));
    }
  }
  CHECK(ok == all.size());
  CHECK(mismatched == 0);
  pipeline.shutdown();
  const auto stats = pipeline.stats();
  CHECK(stats.count(Status::ok) == all.size());
  CHECK(stats.batches() >= 1);
}

TEST_CASE("batches formed on the manual clock classify the lexicon sentences") {
  const Classifier& clf = [] () -> const Classifier& {
    static const Classifier model{};
    return model;
  }();
  ManualClock clock;
  PipelineConfig<std::string> config;
  Pipeline<std::string, Prediction, FixedWindow, HostLanes, tailbatch::AdmitAll, ManualClock> pipeline(
      ClassifierModel(clf), FixedWindow(4, 5ms), config, clock);
  auto good = pipeline.submit("a great, moving film");
  auto bad = pipeline.submit("awful, boring plot");
  auto plain = pipeline.submit("The package arrived on Tuesday.");
  CHECK(pipeline.poll().batches == 0);  // three of four: the window is still open
  clock.advance(5ms);
  CHECK(pipeline.poll().batches == 1);
  REQUIRE(good.wait_for(0s) == std::future_status::ready);
  CHECK(good.get().value().label == Sentiment::positive);
  CHECK(bad.get().value().label == Sentiment::negative);
  CHECK(plain.get().value().label == Sentiment::neutral);
}
