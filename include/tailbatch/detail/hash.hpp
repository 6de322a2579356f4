// Hash mixing shared by the components that hash (the result cache's sketch, the KV block
// pool's prefix index). Standard library only, below every component.
#pragma once

#include <cstdint>

namespace tailbatch::detail {

// A 64-bit finalizer (splitmix64's): every output bit depends on every input bit, so that
// a user's hash that is the identity on integers still spreads over shards, counters and
// slots.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace tailbatch::detail
