// What every tailbatch test includes: Catch2 (v3 where installed, else 2.x) and the
// knobs shared by the tests.
#pragma once

#if defined(TAILBATCH_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include <stdexcept>
#include <string>

namespace tailbatch::test {

// Under ThreadSanitizer or AddressSanitizer everything runs 5-20x slower; stress tests
// divide their iteration counts by this (they are scaled down there, never skipped).
#if defined(TAILBATCH_TEST_SANITIZED)
inline constexpr int sanitizer_slowdown = 10;
#else
inline constexpr int sanitizer_slowdown = 1;
#endif

// The message of the std::invalid_argument that f throws, or "<no exception>": tests check
// that bad configuration is refused with a message naming the field.
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace tailbatch::test
