// The KvBlockPool's prefix index: which blocks hold the content of a given chained hash.
//
// An open-addressing multimap from a 64-bit key to block ids, sized at construction for
// every block of the pool at once and never more than half full, so that insert, erase and
// lookup never allocate. Equal keys may map to several blocks: two blocks with the same
// content (filled by two sequences before either was indexed), or two contents whose hashes
// collide. The caller tells them apart with its own predicate (find_if), which is how the
// pool verifies the tokens behind a hash. Linear probing with backward-shift deletion: no
// tombstones, so a lookup stops at the first empty slot however long the index has run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tailbatch/detail/hash.hpp>
#include <vector>

namespace tailbatch::detail::kv {

// A block id that names no block: an empty slot, the end of a list, a miss.
inline constexpr std::uint32_t no_block = 0xFFFFFFFFu;

class PrefixIndex {
 public:
  // Room for max_entries entries at once. Allocates (std::bad_alloc).
  explicit PrefixIndex(std::size_t max_entries) {
    std::size_t capacity = 2;
    while (capacity < 2 * max_entries) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
  }

  // Adds (key, block). Precondition: fewer than max_entries entries, and (key, block) absent.
  void insert(std::uint64_t key, std::uint32_t block) noexcept {
    std::size_t i = home(key);
    while (slots_[i].block != no_block) i = (i + 1) & mask_;
    slots_[i] = Slot{key, block};
    ++size_;
  }

  // Removes (key, block); nothing if it is absent.
  void erase(std::uint64_t key, std::uint32_t block) noexcept {
    std::size_t i = home(key);
    while (slots_[i].block != no_block && !(slots_[i].block == block && slots_[i].key == key))
      i = (i + 1) & mask_;
    if (slots_[i].block == no_block) return;
    --size_;
    // Backward shift: pull later entries of the probe run into the hole when their home
    // lies at or before it (cyclically), so that every entry stays reachable from its home
    // through occupied slots.
    std::size_t hole = i;
    for (std::size_t j = (hole + 1) & mask_; slots_[j].block != no_block; j = (j + 1) & mask_) {
      const std::size_t from_home = (j - home(slots_[j].key)) & mask_;
      const std::size_t from_hole = (j - hole) & mask_;
      if (from_home >= from_hole) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
  }

  // The first block stored under key for which accept(block) is true; no_block if none.
  template <class Accept>
  [[nodiscard]] std::uint32_t find_if(std::uint64_t key, Accept&& accept) const noexcept {
    for (std::size_t i = home(key); slots_[i].block != no_block; i = (i + 1) & mask_) {
      if (slots_[i].key == key && accept(slots_[i].block)) return slots_[i].block;
    }
    return no_block;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  struct Slot {
    std::uint64_t key = 0;
    std::uint32_t block = no_block;
  };

  // The key is a hash already, but maybe a weak one (a user's hasher): mix it again so that
  // the low bits, which pick the slot, depend on all of it.
  [[nodiscard]] std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>(mix64(key)) & mask_;
  }

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace tailbatch::detail::kv
