// The encoder behind a Pipeline, as the example, its tests and bench_libtorch set it up:
// requests tokenized before submit (their length is their cost), batched by a TokenBudget
// with length buckets, run on TorchLanes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/pipeline.hpp>
#include <vector>

#include "torch_lanes.hpp"

namespace tailbatch_libtorch {

using EncoderPipeline =
    tailbatch::Pipeline<TokenizedText, Encoding, tailbatch::TokenBudget, TorchLanes>;

// Up to max_batch requests, and at most max_batch x 32 padded tokens (never less than 64,
// the longest request, which would otherwise be refused as too large), per batch; requests
// bucketed by length (1-8, 9-16, 17-32, 33-64 tokens), so that a batch pads short texts to
// a short length. Allocates.
inline tailbatch::TokenBudget encoder_policy(
    std::size_t max_batch = 32, std::chrono::nanoseconds max_wait = std::chrono::milliseconds(2)) {
  return tailbatch::TokenBudget({.budget = std::max<std::size_t>(max_batch * 32, 64),
                                 .max_batch = max_batch,
                                 .max_wait = max_wait,
                                 .bucket_bounds = {8, 16, 32, 64}});
}

// The Pipeline's config: a request's cost is its token count. Allocates.
inline tailbatch::PipelineConfig<TokenizedText> encoder_pipeline_config(
    std::size_t queue_capacity = 4096) {
  tailbatch::PipelineConfig<TokenizedText> c;
  c.queue_capacity = queue_capacity;
  c.request_cost = [](const TokenizedText& t) { return t.ids.size(); };
  return c;
}

// n texts of 1 to 40 words (4 to 20 in most), drawn from a small vocabulary by a seeded
// generator: deterministic. Allocates.
inline std::vector<std::string> sample_texts(std::size_t n, std::uint64_t seed = 2024) {
  static constexpr std::string_view vocabulary[] = {
      "the",    "service", "was",   "slow", "but",   "food",  "excellent",
      "never",  "again",   "quite", "good", "value", "rude",  "staff",
      "lovely", "view",    "noisy", "room", "clean", "would", "return"};
  std::vector<std::string> texts(n);
  std::uint64_t state = seed | 1;
  auto next = [&state] {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (std::string& t : texts) {
    const std::uint64_t r = next() % 100;
    const std::uint64_t words = r < 5    ? 1 + next() % 3
                                : r < 90 ? 4 + next() % 17
                                         : 21 + next() % 20;
    for (std::uint64_t w = 0; w < words; ++w) {
      if (w != 0) t += ' ';
      t += vocabulary[next() % std::size(vocabulary)];
    }
  }
  return texts;
}

}  // namespace tailbatch_libtorch
