// The frequency filter behind ResultCache's admission policy (TinyLFU): a count-min sketch
// of how often each key was looked up recently, with a doorkeeper and periodic aging.
//
//   doorkeeper  a Bloom filter of keys seen once since the last aging. A key's first
//               sighting sets its bits and nothing else, so the one-hit wonders of a scan
//               never reach the counters;
//   counters    four rows of saturating counters (0..15), each key counted in one counter
//               per row; its estimate is the smallest of the four, plus one if the
//               doorkeeper holds it;
//   aging       after 10 x capacity sightings every counter is halved and the doorkeeper
//               cleared, so that yesterday's hot keys fade and today's can win.
//
// Keys arrive as 64-bit hashes that are already well mixed. Not thread-safe: each cache
// shard owns one, under its lock.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tailbatch::detail {

// A 64-bit finalizer (splitmix64's): every output bit depends on every input bit, so that
// a user's hash that is the identity on integers still spreads over shards and counters.
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

class FrequencySketch {
 public:
  static constexpr std::size_t depth = 4;
  static constexpr std::uint8_t max_count = 15;

  // A sketch sized for a cache of `capacity` entries: 2 x capacity counters per row
  // (rounded up to a power of two) and 8 doorkeeper bits per entry. Allocates; throws
  // std::bad_alloc.
  explicit FrequencySketch(std::size_t capacity) {
    const std::size_t cap = std::max<std::size_t>(capacity, 8);
    width_ = std::bit_ceil(cap * 2);
    counters_.assign(depth * width_, 0);
    door_bits_ = std::bit_ceil(std::max<std::size_t>(cap * 8, 64));
    door_.assign(door_bits_ / 64, 0);
    sample_ = 10 * cap;
  }

  // Counts one sighting of the key with (mixed) hash h. Never allocates.
  void record(std::uint64_t h) noexcept {
    const std::uint64_t g = mix64(h ^ 0x9e3779b97f4a7c15ULL);
    if (door_insert(g)) {
      const auto lo = static_cast<std::uint32_t>(g);
      const auto hi = static_cast<std::uint32_t>(g >> 32) | 1u;
      for (std::size_t r = 0; r < depth; ++r) {
        std::uint8_t& c = counters_[r * width_ + ((lo + r * hi) & (width_ - 1))];
        if (c < max_count) ++c;
      }
    }
    if (++additions_ >= sample_) age();
  }

  // The estimated recent count of the key with (mixed) hash h, at most max_count + 1.
  // Never allocates.
  [[nodiscard]] unsigned estimate(std::uint64_t h) const noexcept {
    const std::uint64_t g = mix64(h ^ 0x9e3779b97f4a7c15ULL);
    const auto lo = static_cast<std::uint32_t>(g);
    const auto hi = static_cast<std::uint32_t>(g >> 32) | 1u;
    unsigned m = max_count;
    for (std::size_t r = 0; r < depth; ++r) {
      m = std::min<unsigned>(m, counters_[r * width_ + ((lo + r * hi) & (width_ - 1))]);
    }
    return m + (door_contains(g) ? 1u : 0u);
  }

  // Forgets everything. Never allocates.
  void clear() noexcept {
    std::fill(counters_.begin(), counters_.end(), std::uint8_t{0});
    std::fill(door_.begin(), door_.end(), std::uint64_t{0});
    additions_ = 0;
  }

  // Sightings since the last aging (for tests). Never allocates.
  [[nodiscard]] std::size_t additions() const noexcept { return additions_; }
  [[nodiscard]] std::size_t sample_size() const noexcept { return sample_; }

 private:
  // The doorkeeper's two bit positions come from bits of g that the counter rows do not
  // lean on first (the top and the middle).
  [[nodiscard]] std::size_t door_pos(std::uint64_t g, int which) const noexcept {
    const std::uint64_t x = which == 0 ? (g >> 40) ^ (g << 3) : (g >> 17) ^ (g >> 51);
    return static_cast<std::size_t>(x) & (door_bits_ - 1);
  }
  [[nodiscard]] bool door_contains(std::uint64_t g) const noexcept {
    const std::size_t a = door_pos(g, 0);
    const std::size_t b = door_pos(g, 1);
    return ((door_[a / 64] >> (a % 64)) & 1u) != 0 && ((door_[b / 64] >> (b % 64)) & 1u) != 0;
  }
  // Sets g's doorkeeper bits. Returns true when they were all set already (a repeat).
  bool door_insert(std::uint64_t g) noexcept {
    const std::size_t a = door_pos(g, 0);
    const std::size_t b = door_pos(g, 1);
    const std::uint64_t ma = std::uint64_t{1} << (a % 64);
    const std::uint64_t mb = std::uint64_t{1} << (b % 64);
    const bool seen = (door_[a / 64] & ma) != 0 && (door_[b / 64] & mb) != 0;
    door_[a / 64] |= ma;
    door_[b / 64] |= mb;
    return seen;
  }

  void age() noexcept {
    for (std::uint8_t& c : counters_) c = static_cast<std::uint8_t>(c >> 1);
    std::fill(door_.begin(), door_.end(), std::uint64_t{0});
    additions_ /= 2;
  }

  std::vector<std::uint8_t> counters_;
  std::vector<std::uint64_t> door_;
  std::size_t width_ = 0;
  std::size_t door_bits_ = 64;
  std::size_t additions_ = 0;
  std::size_t sample_ = 0;
};

}  // namespace tailbatch::detail
