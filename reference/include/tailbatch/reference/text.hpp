// Text in, text out for the reference generator: a fixed word vocabulary (one entry per
// token id), the detokenizer, stop strings and the chat template.
//
// The vocabulary (detail/text_vocabulary_words.hpp, written once by
// reference/vocabulary/make_vocabulary.py and kept in the repository) has 2048 entries, the
// generator's vocab_size: id 0 is "." (also the start token fed to an empty prompt), id 1
// is ",", then about 500 common English words, then pseudo-words of two or three
// syllables. The generator is a random recurrent model, so its text is a deterministic
// word salad over this vocabulary: fit for testing a serving stack, not for reading.
//
// Tokenizing, in full:
//   - A word is a maximal run of ASCII letters and digits and bytes >= 0x80; ASCII letters
//     are lowercased. A word in the vocabulary is its id; any other word maps into it,
//     to 2 + fnv1a64(word) % 2046 (so every text has ids, and unknown words share them).
//   - '.', '!' and '?' are id 0; ',', ';' and ':' are id 1. Every other byte separates
//     words and is dropped.
// Detokenizing: a word id is " word" (a leading space, as GPT-style tokenizers give), id 0
// is "." and id 1 is ",". A completion's text is the concatenation of its tokens' pieces,
// so streamed pieces add up to exactly the non-streamed text.
//
// Thread-safety: TextVocabulary and ChatTemplate are immutable (every member may be called
// from many threads); a StopMatcher is one sequence's: one thread at a time.
// Exceptions: constructors allocate (std::bad_alloc); StopMatcher's constructor throws
// std::invalid_argument for an empty stop string; nothing else throws but std::bad_alloc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/reference/detail/text_vocabulary_words.hpp>
#include <tailbatch/reference/tokenizer.hpp>
#include <unordered_map>
#include <vector>

namespace tailbatch::reference {

class TextVocabulary {
 public:
  static constexpr std::uint32_t size =
      static_cast<std::uint32_t>(detail::text_vocabulary_words.size());
  static constexpr std::int32_t period = 0;
  static constexpr std::int32_t comma = 1;

  // Builds the word -> id table (allocates).
  TextVocabulary() {
    ids_.reserve(size * 2);
    for (std::uint32_t i = 0; i < size; ++i)
      ids_.emplace(detail::text_vocabulary_words[i], static_cast<std::int32_t>(i));
  }

  // Appends the ids of text to out under the rules above; returns how many it appended.
  // Allocates only when out grows. Thread-safe.
  std::size_t encode(std::string_view text, std::vector<std::int32_t>& out) const {
    std::size_t n = 0;
    std::string word;
    auto flush = [&] {
      if (word.empty()) return;
      out.push_back(id_of(word));
      ++n;
      word.clear();
    };
    for (char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c >= 0x80) {
        word.push_back(static_cast<char>(c));
      } else if (c >= 'A' && c <= 'Z') {
        word.push_back(static_cast<char>(c - 'A' + 'a'));
      } else {
        flush();
        if (c == '.' || c == '!' || c == '?') {
          out.push_back(period);
          ++n;
        } else if (c == ',' || c == ';' || c == ':') {
          out.push_back(comma);
          ++n;
        }
      }
    }
    flush();
    return n;
  }

  // The ids of text (allocates). Thread-safe.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> ids;
    encode(text, ids);
    return ids;
  }

  // The id of one lowercase word: its entry, or where an unknown word maps. Thread-safe.
  [[nodiscard]] std::int32_t id_of(std::string_view word) const noexcept {
    if (const auto it = ids_.find(word); it != ids_.end()) return it->second;
    return static_cast<std::int32_t>(2 + fnv1a64(word) % (size - 2));
  }

  // The vocabulary entry of id (no space); empty for an id outside [0, size). Thread-safe.
  [[nodiscard]] static std::string_view word(std::int32_t id) noexcept {
    if (id < 0 || static_cast<std::uint32_t>(id) >= size) return {};
    return detail::text_vocabulary_words[static_cast<std::size_t>(id)];
  }

  // Appends the text of one token: " word", or "." / "," without a space. Thread-safe.
  static void append_piece(std::int32_t id, std::string& out) {
    if (id < 0 || static_cast<std::uint32_t>(id) >= size) return;
    if (id > comma) out.push_back(' ');
    out += word(id);
  }

  // The text of a token sequence (allocates). Thread-safe.
  [[nodiscard]] static std::string decode(const std::vector<std::int32_t>& ids) {
    std::string s;
    for (std::int32_t id : ids) append_piece(id, s);
    return s;
  }

 private:
  std::unordered_map<std::string_view, std::int32_t> ids_;
};

// Stop strings over a stream of text pieces: push() returns the text that may be released
// now; text that could still be the start of a stop string is held back until it cannot.
// Once a stop string appears, the text before it is released, stopped() turns true and
// every later push returns nothing. finish() releases what is held at the end.
class StopMatcher {
 public:
  StopMatcher() = default;
  // Throws std::invalid_argument for an empty stop string. Allocates.
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (const auto& s : stops_) {
      if (s.empty())
        tailbatch::detail::throw_invalid_argument("StopMatcher: a stop string must not be empty");
    }
  }

  // Adds piece and returns the text now safe to release. Allocates.
  [[nodiscard]] std::string push(std::string_view piece) {
    if (stopped_) return {};
    if (stops_.empty()) return std::string(piece);
    held_ += piece;
    std::size_t first = std::string::npos;
    for (const auto& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
      stopped_ = true;
      std::string out = held_.substr(0, first);
      held_.clear();
      return out;
    }
    // Hold back the longest suffix that is a proper prefix of a stop string.
    std::size_t keep = 0;
    for (const auto& s : stops_) {
      for (std::size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
  }

  // The text still held (none once stopped); the matcher is then empty. Allocates.
  [[nodiscard]] std::string finish() {
    std::string out;
    out.swap(held_);
    return out;
  }

  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  [[nodiscard]] const std::vector<std::string>& stops() const noexcept { return stops_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// One chat message.
struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;  // plain text
};

// The chat template: each message becomes "<role>: <content>\n", in order, and the prompt
// ends with "assistant:", the turn the model writes. Under the tokenizer above that is the
// role's word, a comma (the ':'), the content's words, and finally "assistant" and a comma.
struct ChatTemplate {
  // The prompt text for messages (allocates). Thread-safe.
  [[nodiscard]] static std::string render(const std::vector<ChatMessage>& messages) {
    std::string p;
    for (const auto& m : messages) {
      p += m.role;
      p += ": ";
      p += m.content;
      p += '\n';
    }
    p += "assistant:";
    return p;
  }
};

}  // namespace tailbatch::reference
