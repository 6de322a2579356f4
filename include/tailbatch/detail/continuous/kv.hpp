// The continuous batcher's KV-cache pieces: which pool a token type gets, and the order in
// which sequences give up their blocks.
//
// A ContinuousBatcher over a token type the KvBlockPool can hold (KvToken) gets a
// KvBlockPool<Token>; any other token type gets NoKvPool, whose tables hold nothing, so
// that a batcher without a KV pool pays nothing for the feature.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <tailbatch/kv_block_pool.hpp>

namespace tailbatch::detail {

// The pool of a token type that cannot be cached: never constructed with blocks.
struct NoKvPool {
  struct BlockTable {
    [[nodiscard]] std::span<const KvBlockId> blocks() const noexcept { return {}; }
  };
};

template <class Token, bool = KvToken<Token>>
struct KvPoolFor {
  using type = NoKvPool;
};
template <class Token>
struct KvPoolFor<Token, true> {
  using type = KvBlockPool<Token>;
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
