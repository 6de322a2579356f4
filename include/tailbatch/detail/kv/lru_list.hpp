// The KvBlockPool's eviction order: the cached blocks no sequence references, least
// recently released first.
//
// An intrusive doubly linked list over block ids, its links in two arrays allocated at
// construction: push_back, remove and pop_front are O(1) and never allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tailbatch/detail/kv/prefix_index.hpp>
#include <vector>

namespace tailbatch::detail::kv {

class LruList {
 public:
  // A list over the block ids [0, blocks). Allocates (std::bad_alloc).
  explicit LruList(std::size_t blocks) : prev_(blocks, no_block), next_(blocks, no_block) {}

  // Appends b as the most recently used. Precondition: b is not in the list.
  void push_back(std::uint32_t b) noexcept {
    prev_[b] = tail_;
    next_[b] = no_block;
    if (tail_ != no_block) next_[tail_] = b;
    else head_ = b;
    tail_ = b;
    ++size_;
  }

  // Unlinks b. Precondition: b is in the list.
  void remove(std::uint32_t b) noexcept {
    if (prev_[b] != no_block) next_[prev_[b]] = next_[b];
    else head_ = next_[b];
    if (next_[b] != no_block) prev_[next_[b]] = prev_[b];
    else tail_ = prev_[b];
    prev_[b] = next_[b] = no_block;
    --size_;
  }

  // Unlinks and returns the least recently used block. Precondition: !empty().
  std::uint32_t pop_front() noexcept {
    const std::uint32_t b = head_;
    remove(b);
    return b;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

 private:
  std::vector<std::uint32_t> prev_;
  std::vector<std::uint32_t> next_;
  std::uint32_t head_ = no_block;
  std::uint32_t tail_ = no_block;
  std::size_t size_ = 0;
};

}  // namespace tailbatch::detail::kv
