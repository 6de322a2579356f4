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
// Keys arrive as 64-bit hashes that are already well mixed. Each key's counters and
// doorkeeper bits share one 64-byte block, so a lookup costs one cache line here. Not
// thread-safe: each cache shard owns one, under its lock.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <tailbatch/detail/hash.hpp>
#include <vector>

namespace tailbatch::detail {

class FrequencySketch {
 public:
  static constexpr std::size_t depth = 4;
  static constexpr std::uint8_t max_count = 15;

  // A sketch sized for a cache of `capacity` entries: one 64-byte block per eight entries
  // (rounded up to a power of two), 8 bytes an entry. A key's four counters and its two
  // doorkeeper bits lie in one block, so a sighting touches one cache line. Allocates;
  // throws std::bad_alloc.
  explicit FrequencySketch(std::size_t capacity) {
    const std::size_t cap = std::max<std::size_t>(capacity, 8);
    blocks_.assign(std::bit_ceil(cap / 8), Block{});
    sample_ = 10 * cap;
  }

  // Counts one sighting of the key with (mixed) hash h. Never allocates.
  void record(std::uint64_t h) noexcept { (void)record_slot(slot_of(h)); }

  // Where the key with (mixed) hash h is counted: pass it to prefetch_slot and
  // record_slot, so that a batch of sightings mixes each hash once.
  [[nodiscard]] static std::uint64_t slot_of(std::uint64_t h) noexcept { return mix64(h ^ 0x9e3779b97f4a7c15ULL); }

  // Counts one sighting of the key counted at g (from slot_of). Returns whether all four
  // of its counters are now at max_count: until the next aging (epoch() changes), a
  // further sighting of it would change no counter and no doorkeeper bit, and
  // record_saturated() counts it at the same effect. Never allocates.
  // weight > 1 counts that many sightings at once (see TinyLfuStore::hit).
  bool record_slot(std::uint64_t g, unsigned weight = 1) noexcept {
    Block& b = block(g);
    const std::uint64_t d0 = door_bit(g, 44);
    const std::uint64_t d1 = door_bit(g, 52);
    std::uint64_t& w0 = b.door[(g >> 50) & 3];
    std::uint64_t& w1 = b.door[(g >> 58) & 3];
    unsigned add = weight;
    if ((w0 & d0) == 0 || (w1 & d1) == 0) {  // the first sighting goes to the doorkeeper
      w0 |= d0;
      w1 |= d1;
      --add;
    }
    bool saturated = true;
    for (std::size_t r = 0; r < depth; ++r) {
      const std::size_t i = counter(g, r);
      std::uint8_t& pair = b.counters[i / 2];
      const unsigned shift = (i % 2) * 4;
      const unsigned c = (pair >> shift) & 15u;
      const unsigned next = std::min<unsigned>(max_count, c + add);
      pair = static_cast<std::uint8_t>((pair & ~(15u << shift)) | (next << shift));
      saturated = saturated && next == max_count;
    }
    additions_ += weight;
    if (additions_ >= sample_) {
      age();
      return false;
    }
    return saturated;
  }

  // Counts one sighting of a key that record_slot reported saturated in this epoch():
  // the same effect as record_slot, without touching its block. Never allocates.
  // weight > 1 counts that many.
  void record_saturated(unsigned weight = 1) noexcept {
    additions_ += weight;
    if (additions_ >= sample_) age();
  }

  // Changes whenever counters are aged or cleared (never 0). Never allocates.
  [[nodiscard]] std::uint32_t epoch() const noexcept { return epoch_; }

  // The estimated recent count of the key with (mixed) hash h, at most max_count + 1.
  // Never allocates.
  [[nodiscard]] unsigned estimate(std::uint64_t h) const noexcept {
    const std::uint64_t g = mix64(h ^ 0x9e3779b97f4a7c15ULL);
    const Block& b = block(g);
    unsigned m = max_count;
    for (std::size_t r = 0; r < depth; ++r) {
      const std::size_t i = counter(g, r);
      m = std::min<unsigned>(m, (b.counters[i / 2] >> ((i % 2) * 4)) & 15u);
    }
    const bool door = (b.door[(g >> 50) & 3] & door_bit(g, 44)) != 0 && (b.door[(g >> 58) & 3] & door_bit(g, 52)) != 0;
    return m + (door ? 1u : 0u);
  }

  // Starts loading h's block into the cache. Reads only what is fixed at construction, so
  // it may run without the owner's lock (a prefetch never faults). Never allocates.
  void prefetch(std::uint64_t h) const noexcept { prefetch_slot(slot_of(h)); }
  // The same, for g from slot_of. Never allocates.
  void prefetch_slot([[maybe_unused]] std::uint64_t g) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(&block(g), 1);
#endif
  }

  // Forgets everything. Never allocates.
  void clear() noexcept {
    std::fill(blocks_.begin(), blocks_.end(), Block{});
    additions_ = 0;
    next_epoch();
  }

  // Sightings since the last aging, and how many trigger the next. Never allocates.
  [[nodiscard]] std::size_t additions() const noexcept { return additions_; }
  [[nodiscard]] std::size_t sample_size() const noexcept { return sample_; }

 private:
  // Four rows of sixteen 4-bit counters (two a byte), and 256 doorkeeper bits.
  struct alignas(64) Block {
    std::uint8_t counters[depth * 16 / 2]{};
    std::uint64_t door[4]{};
  };

  [[nodiscard]] Block& block(std::uint64_t g) noexcept { return blocks_[g & (blocks_.size() - 1)]; }
  [[nodiscard]] const Block& block(std::uint64_t g) const noexcept { return blocks_[g & (blocks_.size() - 1)]; }
  // Row r's counter: four bits of g per row, from bit 24 up (the low bits picked the block).
  [[nodiscard]] static std::size_t counter(std::uint64_t g, std::size_t r) noexcept {
    return r * 16 + static_cast<std::size_t>((g >> (24 + 4 * r)) & 15);
  }
  [[nodiscard]] static std::uint64_t door_bit(std::uint64_t g, int from) noexcept {
    return std::uint64_t{1} << ((g >> from) & 63);
  }

  void age() noexcept {
    for (Block& b : blocks_) {
      // Halves both nibbles of each byte at once.
      for (std::uint8_t& c : b.counters) c = static_cast<std::uint8_t>((c >> 1) & 0x77u);
      for (std::uint64_t& w : b.door) w = 0;
    }
    additions_ /= 2;
    next_epoch();
  }

  void next_epoch() noexcept {
    if (++epoch_ == 0) epoch_ = 1;
  }

  std::vector<Block> blocks_;
  std::size_t additions_ = 0;
  std::size_t sample_ = 0;
  std::uint32_t epoch_ = 1;
};

}  // namespace tailbatch::detail
