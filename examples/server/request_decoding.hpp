// tailbatch-serve's request decoding: everything the server reads from a client's bytes
// (the headers it looks at, the JSON bodies, the generate parameters) turned into plain
// values or a 400 message. Kept apart from the server so that the fuzz target
// (fuzz_request_decoding.cpp) runs exactly this code.
//
// Nothing here throws on bad input: every function returns the decoded value or sets
// `error` to a message fit to send back to the client. Only std::bad_alloc escapes.
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace tailbatch_serve {

// Bounds on what a request may ask for. Plain values.
struct DecodeLimits {
  std::size_t max_texts = 256;             // texts in one /v1/classify request
  std::size_t max_json_depth = 16;         // nesting of arrays and objects in a body
  std::size_t max_generate_tokens = 1024;  // max_tokens of one /v1/generate request
  std::size_t default_generate_tokens = 32;
  std::int64_t max_timeout_ms = 3'600'000;  // X-Request-Timeout-Ms above this is refused
};

// POST /v1/classify: {"text": "..."} or {"texts": ["...", ...]}.
struct ClassifyRequest {
  std::vector<std::string> texts;
  bool batch_form = false;  // "texts" was given: answer with {"results": [...]}
};

// POST /v1/generate: {"prompt": "...", "max_tokens": N, "stream": true|false}.
struct GenerateRequest {
  std::string prompt;
  std::size_t max_tokens = 0;
  bool stream = false;
};

// The parser limits the server reads requests with: headers beyond header_limit_bytes are
// answered 431 (a body beyond --max-body-bytes gets 413).
inline constexpr std::size_t header_limit_bytes = 16 * 1024;

// The name of the header that carries a request's time budget in milliseconds.
inline constexpr std::string_view timeout_header = "X-Request-Timeout-Ms";

// The deepest nesting of JSON arrays and objects in text, brackets inside strings
// ignored. Stops counting at limit + 1. Never allocates. Thread-safe.
[[nodiscard]] inline std::size_t json_depth(std::string_view text, std::size_t limit) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

namespace detail {

// How every decoder here refuses: sets error to message, returns nullopt.
inline std::nullopt_t refuse(std::string& error, std::string message) {
  error = std::move(message);
  return std::nullopt;
}

}  // namespace detail

// Parses body as one JSON object, or sets error and returns nullopt. Allocates. Thread-safe.
[[nodiscard]] inline std::optional<nlohmann::json> parse_object(std::string_view body,
                                                                const DecodeLimits& limits,
                                                                std::string& error) {
  // JSON text never holds a raw NUL; refusing it here means no parser can stop at one and
  // let the bytes after it pass unread.
  if (body.find('\0') != std::string_view::npos)
    return detail::refuse(error, "the body holds a NUL byte");
  if (json_depth(body, limits.max_json_depth) > limits.max_json_depth)
    return detail::refuse(error, "the body nests JSON deeper than " +
                                     std::to_string(limits.max_json_depth) + " levels");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    // Say where, without echoing the client's bytes back.
    return detail::refuse(error, "malformed JSON at byte " + std::to_string(e.byte));
  } catch (const nlohmann::json::exception&) {
    return detail::refuse(error, "malformed JSON");
  }
  if (!j.is_object()) return detail::refuse(error, "the body must be a JSON object");
  return j;
}

// Decodes a /v1/classify body. Exactly one of "text" (a string) and "texts" (a non-empty
// array of at most limits.max_texts strings) must be present. Allocates. Thread-safe.
[[nodiscard]] inline std::optional<ClassifyRequest> decode_classify(std::string_view body,
                                                                    const DecodeLimits& limits,
                                                                    std::string& error) {
  auto j = parse_object(body, limits, error);
  if (!j) return std::nullopt;
  const auto text = j->find("text");
  const auto texts = j->find("texts");
  const bool has_text = text != j->end(), has_texts = texts != j->end();
  if (has_text == has_texts)
    return detail::refuse(
        error, "give exactly one of \"text\" (a string) and \"texts\" (an array of strings)");
  ClassifyRequest r;
  if (has_text) {
    if (!text->is_string()) return detail::refuse(error, "\"text\" must be a string");
    r.texts.push_back(text->get<std::string>());
    return r;
  }
  r.batch_form = true;
  if (!texts->is_array()) return detail::refuse(error, "\"texts\" must be an array of strings");
  if (texts->empty()) return detail::refuse(error, "\"texts\" must not be empty");
  if (texts->size() > limits.max_texts)
    return detail::refuse(error, "\"texts\" holds " + std::to_string(texts->size()) +
                                     " texts; at most " + std::to_string(limits.max_texts) +
                                     " per request");
  r.texts.reserve(texts->size());
  for (const auto& t : *texts) {
    if (!t.is_string()) return detail::refuse(error, "\"texts\" must be an array of strings");
    r.texts.push_back(t.get<std::string>());
  }
  return r;
}

// Decodes a /v1/generate body: "prompt" a string (required), "max_tokens" an integer in
// [1, limits.max_generate_tokens] (default limits.default_generate_tokens), "stream" a
// boolean (default false). Allocates. Thread-safe.
[[nodiscard]] inline std::optional<GenerateRequest> decode_generate(std::string_view body,
                                                                    const DecodeLimits& limits,
                                                                    std::string& error) {
  auto j = parse_object(body, limits, error);
  if (!j) return std::nullopt;
  GenerateRequest r;
  const auto prompt = j->find("prompt");
  if (prompt == j->end() || !prompt->is_string())
    return detail::refuse(error, "\"prompt\" must be a string");
  r.prompt = prompt->get<std::string>();
  r.max_tokens = limits.default_generate_tokens;
  if (const auto m = j->find("max_tokens"); m != j->end()) {
    std::uint64_t n = 0;
    if (m->is_number_unsigned()) {
      n = m->get<std::uint64_t>();
    } else if (m->is_number_integer()) {
      const auto i = m->get<std::int64_t>();
      n = i < 0 ? 0 : static_cast<std::uint64_t>(i);
    }
    if (n < 1 || n > limits.max_generate_tokens)
      return detail::refuse(error, "\"max_tokens\" must be an integer from 1 to " +
                                       std::to_string(limits.max_generate_tokens));
    r.max_tokens = static_cast<std::size_t>(n);
  }
  if (const auto s = j->find("stream"); s != j->end()) {
    if (!s->is_boolean()) return detail::refuse(error, "\"stream\" must be true or false");
    r.stream = s->get<bool>();
  }
  return r;
}

// Decodes the X-Request-Timeout-Ms header's value: a decimal integer of milliseconds from
// 0 to limits.max_timeout_ms, optional surrounding spaces or tabs. 0 means no budget, as
// SubmitOptions::timeout = 0 does in the library: the request has no deadline at all (not
// even --default-timeout-ms). Sets error on anything else. Never allocates but for the message.
// Thread-safe.
[[nodiscard]] inline std::optional<std::chrono::milliseconds> decode_timeout(
    std::string_view value, const DecodeLimits& limits, std::string& error) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  std::int64_t ms = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || ms < 0 ||
      ms > limits.max_timeout_ms) {
    return detail::refuse(error, std::string(timeout_header) +
                                     " must be an integer number of milliseconds from 0 to " +
                                     std::to_string(limits.max_timeout_ms));
  }
  return std::chrono::milliseconds(ms);
}

}  // namespace tailbatch_serve
