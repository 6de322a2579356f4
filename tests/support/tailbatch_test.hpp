// What every tailbatch test includes: Catch2 (v3 where installed, else 2.x) and the
// knobs shared by the tests.
#pragma once

#if defined(TAILBATCH_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

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

class MessageIs final : public ExceptionMatcherBase {
 public:
  explicit MessageIs(std::string expected) : expected_(std::move(expected)) {}
  bool match(const std::exception& e) const override { return expected_ == e.what(); }
  std::string describe() const override { return "has the message \"" + expected_ + "\""; }

 private:
  std::string expected_;
};

class MessageContains final : public ExceptionMatcherBase {
 public:
  explicit MessageContains(std::string part) : part_(std::move(part)) {}
  bool match(const std::exception& e) const override {
    return std::string(e.what()).find(part_) != std::string::npos;
  }
  std::string describe() const override { return "has a message containing \"" + part_ + "\""; }

 private:
  std::string part_;
};

class MessageStartsWith final : public ExceptionMatcherBase {
 public:
  explicit MessageStartsWith(std::string prefix) : prefix_(std::move(prefix)) {}
  bool match(const std::exception& e) const override { return std::string(e.what()).starts_with(prefix_); }
  std::string describe() const override { return "has a message starting with \"" + prefix_ + "\""; }

 private:
  std::string prefix_;
};

}  // namespace tailbatch::test
