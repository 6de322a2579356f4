// What the reference models' tests share, on the CPU (Catch2) and on the GPU (nvcc, the
// minimal harness in tests/cuda/cuda_test_support.hpp): random token requests, generator
// prompts, sample texts, and bit-for-bit comparison of results. No test framework and no
// CUDA here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <tailbatch/reference/classifier.hpp>

namespace tailbatch::test {

using TokenRequests = std::vector<std::vector<std::uint32_t>>;

// `count` requests of 0..max_len token ids below `vocab`, from std::mt19937_64(seed): the
// same requests for the same arguments on every run and every standard library.
inline TokenRequests random_token_requests(std::size_t count, std::uint32_t vocab, std::size_t max_len,
                                           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  TokenRequests out(count);
  for (auto& r : out) {
    r.resize(rng() % (max_len + 1));
    for (auto& t : r) t = static_cast<std::uint32_t>(rng() % vocab);
  }
  return out;
}

// Request i's prompt for the generator: 1 to `lengths` token ids below `vocab`, a fixed
// function of i (so that a CPU run and a GPU run feed the same prompts).
inline std::vector<std::int32_t> prompt_of(std::size_t i, std::size_t vocab,
                                           std::size_t lengths = 23) {
  std::vector<std::int32_t> p(1 + (i * 7) % lengths);
  for (std::size_t k = 0; k < p.size(); ++k)
    p[k] = static_cast<std::int32_t>((i * 131 + k * 17 + 1) % vocab);
  return p;
}

// The requests as one batch of spans (they must outlive it).
inline std::vector<std::span<const std::uint32_t>> as_batch(const TokenRequests& requests) {
  return {requests.begin(), requests.end()};
}

// `n` short review-like texts (1..9 phrases each, some with lexicon words), the same on
// every run.
inline std::vector<std::string> sample_texts(std::size_t n) {
  static const char* const parts[] = {"a great", "moving", "film", "awful", "boring plot", "the train",
                                      "leaves at noon", "superb acting", "dull", "and", "script", "meh"};
  std::vector<std::string> out;
  std::uint64_t s = 7;
  for (std::size_t i = 0; i < n; ++i) {
    std::string t;
    for (int w = 0; w < 1 + static_cast<int>(i % 9); ++w) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      t += parts[(s >> 33) % std::size(parts)];
      t += ' ';
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Whether two float sequences hold the same bits (not merely equal values: -0.0 != 0.0,
// and a NaN equals itself).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return same_bits(std::span<const float>(a), std::span<const float>(b));
}

// Logits bit for bit (what the CUDA kernels promise against the CPU twin).
inline bool same_logits(const reference::Prediction& a, const reference::Prediction& b) {
  return same_bits(std::span<const float>(a.logits), std::span<const float>(b.logits));
}

// Logits, probabilities and label bit for bit (batch invariance on one backend).
inline bool same_bits(const reference::Prediction& a, const reference::Prediction& b) {
  return same_logits(a, b) && same_bits(std::span<const float>(a.probabilities), std::span<const float>(b.probabilities)) &&
         a.label == b.label;
}

}  // namespace tailbatch::test
