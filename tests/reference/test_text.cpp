// The reference generator's text layer: the word vocabulary and its detokenizer, stop
// strings, the chat template, and the per-sequence sampler (greedy, temperature, top_p,
// seeds) driving a ContinuousBatcher: the same seed gives the same text alone or batched.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tailbatch/clock.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/sampler.hpp>
#include <tailbatch/reference/text.hpp>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch::reference;

TEST_CASE("the vocabulary has one distinct lowercase entry per generator token", "[text]") {
  CHECK(TextVocabulary::size == GeneratorConfig{}.vocab_size);
  std::set<std::string_view> seen;
  for (std::uint32_t i = 0; i < TextVocabulary::size; ++i) {
    const auto w = TextVocabulary::word(static_cast<std::int32_t>(i));
    CHECK(!w.empty());
    CHECK(seen.insert(w).second);
  }
  CHECK(TextVocabulary::word(0) == ".");
  CHECK(TextVocabulary::word(1) == ",");
  CHECK(TextVocabulary::word(2) == "the");
  CHECK(TextVocabulary::word(-1).empty());
  CHECK(TextVocabulary::word(2048).empty());
}

TEST_CASE("known words are their ids, unknown words map into the vocabulary", "[text]") {
  const TextVocabulary v;
  CHECK(v.encode("The water, IS warm!") ==
        std::vector<std::int32_t>{v.id_of("the"), v.id_of("water"), 1, v.id_of("is"),
                                  v.id_of("warm"), 0});
  CHECK(TextVocabulary::word(v.id_of("water")) == "water");
  CHECK(v.id_of("zzyzx") == static_cast<std::int32_t>(2 + fnv1a64("zzyzx") % 2046));
  CHECK(v.encode("a;b:c?d").size() == 7);
  CHECK(v.encode("  \t\n-+=()").empty());
  // Every id round-trips through its text.
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(TextVocabulary::size); ++id) {
    std::string piece;
    TextVocabulary::append_piece(id, piece);
    CHECK(v.encode(piece) == std::vector<std::int32_t>{id});
  }
}

TEST_CASE("detokenizing: words with a leading space, punctuation without", "[text]") {
  const TextVocabulary v;
  CHECK(TextVocabulary::decode(v.encode("the sun, the moon.")) == " the sun, the moon.");
  CHECK(TextVocabulary::decode({}).empty());
}

TEST_CASE("stop strings cut the text before them, across pieces, holding back partial matches",
          "[text]") {
  StopMatcher m({"moon", "xyz"});
  CHECK(m.push(" the") == " the");
  CHECK(m.push(" mo") == " ");  // "mo" could be the start of "moon"
  CHECK(m.push("re") == "more");
  CHECK(m.push(" mo") == " ");
  CHECK(m.push("on ").empty());
  CHECK(m.stopped());
  CHECK(m.push(" after").empty());
  CHECK(m.finish().empty());

  StopMatcher held({"abc"});
  CHECK(held.push("xab") == "x");
  CHECK(held.finish() == "ab");
  StopMatcher none;
  CHECK(none.push(" any") == " any");
  CHECK_THROWS_AS(StopMatcher({""}), std::invalid_argument);
}

TEST_CASE("the chat template renders role lines and ends with the assistant's turn", "[text]") {
  const std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hello there"}};
  CHECK(ChatTemplate::render(m) == "system: Be brief.\nuser: Hello there\nassistant:");
  CHECK(ChatTemplate::render({}) == "assistant:");
}

TEST_CASE("sample_token: greedy is the first argmax, sampling follows the seed, top_p narrows",
          "[text][sampler]") {
  const std::vector<float> logits = {0.0f, 3.0f, 3.0f, 1.0f, -2.0f};
  std::vector<std::uint32_t> scratch;
  std::uint64_t rng = 7;
  CHECK(sample_token(logits, {}, rng, scratch) == 1);
  CHECK(rng == 7);  // greedy draws nothing
  // The same counter gives the same draw; many draws cover more than the argmax.
  std::set<std::int32_t> seen;
  for (std::uint64_t s = 0; s < 200; ++s) {
    std::uint64_t a = s, b = s;
    const auto x = sample_token(logits, {1.0f, 1.0f}, a, scratch);
    CHECK(x == sample_token(logits, {1.0f, 1.0f}, b, scratch));
    CHECK(a == s + 1);
    seen.insert(x);
  }
  CHECK(seen.size() >= 3);
  // top_p small enough keeps only the two tied best ids.
  for (std::uint64_t s = 0; s < 200; ++s) {
    const auto x = sample_token(logits, {1.0f, 0.5f}, s, scratch);
    CHECK((x == 1 || x == 2));
  }
  // A tiny temperature is nearly greedy.
  for (std::uint64_t s = 0; s < 50; ++s) {
    const auto x = sample_token(logits, {0.01f, 1.0f}, s, scratch);
    CHECK((x == 1 || x == 2));
  }
}

namespace {
using Batcher =
    tailbatch::ContinuousBatcher<std::int32_t, TextSequenceState, tailbatch::ManualClock>;

GeneratorConfig small() {
  GeneratorConfig c;
  c.hidden_dim = 64;
  return c;
}

// Runs the requests through one batcher (max_active sequences together) and returns each one's
// text.
std::vector<std::string> run(const Generator& g, std::size_t max_active,
                             const std::vector<std::string>& prompts, SamplingParams p,
                             std::vector<std::string> stops = {}, std::size_t max_tokens = 24) {
  TextGenerator tg(g);
  const TextVocabulary v;
  tailbatch::ContinuousBatcherConfig c;
  c.max_active = max_active;
  Batcher b([&](std::span<Batcher::Sequence> batch) { tg.step_sequences(batch); }, c,
            tailbatch::ManualClock{});
  std::vector<std::shared_ptr<Batcher::Stream>> streams;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Batcher::Request r;
    r.prompt = v.encode(prompts[i]);
    r.max_new_tokens = max_tokens;
    r.state = tg.new_state(p, 100 + i, stops);
    streams.push_back(b.submit(std::move(r)));
  }
  while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
  std::vector<std::string> out;
  for (auto& s : streams) {
    std::vector<std::int32_t> ids;
    while (auto t = s->try_next()) ids.push_back(*t);
    REQUIRE(s->end()->ok());
    StopMatcher m(stops);
    std::string text;
    for (auto id : ids) {
      std::string piece;
      TextVocabulary::append_piece(id, piece);
      text += m.push(piece);
    }
    text += m.finish();
    out.push_back(text);
  }
  return out;
}
}  // namespace

TEST_CASE("TextGenerator: the same seed gives the same text alone or batched",
          "[text][sampler][continuous_batcher]") {
  const Generator g(small());
  const std::vector<std::string> prompts = {
      "the sun",     "water is warm",   "", "many people live near the river",
      "a b c d e f", "once upon a time"};
  for (SamplingParams p :
       {SamplingParams{0.0f, 1.0f}, SamplingParams{0.9f, 1.0f}, SamplingParams{1.2f, 0.8f}}) {
    const auto batched = run(g, 6, prompts, p);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      INFO("temperature " << p.temperature << " prompt " << i);
      // run() seeds request i with 100 + i: rerun the single prompt at its index's seed.
      std::vector<std::string> one(i + 1, "x");
      one[i] = prompts[i];
      CHECK(run(g, 1, one, p)[i] == batched[i]);
      CHECK(!batched[i].empty());
    }
  }
  // Different seeds at temperature > 0 differ somewhere.
  const auto a = run(g, 4, {"the sun", "the sun", "the sun"}, {1.0f, 1.0f});
  CHECK((a[0] != a[1] || a[1] != a[2]));
}

TEST_CASE("TextGenerator: a stop string finishes the sequence and is cut from the text",
          "[text][sampler]") {
  const Generator g(small());
  const auto free_text = run(g, 1, {"the sun"}, {}, {}, 24)[0];
  // Stop at the fourth word of the free text.
  std::size_t pos = 0;
  for (int k = 0; k < 4; ++k) pos = free_text.find(' ', pos + 1);
  REQUIRE(pos != std::string::npos);
  const std::size_t end = free_text.find_first_of(" .,", pos + 1);
  const std::string stop = free_text.substr(pos, end - pos);
  const auto stopped = run(g, 1, {"the sun"}, {}, {stop}, 24)[0];
  CHECK(stopped == free_text.substr(0, free_text.find(stop)));
}
