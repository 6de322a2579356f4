// The continuous batcher's KV-cache pieces: the stand-in pool of a token type that cannot
// be cached, and the order in which sequences give up their blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace tailbatch::detail {

// The pool of a ContinuousBatcher whose token type the KvBlockPool cannot hold (not a
// KvToken): never constructed, its tables hold nothing, so that such a batcher pays
// nothing for the feature. Block ids are KvBlockId (std::uint32_t).
struct NoKvPool {
  struct BlockTable {
    [[nodiscard]] std::span<const std::uint32_t> blocks() const noexcept { return {}; }
  };
};

// Preemption order: the victim is the least important running sequence, the one of lowest
// priority and, among equals, the most recently admitted (vLLM's choice: it has the least
// work to lose). Importance: levels above Priority::normal (high 1, low -1). Returns true
// if a should give up its blocks before b.
[[nodiscard]] constexpr bool cbatch_preempt_before(int importance_a, std::uint64_t admitted_a,
                                                   int importance_b,
                                                   std::uint64_t admitted_b) noexcept {
  return importance_a != importance_b ? importance_a < importance_b : admitted_a > admitted_b;
}

}  // namespace tailbatch::detail
