// The reference tokenizer: splitting, lowercasing, the stable hash, reserved words,
// truncation, and the shipped lexicon's well-formedness.
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <tailbatch/reference/sentiment_lexicon.hpp>
#include <tailbatch/reference/tokenizer.hpp>

#include "tailbatch_test.hpp"

using tailbatch::reference::fnv1a64;
using tailbatch::reference::sentiment_lexicon;
using tailbatch::reference::Tokenizer;
using tailbatch::reference::TokenizerConfig;

TEST_CASE("fnv1a64 matches the published FNV-1a 64-bit test vectors") {
  STATIC_REQUIRE(fnv1a64("") == 0xcbf29ce484222325ULL);
  STATIC_REQUIRE(fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  STATIC_REQUIRE(fnv1a64("foobar") == 0x85944171f73967e8ULL);
}

TEST_CASE("unreserved words hash into the whole vocabulary") {
  const Tokenizer tok(TokenizerConfig{.vocab_size = 1000, .max_tokens = 16});
  CHECK(tok.reserved_count() == 0);
  CHECK(tok.id_of("film") == fnv1a64("film") % 1000);
  CHECK(tok.tokenize("film") == std::vector<std::uint32_t>{tok.id_of("film")});
}

TEST_CASE("text splits on whitespace and punctuation and is lowercased") {
  const Tokenizer tok;
  const std::vector<std::uint32_t> expected = {tok.id_of("hello"), tok.id_of("world"), tok.id_of("it"),
                                               tok.id_of("s"), tok.id_of("2024"), tok.id_of("x")};
  CHECK(tok.tokenize("Hello, WORLD!\t it's\n2024 ...x") == expected);
  CHECK(tok.id_of("GrEaT") == tok.id_of("great"));
  CHECK(tok.tokenize("  ,;!? ").empty());
  CHECK(tok.tokenize("").empty());
  // Bytes >= 0x80 are word bytes: UTF-8 words stay whole and are not case-folded.
  CHECK(tok.tokenize("caf\xc3\xa9 ok") == std::vector<std::uint32_t>{tok.id_of("caf\xc3\xa9"), tok.id_of("ok")});
  CHECK(tok.id_of("caf\xc3\xa9") != tok.id_of("caf"));
}

TEST_CASE("reserved words get ids 0..n-1, case-insensitively, and others hash above them") {
  const std::vector<std::string_view> reserved = {"great", "awful", "meh"};
  const Tokenizer tok(TokenizerConfig{.vocab_size = 100, .max_tokens = 8}, reserved);
  CHECK(tok.reserved_count() == 3);
  CHECK(tok.tokenize("Great awful MEH") == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(tok.id_of("greatest") == 3 + fnv1a64("greatest") % 97);
  for (const char* w : {"the", "plot", "film", "greatest", "aw", "mehh"}) {
    const std::uint32_t id = tok.id_of(w);
    CHECK(id >= 3);
    CHECK(id < 100);
  }
}

TEST_CASE("tokenize appends, returns the count, and stops at max_tokens") {
  const Tokenizer tok(TokenizerConfig{.vocab_size = 512, .max_tokens = 5});
  std::vector<std::uint32_t> ids = {7};
  CHECK(tok.tokenize("one two three", ids) == 3);
  CHECK(ids.size() == 4);
  CHECK(ids[0] == 7);
  ids.clear();
  CHECK(tok.tokenize("a b c d e f g h", ids) == 5);
  CHECK(ids == tok.tokenize("a b c d e"));
}

TEST_CASE("a reused vector makes tokenize allocation-free") {
  const Tokenizer tok;
  std::vector<std::uint32_t> ids;
  ids.reserve(256);
  const auto* data = ids.data();
  for (int i = 0; i < 100; ++i) {
    ids.clear();
    (void)tok.tokenize("The quick brown fox jumps over the lazy dog, again and again.", ids);
  }
  CHECK(ids.data() == data);
  CHECK(ids.size() == 12);
}

TEST_CASE("bad options and reserved words throw std::invalid_argument naming the field") {
  const std::vector<std::string_view> two = {"a", "b"};
  auto message = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  CHECK(contains(message([] { Tokenizer t(TokenizerConfig{.vocab_size = 10, .max_tokens = 0}); }),
                 "max_tokens"));
  CHECK(contains(message([&] { Tokenizer t(TokenizerConfig{.vocab_size = 2, .max_tokens = 4}, two); }),
                 "vocab_size"));
  const std::vector<std::string_view> dup = {"a", "b", "a"};
  CHECK(contains(message([&] { Tokenizer t(TokenizerConfig{}, dup); }), "twice"));
  const std::vector<std::string_view> upper = {"Great"};
  CHECK(contains(message([&] { Tokenizer t(TokenizerConfig{}, upper); }), "single lowercase word"));
  const std::vector<std::string_view> phrase = {"so good"};
  CHECK(contains(message([&] { Tokenizer t(TokenizerConfig{}, phrase); }), "single lowercase word"));
}

TEST_CASE("the shipped lexicon is well formed") {
  std::set<std::string_view> seen;
  int positive = 0;
  int negative = 0;
  for (const auto& e : sentiment_lexicon) {
    CHECK(seen.insert(e.word).second);
    CHECK(e.polarity != 0);
    CHECK(e.polarity >= -3);
    CHECK(e.polarity <= 3);
    (e.polarity > 0 ? positive : negative) += 1;
  }
  CHECK(positive >= 100);
  CHECK(negative >= 100);
  // Every entry is one lowercase word: the tokenizer accepts them all as reserved words.
  std::vector<std::string_view> words;
  for (const auto& e : sentiment_lexicon) words.push_back(e.word);
  const Tokenizer tok(TokenizerConfig{}, words);
  for (std::uint32_t i = 0; i < words.size(); ++i) CHECK(tok.tokenize(words[i]) == std::vector<std::uint32_t>{i});
}
