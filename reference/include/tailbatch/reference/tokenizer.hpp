// The reference tokenizer: text to token ids, fast and allocation-free on its hot path.
//
// Rules, in full:
//   - A word is a maximal run of word bytes: ASCII letters and digits, and every byte
//     >= 0x80 (so UTF-8 text stays in one piece). Every other byte (whitespace, ASCII
//     punctuation, control characters) separates words and is dropped. "don't" is two
//     words, "don" and "t".
//   - ASCII letters are lowercased; other bytes are kept as they are.
//   - Reserved words (given at construction, e.g. a sentiment lexicon) get ids 0..n-1 in
//     the order given. Every other word gets  n + fnv1a64(word) % (vocab_size - n):  a
//     hashed vocabulary, so that any text has ids without a vocabulary file, and distinct
//     words may share an id (the model sees them as one word).
//   - At most max_tokens ids per text: the rest of a longer text is ignored. This bounds
//     the cost of one request, as a real tokenizer's max_length does. The reference
//     classifier's tokenizer keeps max_tokens + 1 ids, one more than its model reads, so
//     that the model can tell a longer text and say so (Prediction::truncated).
//
// The hash is 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the
// lowercased bytes of the word. It is stable: the same text gives the same ids on every
// platform, compiler and standard library, so ids computed on one machine may be sent to
// another.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch::reference {

// 64-bit FNV-1a of the bytes. Never throws. Thread-safe.
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::string_view bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

struct TokenizerConfig {
  // Number of distinct ids, reserved words included. Must exceed the number of reserved words.
  std::uint32_t vocab_size = 16384;
  // Ids produced per text at most; the rest of the text is ignored. Must be >= 1.
  std::size_t max_tokens = 128;
};

namespace detail {

// Byte class table: 0 for a separator, else the byte as it enters the hash (lowercased).
inline constexpr std::array<unsigned char, 256> token_byte_table = [] {
  std::array<unsigned char, 256> t{};
  for (std::size_t c = 0; c < 256; ++c) {
    if (c >= 'A' && c <= 'Z') {
      t[c] = static_cast<unsigned char>(c - 'A' + 'a');
    } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c >= 0x80) {
      t[c] = static_cast<unsigned char>(c);
    }
  }
  return t;
}();

}  // namespace detail

// Text to token ids under the rules above.
//
// A Tokenizer is immutable after construction: every const member may be called from many
// threads at once. Construction throws std::invalid_argument for bad options or reserved
// words (naming the field), std::bad_alloc when out of memory.
class Tokenizer {
 public:
  // Builds the reserved-word table (allocates). Each reserved word must be one word under
  // the rules above, in lowercase, and appear once; otherwise throws std::invalid_argument.
  explicit Tokenizer(TokenizerConfig options = {}, std::span<const std::string_view> reserved = {})
      : options_(options) {
    if (options_.max_tokens < 1) tailbatch::detail::throw_invalid_argument("Tokenizer: max_tokens must be >= 1");
    if (options_.vocab_size <= reserved.size()) {
      tailbatch::detail::throw_invalid_argument("Tokenizer: vocab_size must exceed the number of reserved words");
    }
    reserved_.reserve(reserved.size());
    std::size_t slots = 16;
    while (slots < 2 * reserved.size()) slots *= 2;
    slots_.assign(slots, Slot{});
    for (std::string_view word : reserved) {
      if (word.empty()) tailbatch::detail::throw_invalid_argument("Tokenizer: reserved words must not be empty");
      for (char c : word) {
        auto u = static_cast<unsigned char>(c);
        if (detail::token_byte_table[u] != u) {
          tailbatch::detail::throw_invalid_argument("Tokenizer: reserved word '" + std::string(word) +
                                      "' is not a single lowercase word");
        }
      }
      const std::uint64_t h = fnv1a64(word);
      if (find_reserved(h, word) != npos) {
        tailbatch::detail::throw_invalid_argument("Tokenizer: reserved word '" + std::string(word) + "' appears twice");
      }
      const auto id = static_cast<std::uint32_t>(reserved_.size());
      reserved_.emplace_back(word);
      std::size_t i = h & (slots_.size() - 1);
      while (slots_[i].used) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = Slot{h, id, true};
    }
  }

  // Appends the ids of text to out and returns how many it appended (at most max_tokens).
  // Allocates only when out must grow: a vector reused across calls makes this
  // allocation-free. Throws only std::bad_alloc (from out). Thread-safe.
  std::size_t tokenize(std::string_view text, std::vector<std::uint32_t>& out) const {
    std::size_t count = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const auto* end = p + text.size();
    while (p != end && count < options_.max_tokens) {
      while (p != end && detail::token_byte_table[*p] == 0) ++p;
      if (p == end) break;
      const auto* word_begin = p;
      std::uint64_t h = 0xcbf29ce484222325ULL;
      for (unsigned char b; p != end && (b = detail::token_byte_table[*p]) != 0; ++p) {
        h ^= b;
        h *= 0x100000001b3ULL;
      }
      out.push_back(id_of_hashed(h, word_begin, p));
      ++count;
    }
    return count;
  }

  // The ids of text, in a new vector (allocates). Throws std::bad_alloc. Thread-safe.
  [[nodiscard]] std::vector<std::uint32_t> tokenize(std::string_view text) const {
    std::vector<std::uint32_t> ids;
    tokenize(text, ids);
    return ids;
  }

  // The id of one word, which is lowercased first (ASCII letters only). A word containing
  // separator bytes is hashed whole, so pass single words. Never allocates. Thread-safe.
  [[nodiscard]] std::uint32_t id_of(std::string_view word) const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (char c : word) {
      auto u = static_cast<unsigned char>(c);
      h ^= (u >= 'A' && u <= 'Z') ? static_cast<unsigned char>(u - 'A' + 'a') : u;
      h *= 0x100000001b3ULL;
    }
    const auto* b = reinterpret_cast<const unsigned char*>(word.data());
    return id_of_hashed(h, b, b + word.size());
  }

  // Number of reserved words (their ids are 0..reserved_count()-1). Thread-safe.
  [[nodiscard]] std::uint32_t reserved_count() const noexcept {
    return static_cast<std::uint32_t>(reserved_.size());
  }

  // The options given at construction. Thread-safe.
  [[nodiscard]] const TokenizerConfig& config() const noexcept { return options_; }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t id = 0;
    bool used = false;
  };
  static constexpr std::uint32_t npos = 0xffffffffu;

  // Compares a reserved word with a raw (not yet lowercased) slice of the text.
  static bool equal_lowered(std::string_view reserved, const unsigned char* b, const unsigned char* e) noexcept {
    if (static_cast<std::size_t>(e - b) != reserved.size()) return false;
    for (std::size_t i = 0; i < reserved.size(); ++i) {
      unsigned char c = b[i];
      if (c >= 'A' && c <= 'Z') c = static_cast<unsigned char>(c - 'A' + 'a');
      if (c != static_cast<unsigned char>(reserved[i])) return false;
    }
    return true;
  }

  [[nodiscard]] std::uint32_t find_reserved(std::uint64_t h, std::string_view word) const noexcept {
    const auto* b = reinterpret_cast<const unsigned char*>(word.data());
    return find_reserved(h, b, b + word.size());
  }

  [[nodiscard]] std::uint32_t find_reserved(std::uint64_t h, const unsigned char* b,
                                            const unsigned char* e) const noexcept {
    for (std::size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (!s.used) return npos;
      if (s.hash == h && equal_lowered(reserved_[s.id], b, e)) return s.id;
    }
  }

  [[nodiscard]] std::uint32_t id_of_hashed(std::uint64_t h, const unsigned char* b,
                                           const unsigned char* e) const noexcept {
    if (!reserved_.empty()) {
      const std::uint32_t r = find_reserved(h, b, e);
      if (r != npos) return r;
    }
    const std::uint64_t n = reserved_.size();
    return static_cast<std::uint32_t>(n + h % (options_.vocab_size - n));
  }

  TokenizerConfig options_;
  std::vector<std::string> reserved_;
  std::vector<Slot> slots_;  // open addressing on the word's hash; always at least half empty
};

}  // namespace tailbatch::reference
