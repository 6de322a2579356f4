// What the ContinuousBatcher's tests share (test_continuous_batcher.cpp, the loop and the
// budget; test_continuous_kv.cpp, the KV block pool): a batcher of int tokens on the manual
// clock, requests, the token a sequence emits, and ways to drain and to run it out.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <tailbatch/continuous_batcher.hpp>

namespace tailbatch::test {

using Batcher = ContinuousBatcher<int, NoSequenceState, ManualClock>;
using Seq = Batcher::Sequence;
using Request = Batcher::Request;

// The token a sequence emits: its id and position, so that order and ownership are
// checked (expected_tokens() is what a stream should then hold).
inline int token_of(const Seq& s) { return static_cast<int>(s.id() * 1000 + s.generated()); }

// The first n tokens that token_of gives the sequence `id`.
inline std::vector<int> expected_tokens(std::uint64_t id, std::size_t n) {
  std::vector<int> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(static_cast<int>(id * 1000 + i));
  return v;
}

// A request of this prompt and max_new_tokens.
inline Request req(std::vector<int> prompt, std::size_t max_new) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  return r;
}
// A request whose prompt is `prompt` tokens of `fill`.
inline Request req(std::size_t prompt, std::size_t max_new, int fill = 1) {
  return req(std::vector<int>(prompt, fill), max_new);
}

// The tokens a stream holds now, taken out of it.
inline std::vector<int> drain(Batcher::Stream& s) {
  std::vector<int> out;
  while (auto t = s.try_next()) out.push_back(*t);
  return out;
}

// Steps until nothing is active or waiting (shutdown() would reject the waiting ones);
// bounded, so that a batcher that never finishes fails the test instead of hanging it.
inline void run_all(Batcher& b) {
  for (int guard = 0; guard < 100000 && b.active_approx() + b.waiting_approx() > 0; ++guard)
    (void)b.poll();
}

// What constructing a batcher with config c throws as std::invalid_argument; empty when it
// does not throw.
inline std::string config_error(const ContinuousBatcherConfig& c) {
  try {
    Batcher b([](std::span<Seq>) {}, c, ManualClock{});
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

}  // namespace tailbatch::test
