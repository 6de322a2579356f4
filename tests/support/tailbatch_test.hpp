// What every tailbatch test includes: Catch2 (v3 where installed, else 2.x) and the
// knobs shared by the tests.
#pragma once

#if defined(TAILBATCH_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace tailbatch::test {

// Under ThreadSanitizer or AddressSanitizer everything runs 5-20x slower; stress tests
// divide their iteration counts by this (they are scaled down there, never skipped).
#if defined(TAILBATCH_TEST_SANITIZED)
inline constexpr int sanitizer_slowdown = 10;
#else
inline constexpr int sanitizer_slowdown = 1;
#endif

// Catch2 exception matchers for the message of what a call throws: bad configuration must be
// refused with a message naming the field.
//
//   CHECK_THROWS_MATCHES(FixedWindow(0, 1ms), std::invalid_argument,
//                        MessageIs("FixedWindow: max_batch must be >= 1"));
//   CHECK_THROWS_MATCHES(f(), std::invalid_argument, MessageContains("queue_capacity"));
//
// Matchers combine with && and ||. Catch2's own Message() matcher exists in 2.x and 3.x,
// but a substring one only in 3.x (MessageMatches); these two read the same under both.
#if defined(TAILBATCH_CATCH2_V3)
using ExceptionMatcherBase = Catch::Matchers::MatcherBase<std::exception>;
#else
using ExceptionMatcherBase = Catch::MatcherBase<std::exception>;
#endif

// What the message of an exception must be: equal to, containing, or starting with a text.
class MessageMatcher final : public ExceptionMatcherBase {
 public:
  enum class Mode { is, contains, starts_with };
  MessageMatcher(Mode mode, std::string text) : mode_(mode), text_(std::move(text)) {}
  bool match(const std::exception& e) const override {
    const std::string what = e.what();
    switch (mode_) {
      case Mode::is: return what == text_;
      case Mode::contains: return what.find(text_) != std::string::npos;
      case Mode::starts_with: return what.starts_with(text_);
    }
    return false;
  }
  std::string describe() const override {
    const char* how = mode_ == Mode::is ? "is" : mode_ == Mode::contains ? "contains" : "starts with";
    return std::string("has a message that ") + how + " \"" + text_ + "\"";
  }

 private:
  Mode mode_;
  std::string text_;
};

// Whether `text` contains `part`: for checks on messages, logs and exposition text.
inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Checks that `text` contains each of `parts`; a failure names the part missing.
inline void check_contains_all(std::string_view text,
                               std::initializer_list<std::string_view> parts) {
  for (const std::string_view part : parts) {
    CAPTURE(part);
    CHECK(contains(text, part));
  }
}

// Runs body(t) for t in [0, threads) on that many threads at once; returns when all are done.
template <class Body>
void on_threads(int threads, Body body) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (auto& th : pool) th.join();
}

inline MessageMatcher MessageIs(std::string text) { return {MessageMatcher::Mode::is, std::move(text)}; }
inline MessageMatcher MessageContains(std::string text) { return {MessageMatcher::Mode::contains, std::move(text)}; }
inline MessageMatcher MessageStartsWith(std::string text) {
  return {MessageMatcher::Mode::starts_with, std::move(text)};
}

}  // namespace tailbatch::test

// The exception matchers, contains(), check_contains_all() and on_threads(), by their plain
// names in every test.
using tailbatch::test::check_contains_all;
using tailbatch::test::contains;
using tailbatch::test::MessageContains;
using tailbatch::test::MessageIs;
using tailbatch::test::MessageStartsWith;
using tailbatch::test::on_threads;

// The names that differ between Catch2 2.x and 3.x, spelled one way for every test:
// Approx, and ContainsSubstring (3.x's name for 2.x's Contains string matcher).
#if defined(TAILBATCH_CATCH2_V3)
using Catch::Approx;
using Catch::Matchers::ContainsSubstring;
#else
using Catch::Detail::Approx;
inline auto ContainsSubstring(const std::string& s) { return Catch::Matchers::Contains(s); }
#endif

// Checks that `expr` (an expression; wrapped in a lambda, so a [[nodiscard]] result or a
// temporary is fine) throws std::invalid_argument whose message contains `text`, the field
// a configuration error must name.
#define CHECK_INVALID(expr, text) \
  CHECK_THROWS_MATCHES(([&] { return expr; }()), std::invalid_argument, MessageContains(text))
