// tailbatch-serve's OpenAI-compatible request decoding and response shapes: the bodies of
// POST /v1/completions, /v1/chat/completions and /v1/embeddings turned into plain values
// or an ApiError naming the field, and the error body every /v1/* error uses:
//   {"error": {"message": "...", "type": "...", "param": "..." | null, "code": "..." | null}}
// Kept apart from the server, like request_decoding.hpp, so that the fuzz target runs
// exactly this code. docs/openai-api.md lists every field: supported, ignored or rejected.
//
// Nothing here throws on bad input; only std::bad_alloc escapes. Thread-safe (no state).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "request_decoding.hpp"

namespace tailbatch_serve {

// One /v1/* error: the HTTP status and the OpenAI error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault; empty: null
  std::string code;   // a machine-readable code; empty: null
};

// The OpenAI error type of an HTTP status (docs/openai-api.md, "Errors").
[[nodiscard]] inline std::string_view error_type(int status) noexcept {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 500:
      return "server_error";
    case 503:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return "invalid_request_error";
  }
}

// {"error": {...}} for e. Allocates.
[[nodiscard]] inline nlohmann::json error_json(const ApiError& e) {
  nlohmann::json err = {
      {"message", e.message},
      {"type", error_type(e.status)},
      {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
      {"code", e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code)}};
  return {{"error", std::move(err)}};
}

// 404 model_not_found for a model this route does not serve (what: "generate text").
[[nodiscard]] inline ApiError model_not_found(std::string_view model, std::string_view what);

// Bounds on OpenAI requests. Plain values.
struct OpenAiLimits {
  std::size_t max_tokens = 1024;           // largest max_tokens / max_completion_tokens
  std::size_t default_max_tokens = 16;     // when neither is given (as vLLM)
  std::size_t max_stop = 4;                // stop strings
  std::size_t max_stop_bytes = 256;        // bytes of one stop string
  std::size_t max_embedding_inputs = 256;  // inputs of one /v1/embeddings request
  std::size_t max_messages = 256;          // chat messages
};

// POST /v1/completions or /v1/chat/completions, decoded.
struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::string prompt;  // chat: the messages rendered by the chat template (reference/text.hpp)
  std::size_t max_tokens = 16;
  std::vector<std::string> stop;
  float temperature = 1.0f;  // OpenAI's default
  float top_p = 1.0f;
  std::optional<std::int64_t> seed;
  std::string user;  // logged with the request id; names the tenant (docs/serving.md)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: rejected (see decode)
};

// POST /v1/embeddings, decoded.
struct EmbeddingsRequest {
  std::string model;
  std::vector<std::string> inputs;
  bool base64 = false;  // encoding_format "base64" (the Node client's default)
  std::string user;
};

namespace detail {

inline std::optional<ApiError> bad(std::string param, std::string message) {
  return ApiError{400, std::move(message), std::move(param), ""};
}

inline bool present(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

// A number field within [lo, hi], or an error.
inline std::optional<ApiError> read_number(const nlohmann::json& j, const char* key, double lo,
                                           double hi, float& out) {
  if (!present(j, key)) return std::nullopt;
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo ||
      v.get<double>() > hi) {
    return bad(key, std::string("'") + key + "' must be a number from " +
                        nlohmann::json(lo).dump() + " to " + nlohmann::json(hi).dump());
  }
  out = static_cast<float>(v.get<double>());
  return std::nullopt;
}

// The text of a chat message's content: a string, null, or an array of {"type": "text",
// "text": "..."} parts (joined).
inline std::optional<std::string> content_text(const nlohmann::json& c) {
  if (c.is_null()) return std::string();
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return std::nullopt;
  std::string s;
  for (const auto& part : c) {
    if (!part.is_object()) return std::nullopt;
    const auto type = part.find("type");
    const auto text = part.find("text");
    if (type == part.end() || *type != "text" || text == part.end() || !text->is_string())
      return std::nullopt;
    s += text->get<std::string>();
  }
  return s;
}

// What every OpenAI body's decoding shares: the body parsed as a JSON object (else a 400),
// "model" a string, then fields(j, r) for the route's own fields, then "user" a string. The
// first error, from any step, lands in `error`.
template <class Request, class Fields>
std::optional<Request> decode_body(std::string_view body, const DecodeLimits& dl, Request r,
                                   ApiError& error, Fields fields) {
  std::string msg;
  auto parsed = parse_object(body, dl, msg);
  if (!parsed) {
    error = ApiError{400, msg, "", ""};
    return std::nullopt;
  }
  const nlohmann::json& j = *parsed;
  std::optional<ApiError> e;
  if (!present(j, "model") || !j.at("model").is_string()) {
    e = bad("model", "'model' must be a string");
  } else {
    r.model = j.at("model").get<std::string>();
    e = fields(j, r);
  }
  if (!e && present(j, "user")) {
    if (j.at("user").is_string()) {
      r.user = j.at("user").get<std::string>();
    } else {
      e = bad("user", "'user' must be a string");
    }
  }
  if (e) {
    error = std::move(*e);
    return std::nullopt;
  }
  return r;
}

}  // namespace detail

// Renders chat messages as a prompt: each "<role>: <content>\n", then "assistant:" (the
// template of tailbatch::reference::ChatTemplate, repeated here so that this header needs
// only nlohmann-json).
inline std::string render_chat(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string p;
  for (const auto& [role, content] : messages) p += role + ": " + content + "\n";
  p += "assistant:";
  return p;
}

namespace detail {

// A completions body's own fields (decode_completion).
inline std::optional<ApiError> completion_fields(const nlohmann::json& j,
                                                 const OpenAiLimits& limits, CompletionRequest& r) {
  if (r.chat) {
    if (!detail::present(j, "messages") || !j.at("messages").is_array() || j.at("messages").empty())
      return detail::bad("messages", "'messages' must be a non-empty array");
    const auto& ms = j.at("messages");
    if (ms.size() > limits.max_messages)
      return detail::bad("messages",
                         "'messages' holds more than " + std::to_string(limits.max_messages));
    std::vector<std::pair<std::string, std::string>> rendered;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const auto& m = ms[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !detail::present(m, "role") || !m.at("role").is_string())
        return detail::bad(where + ".role", "each message needs a 'role' string");
      if (detail::present(m, "tool_calls") || m.at("role") == "tool" || m.at("role") == "function")
        return detail::bad(where, "tool and function messages are not supported");
      const auto c = m.find("content");
      auto text =
          c == m.end() ? std::optional<std::string>(std::string()) : detail::content_text(*c);
      if (!text)
        return detail::bad(where + ".content",
                           "'content' must be a string or an array of text parts");
      rendered.emplace_back(m.at("role").get<std::string>(), std::move(*text));
    }
    r.prompt = render_chat(rendered);
  } else {
    if (!detail::present(j, "prompt")) return detail::bad("prompt", "'prompt' must be a string");
    const auto& p = j.at("prompt");
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && p.size() > 1) {
      return detail::bad("prompt", "one prompt per request: batched prompts are not supported");
    } else {
      return detail::bad("prompt",
                         "'prompt' must be a string (token-id prompts are not supported)");
    }
    if (detail::present(j, "echo") && j.at("echo") == true)
      return detail::bad("echo", "'echo' is not supported");
    if (detail::present(j, "suffix")) return detail::bad("suffix", "'suffix' is not supported");
    if (detail::present(j, "best_of") && j.at("best_of") != 1)
      return detail::bad("best_of", "'best_of' other than 1 is not supported");
  }
  // Refused: asked for, and not something this server does.
  if (detail::present(j, "n") && j.at("n") != 1)
    return detail::bad("n", "'n' other than 1 is not supported");
  if (detail::present(j, "logprobs") && j.at("logprobs") != false)
    return detail::bad("logprobs", "'logprobs' is not supported");
  if (detail::present(j, "top_logprobs"))
    return detail::bad("top_logprobs", "'top_logprobs' is not supported");
  for (const char* k :
       {"tools", "tool_choice", "functions", "function_call", "response_format", "logit_bias"}) {
    if (!detail::present(j, k)) continue;
    const auto& v = j.at(k);
    if ((v.is_array() || v.is_object()) && v.empty()) continue;
    if (std::string_view(k) == "response_format" && v.is_object() && v.value("type", "") == "text")
      continue;
    if (std::string_view(k) == "tool_choice" && v == "none") continue;
    return detail::bad(k, std::string("'") + k + "' is not supported");
  }
  // Supported.
  const char* tokens_key = nullptr;
  for (const char* k : {"max_completion_tokens", "max_tokens"}) {
    if (detail::present(j, k)) {
      tokens_key = k;
      break;
    }
  }
  if (tokens_key) {
    const auto& m = j.at(tokens_key);
    std::int64_t n = 0;
    if (m.is_number_unsigned()) {
      n = static_cast<std::int64_t>(
          std::min<std::uint64_t>(m.get<std::uint64_t>(), std::uint64_t{1} << 62));
    } else if (m.is_number_integer()) {
      n = m.get<std::int64_t>();
    }
    if (!m.is_number_integer() || n < 1 || static_cast<std::uint64_t>(n) > limits.max_tokens)
      return detail::bad(tokens_key, std::string("'") + tokens_key +
                                         "' must be an integer from 1 to " +
                                         std::to_string(limits.max_tokens));
    r.max_tokens = static_cast<std::size_t>(n);
  }
  if (auto e = detail::read_number(j, "temperature", 0.0, 2.0, r.temperature)) return e;
  if (auto e = detail::read_number(j, "top_p", 0.0, 1.0, r.top_p)) return e;
  if (detail::present(j, "top_p") && !(r.top_p > 0.0f))
    return detail::bad("top_p", "'top_p' must be above 0");
  if (detail::present(j, "seed")) {
    const auto& s = j.at("seed");
    if (!s.is_number_integer()) return detail::bad("seed", "'seed' must be an integer");
    r.seed = s.is_number_unsigned() ? static_cast<std::int64_t>(s.get<std::uint64_t>())
                                    : s.get<std::int64_t>();
  }
  if (detail::present(j, "stop")) {
    const auto& s = j.at("stop");
    std::vector<std::string> stops;
    if (s.is_string()) {
      stops.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string())
          return detail::bad("stop", "'stop' must be a string or an array of strings");
        stops.push_back(x.get<std::string>());
      }
    } else {
      return detail::bad("stop", "'stop' must be a string or an array of strings");
    }
    if (stops.size() > limits.max_stop)
      return detail::bad("stop",
                         "'stop' holds at most " + std::to_string(limits.max_stop) + " strings");
    for (const auto& x : stops) {
      if (x.empty() || x.size() > limits.max_stop_bytes)
        return detail::bad("stop", "each stop string must hold 1 to " +
                                       std::to_string(limits.max_stop_bytes) + " bytes");
    }
    r.stop = std::move(stops);
  }
  if (detail::present(j, "stream")) {
    if (!j.at("stream").is_boolean())
      return detail::bad("stream", "'stream' must be true or false");
    r.stream = j.at("stream").get<bool>();
  }
  if (detail::present(j, "stream_options")) {
    const auto& so = j.at("stream_options");
    if (!so.is_object()) return detail::bad("stream_options", "'stream_options' must be an object");
    if (detail::present(so, "include_usage")) {
      if (!so.at("include_usage").is_boolean())
        return detail::bad("stream_options.include_usage", "'include_usage' must be true or false");
      r.include_usage = so.at("include_usage").get<bool>();
    }
  }
  return std::nullopt;
}

}  // namespace detail

// Decodes a completions (chat = false) or chat completions (chat = true) body. Unknown
// fields are ignored; n > 1, logprobs, tools and friends are refused naming the field.
[[nodiscard]] inline std::optional<CompletionRequest> decode_completion(std::string_view body,
                                                                        bool chat,
                                                                        const DecodeLimits& dl,
                                                                        const OpenAiLimits& limits,
                                                                        ApiError& error) {
  CompletionRequest r;
  r.chat = chat;
  r.max_tokens = limits.default_max_tokens;
  return detail::decode_body(body, dl, std::move(r), error,
                             [&](const nlohmann::json& j, CompletionRequest& out) {
                               return detail::completion_fields(j, limits, out);
                             });
}

namespace detail {

// An embeddings body's own fields (decode_embeddings).
inline std::optional<ApiError> embeddings_fields(const nlohmann::json& j,
                                                 const OpenAiLimits& limits, std::size_t dimension,
                                                 EmbeddingsRequest& r) {
  if (!detail::present(j, "input"))
    return detail::bad("input", "'input' must be a string or an array of strings");
  const auto& in = j.at("input");
  if (in.is_string()) {
    r.inputs.push_back(in.get<std::string>());
  } else if (in.is_array()) {
    if (in.empty()) return detail::bad("input", "'input' must not be empty");
    if (in.size() > limits.max_embedding_inputs)
      return detail::bad("input", "'input' holds at most " +
                                      std::to_string(limits.max_embedding_inputs) + " strings");
    for (const auto& x : in) {
      if (!x.is_string())
        return detail::bad(
            "input",
            "'input' must be a string or an array of strings (token ids are not supported)");
      r.inputs.push_back(x.get<std::string>());
    }
  } else {
    return detail::bad("input", "'input' must be a string or an array of strings");
  }
  if (detail::present(j, "encoding_format")) {
    const auto& f = j.at("encoding_format");
    if (f == "base64") {
      r.base64 = true;
    } else if (f != "float") {
      return detail::bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    }
  }
  if (detail::present(j, "dimensions")) {
    const auto& d = j.at("dimensions");
    if (!d.is_number_integer() || d.get<std::int64_t>() != static_cast<std::int64_t>(dimension))
      return detail::bad("dimensions",
                         "'dimensions' must be " + std::to_string(dimension) + " (the model's)");
  }
  return std::nullopt;
}

}  // namespace detail

// Decodes an embeddings body: "input" a string or a non-empty array of at most
// limits.max_embedding_inputs strings; "encoding_format" "float" (default) or "base64";
// "dimensions", if given, must equal dimension.
[[nodiscard]] inline std::optional<EmbeddingsRequest> decode_embeddings(std::string_view body,
                                                                        const DecodeLimits& dl,
                                                                        const OpenAiLimits& limits,
                                                                        std::size_t dimension,
                                                                        ApiError& error) {
  return detail::decode_body(body, dl, EmbeddingsRequest{}, error,
                             [&](const nlohmann::json& j, EmbeddingsRequest& out) {
                               return detail::embeddings_fields(j, limits, dimension, out);
                             });
}

// Standard base64 (RFC 4648, with padding) of bytes. Allocates.
[[nodiscard]] inline std::string base64(std::string_view bytes) {
  static constexpr char table[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const auto n = (static_cast<unsigned>(static_cast<unsigned char>(bytes[i])) << 16) |
                   (static_cast<unsigned>(static_cast<unsigned char>(bytes[i + 1])) << 8) |
                   static_cast<unsigned>(static_cast<unsigned char>(bytes[i + 2]));
    out += table[(n >> 18) & 63];
    out += table[(n >> 12) & 63];
    out += table[(n >> 6) & 63];
    out += table[n & 63];
  }
  if (i < bytes.size()) {
    auto n = static_cast<unsigned>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size())
      n |= static_cast<unsigned>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += table[(n >> 18) & 63];
    out += table[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? table[(n >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// A client's string made safe for one log line: visible ASCII only (others become '?'),
// at most 64 characters. Allocates.
[[nodiscard]] inline std::string loggable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += (c > 0x20 && c < 0x7f) ? c : '?';
  return out;
}

inline ApiError model_not_found(std::string_view model, std::string_view what) {
  return ApiError{404,
                  "the model '" + loggable(model) + "' does not exist or does not " +
                      std::string(what) + "; GET /v1/models lists them",
                  "model", "model_not_found"};
}

// Compares two strings in time that depends on their lengths only (the API key check).
[[nodiscard]] inline bool constant_time_equal(std::string_view a, std::string_view b) noexcept {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace tailbatch_serve
