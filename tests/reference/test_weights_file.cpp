// The reference classifier with its weights mapped from a file: the same bits as the
// weights generated in memory, a file that does not fit refused, and residency reported.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/weights_file.hpp>

#include "tailbatch_test.hpp"

#if TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE

#include <unistd.h>

using namespace tailbatch::reference;

namespace {

ClassifierConfig small_config() {
  return ClassifierConfig{.seed = 77, .vocab_size = 2048, .embed_dim = 64, .hidden_dim = 1024, .max_tokens = 48};
}

// A file in the temporary directory, removed when it goes out of scope.
struct TempPath {
  explicit TempPath(const std::string& stem)
      : path((std::filesystem::temp_directory_path() /
              (stem + "-" + std::to_string(::getpid()) + ".weights")).string()) {}
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  ~TempPath() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  std::string path;
};

bool same_bits(const Prediction& a, const Prediction& b) {
  return std::memcmp(a.logits.data(), b.logits.data(), sizeof(a.logits)) == 0 &&
         std::memcmp(a.probabilities.data(), b.probabilities.data(), sizeof(a.probabilities)) == 0 &&
         a.label == b.label && a.truncated == b.truncated;
}

bool same_floats(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

}  // namespace

TEST_CASE("a classifier mapped from a weights file gives bitwise the predictions of the generated one") {
  const Classifier generated(small_config());
  const TempPath file("tailbatch-test-weights");
  write_weights_file(generated, file.path);
  const Classifier mapped = load_classifier(file.path, ClassifierConfig{.max_tokens = 48});

  CHECK(mapped.config().seed == 77);
  CHECK(mapped.config().vocab_size == 2048);
  CHECK(mapped.config().embed_dim == 64);
  CHECK(mapped.config().hidden_dim == 1024);
  const ClassifierWeights a = generated.weights();
  const ClassifierWeights b = mapped.weights();
  CHECK(same_floats(a.embeddings, b.embeddings));
  CHECK(same_floats(a.w1, b.w1));
  CHECK(same_floats(a.b1, b.b1));
  CHECK(same_floats(a.w2, b.w2));
  CHECK(same_floats(a.b2, b.b2));

  // A fixed input set: texts with and without lexicon words, then 64 random requests
  // (some longer than max_tokens), run as one batch and one at a time.
  std::vector<std::vector<std::uint32_t>> requests;
  for (const char* t : {"a great, moving film", "awful, boring plot", "The package arrived on Tuesday.", ""}) {
    requests.push_back(generated.tokenizer().tokenize(t));
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 64; ++i) {
    std::vector<std::uint32_t> r(rng() % 60);
    for (auto& t : r) t = static_cast<std::uint32_t>(rng() % 2048);
    requests.push_back(std::move(r));
  }
  std::vector<std::span<const std::uint32_t>> batch(requests.begin(), requests.end());
  std::vector<Prediction> want(batch.size()), got(batch.size());
  ClassifierWorkspace ws1, ws2;
  generated.forward(batch, want, ws1);
  mapped.forward(batch, got, ws2);
  int differing = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    differing += same_bits(want[i], got[i]) ? 0 : 1;
    Prediction alone;
    mapped.forward(std::span(&batch[i], 1), std::span(&alone, 1), ws2);
    differing += same_bits(want[i], alone) ? 0 : 1;
  }
  CHECK(differing == 0);
  CHECK(mapped.classify("a great, moving film").label == Sentiment::positive);
  CHECK(mapped.classify("awful, boring plot").label == Sentiment::negative);
}

TEST_CASE("a weights file reports its resident fraction and the mapping outlives its WeightsFile handle") {
  const TempPath file("tailbatch-test-resident");
  write_weights_file(Classifier(small_config()), file.path);
  auto weights = std::make_shared<const WeightsFile>(file.path);
  CHECK(weights->size_bytes() == weights->header().offset[4] + sentiment_count * sizeof(float));
  CHECK(weights->header().hidden_dim == 1024);
  weights->drop_page_cache();  // advice: whether it takes depends on the file system
  const double before = weights->resident_fraction();
  CHECK(before >= 0.0);
  CHECK(before <= 1.0);

  const Classifier mapped = load_classifier(weights);
  weights.reset();  // the Classifier keeps the mapping alive
  // Reading every weight brings every page of the arrays in; with the header page, all.
  const ClassifierWeights w = mapped.weights();
  double sum = 0.0;
  for (std::span<const float> s : {w.embeddings, w.w1, w.b1, w.w2, w.b2}) {
    for (float x : s) sum += static_cast<double>(x);
  }
  CHECK(sum == sum);  // not NaN: the values were read
  const WeightsFile again(file.path);
  CHECK(again.resident_fraction() == 1.0);
}

TEST_CASE("a file that is not a weights file, or does not fit its header, is refused") {
  const TempPath file("tailbatch-test-bad");
  CHECK_THROWS_AS(WeightsFile(file.path), std::system_error);  // does not exist yet
  {
    std::ofstream out(file.path, std::ios::binary);
    const std::string junk(8192, 'x');
    out.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  CHECK_THROWS_AS(WeightsFile(file.path), std::invalid_argument);

  write_weights_file(Classifier(small_config()), file.path);
  std::filesystem::resize_file(file.path, std::filesystem::file_size(file.path) - 4096);
  CHECK_THROWS_MATCHES(WeightsFile(file.path), std::invalid_argument,
                       tailbatch::test::MessageContains("does not match"));
}

TEST_CASE("weights that do not fit the config are refused naming the field") {
  const Classifier generated(small_config());
  ClassifierConfig other = small_config();
  other.hidden_dim = 2048;
  CHECK_THROWS_MATCHES(Classifier(other, generated.weights(), nullptr), std::invalid_argument,
                       tailbatch::test::MessageContains("hidden_dim"));
  ClassifierWeights cut = generated.weights();
  cut.w2 = cut.w2.first(10);
  CHECK_THROWS_MATCHES(Classifier(small_config(), cut, nullptr), std::invalid_argument,
                       tailbatch::test::MessageContains("w2"));
}

#else

TEST_CASE("weights files need POSIX") { SUCCEED("this platform has no <sys/mman.h>"); }

#endif
