// The reference classifier's CPU twin: sensible labels from the lexicon, bitwise batch
// invariance, agreement between CPU kernels, accuracy against double precision,
// determinism, and its errors.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>

#include "tailbatch_test.hpp"

using namespace tailbatch::reference;

namespace {

const Classifier& default_model() {
  static const Classifier model{};
  return model;
}

ClassifierConfig small_config(CpuKernel kernel = CpuKernel::automatic) {
  return ClassifierConfig{.vocab_size = 2048, .embed_dim = 64, .hidden_dim = 1024, .max_tokens = 48,
                          .cpu_kernel = kernel};
}

// Random requests of 0..max_len token ids, some longer than max_tokens.
std::vector<std::vector<std::uint32_t>> random_requests(std::size_t count, std::uint32_t vocab, std::size_t max_len,
                                                        std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::uint32_t>> out(count);
  for (auto& r : out) {
    r.resize(rng() % (max_len + 1));
    for (auto& t : r) t = static_cast<std::uint32_t>(rng() % vocab);
  }
  return out;
}

bool same_bits(const Prediction& a, const Prediction& b) {
  return std::memcmp(a.logits.data(), b.logits.data(), sizeof(a.logits)) == 0 &&
         std::memcmp(a.probabilities.data(), b.probabilities.data(), sizeof(a.probabilities)) == 0 &&
         a.label == b.label;
}

std::vector<Prediction> run(const Classifier& model, const std::vector<std::span<const std::uint32_t>>& batch,
                            ClassifierWorkspace& ws) {
  std::vector<Prediction> out(batch.size());
  model.forward(batch, out, ws);
  return out;
}

Prediction alone(const Classifier& model, std::span<const std::uint32_t> tokens, ClassifierWorkspace& ws) {
  return run(model, {tokens}, ws)[0];
}

// Every request alone, then in batches of every size in `sizes`, each filled with requests
// drawn at random positions: each result must equal the request's result alone, bit for bit.
void check_batch_invariance(const Classifier& model, const std::vector<std::vector<std::uint32_t>>& pool,
                            const std::vector<std::size_t>& sizes, std::uint64_t seed) {
  ClassifierWorkspace ws;
  std::vector<Prediction> solo;
  for (const auto& r : pool) solo.push_back(alone(model, r, ws));
  std::mt19937_64 rng(seed);
  std::size_t mismatches = 0;
  for (std::size_t n : sizes) {
    std::vector<std::size_t> which(n);
    for (auto& w : which) w = rng() % pool.size();
    std::vector<std::span<const std::uint32_t>> batch;
    for (std::size_t w : which) batch.emplace_back(pool[w]);
    const std::vector<Prediction> got = run(model, batch, ws);
    for (std::size_t i = 0; i < n; ++i) {
      if (!same_bits(got[i], solo[which[i]])) ++mismatches;
    }
  }
  CHECK(mismatches == 0);
}

double rel_err(double got, double ref) { return std::abs(got - ref) / std::abs(ref); }

}  // namespace

TEST_CASE("obvious sentences get sensible labels from the default model") {
  struct Case {
    std::string_view text;
    Sentiment expected;
  };
  const Case cases[] = {
      {"a great, moving film", Sentiment::positive},
      {"awful, boring plot", Sentiment::negative},
      {"Superb acting and a brilliant script!", Sentiment::positive},
      {"I loved every minute of it", Sentiment::positive},
      {"An excellent, charming little book.", Sentiment::positive},
      {"What a wonderful, heartwarming story", Sentiment::positive},
      {"terrible service, rude and useless staff", Sentiment::negative},
      {"What a waste of time: dull and predictable.", Sentiment::negative},
      {"The worst phone I ever owned; horrible battery", Sentiment::negative},
      {"The package arrived on Tuesday.", Sentiment::neutral},
      {"The train leaves at noon from platform four", Sentiment::neutral},
      {"we watched it on a rainy sunday afternoon", Sentiment::neutral},
  };
  const Classifier& model = default_model();
  for (const Case& c : cases) {
    const Prediction p = model.classify(c.text);
    INFO(c.text << " -> " << to_string(p.label) << " (" << p.confidence() << ")");
    CHECK(p.label == c.expected);
    CHECK(p.confidence() > 0.45f);
  }
}

TEST_CASE("a request's output is bit-identical alone or in any batch at any position (small model)") {
  const Classifier model(small_config());
  const auto pool = random_requests(40, 2048, 64, 1);
  std::vector<std::size_t> sizes(64);
  std::iota(sizes.begin(), sizes.end(), std::size_t{1});
  check_batch_invariance(model, pool, sizes, 2);
}

TEST_CASE("a request's output is bit-identical alone or in any batch at any position (default model)") {
  const Classifier& model = default_model();
  const auto pool = random_requests(24, model.config().vocab_size, 160, 3);
  std::vector<std::size_t> sizes = {1, 2, 3, 4, 5, 7, 8, 13, 32, 64};
  if (tailbatch::test::sanitizer_slowdown == 1) {
    for (std::size_t n = 1; n <= 64; n += 3) sizes.push_back(n);
  }
  check_batch_invariance(model, pool, sizes, 4);
}

TEST_CASE("every CPU kernel this machine supports produces the same bits") {
  std::vector<CpuKernel> kernels = {CpuKernel::portable};
  for (CpuKernel k : {CpuKernel::avx2, CpuKernel::avx512}) {
    if (cpu_kernel_supported(k)) kernels.push_back(k);
  }
  INFO("kernels compared: " << kernels.size());
  const auto pool = random_requests(37, 2048, 40, 5);
  std::vector<std::span<const std::uint32_t>> batch(pool.begin(), pool.end());
  const Classifier reference(small_config(CpuKernel::portable));
  ClassifierWorkspace ws;
  const std::vector<Prediction> expected = run(reference, batch, ws);
  for (CpuKernel k : kernels) {
    const Classifier model(small_config(k));
    CHECK(model.kernel() == k);
    const std::vector<Prediction> got = run(model, batch, ws);
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], expected[i]));
  }
}

TEST_CASE("the float model is within 1e-5 relative of the double-precision reference") {
  const Classifier& model = default_model();
  auto pool = random_requests(40, model.config().vocab_size, 100, 6);
  for (std::string_view s : {"a great, moving film", "awful, boring plot", "meh", "", "the the the the"}) {
    pool.push_back(model.tokenizer().tokenize(s));
  }
  std::vector<std::span<const std::uint32_t>> batch(pool.begin(), pool.end());
  ClassifierWorkspace ws;
  const std::vector<Prediction> got = run(model, batch, ws);
  double worst_prob = 0.0;
  double worst_logit = 0.0;
  for (std::size_t i = 0; i < pool.size(); ++i) {
    const ReferencePrediction ref = model.reference_forward(pool[i]);
    for (std::size_t l = 0; l < sentiment_count; ++l) {
      worst_prob = std::max(worst_prob, rel_err(got[i].probabilities[l], ref.probabilities[l]));
      worst_logit = std::max(worst_logit,
                             std::abs(got[i].logits[l] - ref.logits[l]) / std::max(1.0, std::abs(ref.logits[l])));
    }
    CHECK(got[i].label == ref.label);
  }
  INFO("worst relative error: probabilities " << worst_prob << ", logits " << worst_logit);
  CHECK(worst_prob <= 1e-5);
  CHECK(worst_logit <= 1e-5);
}

TEST_CASE("probabilities are a distribution and the label is their argmax") {
  const Classifier model(small_config());
  const auto pool = random_requests(30, 2048, 30, 7);
  std::vector<std::span<const std::uint32_t>> batch(pool.begin(), pool.end());
  ClassifierWorkspace ws;
  for (const Prediction& p : run(model, batch, ws)) {
    const float sum = p.probabilities[0] + p.probabilities[1] + p.probabilities[2];
    CHECK(std::abs(sum - 1.0f) < 1e-6f);
    const auto best = std::max_element(p.logits.begin(), p.logits.end()) - p.logits.begin();
    CHECK(static_cast<std::size_t>(p.label) == static_cast<std::size_t>(best));
    for (float q : p.probabilities) CHECK(q > 0.0f);
  }
}

TEST_CASE("weights are a function of the seed alone") {
  const Classifier a(small_config());
  const Classifier b(small_config());
  ClassifierConfig other = small_config();
  other.seed += 1;
  const Classifier c(other);
  const ClassifierWeights wa = a.weights(), wb = b.weights(), wc = c.weights();
  auto equal = [](std::span<const float> x, std::span<const float> y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
  };
  CHECK(equal(wa.embeddings, wb.embeddings));
  CHECK(equal(wa.w1, wb.w1));
  CHECK(equal(wa.w2, wb.w2));
  CHECK_FALSE(equal(wa.w1, wc.w1));
  CHECK_FALSE(equal(wa.embeddings, wc.embeddings));
  // A few fixed values pin the generator itself (splitmix64 counters), across platforms.
  const detail::UniformStream s(20240611, 2);
  CHECK(s(0) >= -1.0f);
  CHECK(s(0) < 1.0f);
  CHECK(detail::splitmix64(0) == 0xe220a8397b1dcdafULL);
  CHECK(detail::splitmix64(1) == 0x910a2dec89025cc1ULL);
  CHECK(wa.w1.size() == std::size_t{64} * 1024);
}

TEST_CASE("a request longer than max_tokens is read up to max_tokens and flagged truncated") {
  const Classifier model(small_config());  // max_tokens 48
  CHECK(model.config().long_input == LongInput::truncate);  // the default
  ClassifierWorkspace ws;
  std::vector<std::uint32_t> long_request(100);
  for (std::size_t i = 0; i < long_request.size(); ++i) long_request[i] = static_cast<std::uint32_t>(i * 7 % 2048);
  const std::span<const std::uint32_t> first(long_request.data(), 48);
  const std::span<const std::uint32_t> one_more(long_request.data(), 49);

  const Prediction cut = alone(model, long_request, ws);
  const Prediction exact = alone(model, first, ws);
  CHECK(same_bits(cut, exact));  // the first 48 tokens are what the model reads
  CHECK(cut.truncated);
  CHECK_FALSE(exact.truncated);  // exactly max_tokens is not truncated
  CHECK(alone(model, one_more, ws).truncated);
  CHECK(model.truncated_requests() == 2);

  // In a batch, only the long requests are flagged and counted.
  const std::vector<std::span<const std::uint32_t>> batch = {first, long_request, {}, one_more, first};
  const std::vector<Prediction> got = run(model, batch, ws);
  CHECK_FALSE(got[0].truncated);
  CHECK(got[1].truncated);
  CHECK_FALSE(got[2].truncated);
  CHECK(got[3].truncated);
  CHECK_FALSE(got[4].truncated);
  CHECK(model.truncated_requests() == 4);

  CHECK(model.reference_forward(long_request).truncated);
  CHECK_FALSE(model.reference_forward(first).truncated);
  CHECK(model.truncated_requests() == 4);  // the double-precision check does not count

  const Prediction empty = alone(model, {}, ws);
  CHECK(std::isfinite(empty.logits[0]));
  CHECK(empty.label == Sentiment::neutral);
  CHECK_FALSE(empty.truncated);
}

TEST_CASE("a text of more words than max_tokens is flagged, through classify and the Pipeline adapter") {
  const Classifier model(small_config());  // max_tokens 48
  std::string words_48, words_49, words_200;
  for (int i = 0; i < 200; ++i) {
    const std::string w = (i % 3 == 0 ? "great " : "word" + std::to_string(i) + " ");
    if (i < 48) words_48 += w;
    if (i < 49) words_49 += w;
    words_200 += w;
  }
  // The model's tokenizer keeps one id past max_tokens: that is how a long text is told.
  CHECK(model.tokenizer().tokenize(words_200).size() == 49);
  CHECK(model.tokenizer().tokenize(words_48).size() == 48);

  const Prediction p48 = model.classify(words_48);
  const Prediction p49 = model.classify(words_49);
  const Prediction p200 = model.classify(words_200);
  CHECK_FALSE(p48.truncated);
  CHECK(p49.truncated);
  CHECK(p200.truncated);
  CHECK(same_bits(p200, p48));  // what was read: the first 48 words
  CHECK(model.truncated_requests() == 2);

  const ClassifierModel adapter(model);
  const std::vector<std::string> texts = {words_48, words_200, "awful, boring plot"};
  std::vector<Prediction> out(texts.size());
  adapter.run_on_cpu(texts, out);
  CHECK_FALSE(out[0].truncated);
  CHECK(out[1].truncated);
  CHECK_FALSE(out[2].truncated);
  CHECK(model.truncated_requests() == 3);
}

TEST_CASE("LongInput::reject refuses a request longer than max_tokens before computing anything") {
  ClassifierConfig c = small_config();
  c.long_input = LongInput::reject;
  const Classifier model(c);
  ClassifierWorkspace ws;
  const std::vector<std::uint32_t> ok(48, 7), too_long(49, 7);
  CHECK_FALSE(alone(model, ok, ws).truncated);
  const std::vector<std::span<const std::uint32_t>> batch = {ok, too_long};
  std::vector<Prediction> out(2);
  try {
    model.forward(batch, out, ws);
    FAIL("no exception");
  } catch (const std::length_error& e) {
    CHECK(std::string(e.what()).find("request 1 has more than max_tokens (48)") != std::string::npos);
  }
  CHECK_THROWS_AS((void)model.reference_forward(too_long), std::length_error);
  std::string text;
  for (int i = 0; i < 60; ++i) text += "word ";
  CHECK_THROWS_AS((void)model.classify(text), std::length_error);
  CHECK(model.truncated_requests() == 0);
  CHECK(to_string(LongInput::reject) == "reject");
}

TEST_CASE("bad configuration and bad input throw") {
  auto message = [](ClassifierConfig c) -> std::string {
    try {
      Classifier m(c);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  ClassifierConfig c = small_config();
  c.embed_dim = 40;
  CHECK(message(c).find("embed_dim") != std::string::npos);
  c = small_config();
  c.hidden_dim = 100;
  CHECK(message(c).find("hidden_dim") != std::string::npos);
  c = small_config();
  c.vocab_size = 10;
  CHECK(message(c).find("vocab_size") != std::string::npos);
  c = small_config();
  c.max_tokens = 0;
  CHECK(message(c).find("max_tokens") != std::string::npos);
  if (!cpu_kernel_supported(CpuKernel::avx512)) {
    c = small_config(CpuKernel::avx512);
    CHECK(message(c).find("cpu_kernel") != std::string::npos);
  }

  const Classifier model(small_config());
  ClassifierWorkspace ws;
  const std::vector<std::uint32_t> bad = {1, 2, 4096};
  std::vector<Prediction> out(1);
  const std::span<const std::uint32_t> one[1] = {bad};
  CHECK_THROWS_AS(model.forward(one, out, ws), std::out_of_range);
  std::vector<Prediction> two(2);
  CHECK_THROWS_AS(model.forward(one, two, ws), std::invalid_argument);
  CHECK_THROWS_AS((void)model.reference_forward(bad), std::out_of_range);
}

TEST_CASE("threads sharing one model with their own workspaces agree") {
  const Classifier model(small_config());
  const auto pool = random_requests(16, 2048, 40, 8);
  std::vector<std::span<const std::uint32_t>> batch(pool.begin(), pool.end());
  ClassifierWorkspace ws;
  const std::vector<Prediction> expected = run(model, batch, ws);
  const int rounds = 40 / tailbatch::test::sanitizer_slowdown + 2;
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ClassifierWorkspace mine;
      for (int r = 0; r < rounds; ++r) {
        // Each thread runs a different slice, so batch composition differs across threads.
        const std::size_t n = 1 + static_cast<std::size_t>(t + r) % batch.size();
        std::vector<std::span<const std::uint32_t>> part(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(n));
        std::vector<Prediction> got(n);
        model.forward(part, got, mine);
        for (std::size_t i = 0; i < n; ++i) mismatches[static_cast<std::size_t>(t)] += !same_bits(got[i], expected[i]);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(std::accumulate(mismatches.begin(), mismatches.end(), 0) == 0);
}
