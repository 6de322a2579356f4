// A deterministic corpus of short movie reviews for the reference classifier: varied
// lengths (4 to 16 phrases) from a fixed vocabulary, the same on every machine. What the
// before/after demo and tailbatch-load --model classifier send.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace tailbatch::reference {

// `n` reviews, the same for the same n. Allocates; throws std::bad_alloc. Thread-safe.
[[nodiscard]] inline std::vector<std::string> review_corpus(std::size_t n) {
  static constexpr const char* words[] = {
      "a great", "moving", "film",   "awful",  "boring plot", "the acting",   "was",   "superb",
      "dull",    "and",    "script", "ending", "loved it",    "not worth it", "music", "too long"};
  std::vector<std::string> out;
  out.reserve(n);
  std::uint64_t s = 2024;
  for (std::size_t i = 0; i < n; ++i) {
    std::string t;
    const std::size_t len = 4 + i % 13;
    for (std::size_t w = 0; w < len; ++w) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      t += words[(s >> 33) % std::size(words)];
      t += ' ';
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tailbatch::reference
