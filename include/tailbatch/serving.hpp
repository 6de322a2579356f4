// Serving: what a server needs at its edge to put tailbatch's outcomes on the wire.
//
// Transport-agnostic and standard library only: these functions produce numbers and
// strings; the server (Boost.Beast, cpp-httplib, gRPC-gateway, ...) writes them.
//
//   http_status(outcome)            Outcome / Error / StreamEnd / (Status, RejectReason)
//                                   -> the HTTP status code to answer with
//   retry_after_seconds(hint)       a rejection's retry-after hint -> the Retry-After header
//                                   (whole seconds, rounded up: 68 ms -> 1, never 0)
//   retry_after_milliseconds(hint)  the same for a `retry-after-ms` header
//   SseEncoder<Token>               TokenStreamer chunks and its end -> text/event-stream
//                                   events, appended to a string the server owns
//
// The status mapping (docs/serving.md has the reasoning):
//
//   ok                               200 OK
//   rejected / too_large             413 Content Too Large   (it can never run: do not retry)
//   rejected / queue_full            503 Service Unavailable + Retry-After
//   rejected / overloaded            503 Service Unavailable + Retry-After
//   rejected / shutting_down         503 Service Unavailable (retry on another replica)
//   rejected / shed                  503 Service Unavailable + Retry-After (dropped from the queue)
//   rejected / quota_exceeded        429 Too Many Requests + Retry-After (this tenant's own quota)
//   deadline_exceeded                504 Gateway Timeout
//   cancelled                        499 Client Closed Request (nginx's code; the client left)
//   failed                           500 Internal Server Error
//
// Overload is 503, not 429: 429 tells a client that *it* sent too much (a per-tenant
// quota, RejectReason::quota_exceeded), 503 that the server is short of capacity, which
// is what a full queue, a shed request or a shut limiter means; load balancers and retry libraries treat 503 + Retry-After as
// "try again later or elsewhere".
//
// SSE framing follows the HTML Living Standard's event-stream format: each event is a
// block of `field: value` lines ended by an empty line; a data value that contains line
// breaks (CR, LF or CRLF) becomes one `data:` line per line, which the client joins with
// LF; `id` and `event` values cannot carry line breaks, so CR, LF and NUL are removed from
// them; comment lines (`: ...`) are ignored by clients and keep idle connections open.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <tailbatch/outcome.hpp>
#include <tailbatch/token_streamer.hpp>

namespace tailbatch {

// ---- HTTP status ------------------------------------------------------------------------

// The HTTP status code for a request that ended with status s (and reason r, read only
// when s is Status::rejected): see the table in the file comment. Never allocates.
// Thread-safe.
[[nodiscard]] constexpr int http_status(Status s, RejectReason r = RejectReason::none) noexcept {
  switch (s) {
    case Status::ok:
      return 200;
    case Status::rejected:
      switch (r) {
        case RejectReason::too_large:
          return 413;
        case RejectReason::quota_exceeded:
          return 429;
        case RejectReason::queue_full:
        case RejectReason::shed:
        case RejectReason::overloaded:
        case RejectReason::shutting_down:
        case RejectReason::none:
          return 503;
      }
      return 503;
    case Status::deadline_exceeded:
      return 504;
    case Status::cancelled:
      return 499;
    case Status::failed:
      return 500;
  }
  return 500;
}

// The HTTP status code for an outcome. Never allocates. Thread-safe.
template <class T>
[[nodiscard]] constexpr int http_status(const Outcome<T>& outcome) noexcept {
  return http_status(outcome.status(), outcome.reason());
}

// The HTTP status code for an Error. Never allocates. Thread-safe.
[[nodiscard]] constexpr int http_status(const Error& error) noexcept { return http_status(error.status, error.reason); }

// The HTTP status code for how a stream ended. Never allocates. Thread-safe.
[[nodiscard]] constexpr int http_status(const StreamEnd& end) noexcept { return http_status(end.status, end.reason); }

// True for the rejections a client may retry later (queue_full, overloaded, shutting_down,
// quota_exceeded, shed): the ones a response should carry a Retry-After header for. Never
// allocates. Thread-safe.
[[nodiscard]] constexpr bool retryable(Status s, RejectReason r) noexcept {
  return s == Status::rejected &&
         (r == RejectReason::queue_full || r == RejectReason::overloaded || r == RejectReason::shutting_down ||
          r == RejectReason::quota_exceeded || r == RejectReason::shed);
}

// The reason phrase for the codes http_status() returns ("Service Unavailable"; 499:
// "Client Closed Request"); "Unknown" for any other code. Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view http_reason_phrase(int code) noexcept {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

// ---- Retry-After ------------------------------------------------------------------------

// A retry-after hint (Error::retry_after, Outcome::retry_after(), StreamEnd::retry_after)
// in whole seconds, rounded up, for the HTTP Retry-After header (which has no fractions):
// any positive hint gives at least 1 (68 ms -> 1, 1 s -> 1, 1 s + 1 ns -> 2). A hint <= 0
// means "unknown" and gives 0: send no header, or a default of your own. Never overflows
// (nanoseconds::max() -> 9223372037). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::uint64_t retry_after_seconds(std::chrono::nanoseconds hint) noexcept {
  if (hint <= std::chrono::nanoseconds::zero()) return 0;
  const auto ns = static_cast<std::uint64_t>(hint.count());
  constexpr std::uint64_t per_second = 1'000'000'000;
  return ns / per_second + (ns % per_second != 0 ? 1 : 0);
}

// The same hint in whole milliseconds, rounded up (1 ns -> 1, 68 ms -> 68), for clients
// that read a millisecond header: tailbatch-serve sends it as `retry-after-ms` (the name
// OpenAI's and Azure's clients read) beside Retry-After. A hint <= 0 gives 0 (unknown).
// Never allocates. Thread-safe.
[[nodiscard]] constexpr std::uint64_t retry_after_milliseconds(std::chrono::nanoseconds hint) noexcept {
  if (hint <= std::chrono::nanoseconds::zero()) return 0;
  const auto ns = static_cast<std::uint64_t>(hint.count());
  constexpr std::uint64_t per_ms = 1'000'000;
  return ns / per_ms + (ns % per_ms != 0 ? 1 : 0);
}

// ---- Server-Sent Events -----------------------------------------------------------------

// The Content-Type of an event stream.
inline constexpr std::string_view sse_content_type = "text/event-stream";

namespace detail {

// Appends `name: value\n` per line of value (split at CRLF, CR or LF). An empty value
// still gives one line, so that `data` always dispatches its event.
inline void sse_append_lines(std::string& out, std::string_view name, std::string_view value) {
  std::size_t begin = 0;
  for (;;) {
    std::size_t end = begin;
    while (end < value.size() && value[end] != '\n' && value[end] != '\r') ++end;
    out.append(name);
    out.push_back(':');
    if (end > begin) {
      out.push_back(' ');
      out.append(value.substr(begin, end - begin));
    }
    out.push_back('\n');
    if (end == value.size()) return;
    begin = end + 1;
    if (value[end] == '\r' && begin < value.size() && value[begin] == '\n') ++begin;
  }
}

// Appends `name: value\n` with CR, LF and NUL removed from value (fields that cannot span
// lines). Nothing for an empty value.
inline void sse_append_single(std::string& out, std::string_view name, std::string_view value) {
  if (value.empty()) return;
  out.append(name);
  out.append(": ");
  for (char c : value) {
    if (c != '\n' && c != '\r' && c != '\0') out.push_back(c);
  }
  out.push_back('\n');
}

// Appends s as the body of a JSON string (no quotes): ", \ and control characters
// escaped; other bytes as they are.
inline void json_escape_append(std::string& out, std::string_view s) {
  constexpr char hex[] = "0123456789abcdef";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out.append("\\\""); break;
      case '\\': out.append("\\\\"); break;
      case '\n': out.append("\\n"); break;
      case '\r': out.append("\\r"); break;
      case '\t': out.append("\\t"); break;
      default:
        if (u < 0x20) {
          out.append("\\u00");
          out.push_back(hex[u >> 4]);
          out.push_back(hex[u & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
}

}  // namespace detail

// Appends one event: `id: ...` (if id is not empty), `event: ...` (if event is not
// empty), one `data: ...` line per line of data (at least one, so an empty data still
// dispatches an event with empty data), and the empty line that ends the event. CR, LF and
// NUL are removed from id and event. Allocates in out. Throws std::bad_alloc only. Touches
// nothing but out. Thread-safe.
inline void append_sse_event(std::string& out, std::string_view event, std::string_view data,
                             std::string_view id = {}) {
  detail::sse_append_single(out, "id", id);
  detail::sse_append_single(out, "event", event);
  detail::sse_append_lines(out, "data", data);
  out.push_back('\n');
}

// Appends a comment (`: text`, one comment line per line of text) and an empty line.
// Clients ignore it; sent every few seconds on an idle stream it keeps proxies and load
// balancers from closing the connection. Allocates in out; throws std::bad_alloc only.
// Touches nothing but out. Thread-safe.
inline void append_sse_comment(std::string& out, std::string_view text = "keep-alive") {
  detail::sse_append_lines(out, "", text);
  out.push_back('\n');
}

// Appends a `retry: N` line (the client's reconnection delay, in milliseconds) and an
// empty line. Allocates in out; throws std::bad_alloc only. Thread-safe.
inline void append_sse_retry(std::string& out, std::chrono::milliseconds delay) {
  out.append("retry: ");
  out.append(std::to_string(delay.count() < 0 ? 0 : delay.count()));
  out.append("\n\n");
}

// How SseEncoder writes a chunk of tokens as an event's data, by default:
//   integral tokens (token ids)          a JSON array: [17,4,912]
//   tokens convertible to string_view    their text, concatenated (line breaks in it become
//                                        separate data lines; the client gets them back)
// Pass your own callable `void(std::string& out, std::span<const Token>)` to SseEncoder
// for anything else (a detokenizer, a JSON object). Appends to out (allocating); throws
// std::bad_alloc only. Stateless. Thread-safe.
struct DefaultTokenFormat {
  template <class Token>
  void operator()(std::string& out, std::span<const Token> tokens) const {
    if constexpr (std::is_integral_v<Token>) {
      out.push_back('[');
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (i) out.push_back(',');
        out.append(std::to_string(tokens[i]));
      }
      out.push_back(']');
    } else {
      static_assert(std::is_convertible_v<const Token&, std::string_view>,
                    "DefaultTokenFormat handles integral and string-like tokens; pass a format of your own");
      for (const Token& t : tokens) out.append(std::string_view(t));
    }
  }
};

// Encodes one TokenStreamer's tokens and end as Server-Sent Events:
//
//   id: 3                        tokens delivered so far (a client resuming with
//   event: token                 Last-Event-ID: 3 has the first three)
//   data: [17,4,912]             the chunk, by Format
//
//   id: 5
//   event: end
//   data: {"status":"ok","reason":"none","http_status":200,"tokens":5,"message":""}
//
// The end event carries the final status, its HTTP status code, the token count, the
// message and, for a retryable rejection, "retry_after_ms". One token event per chunk
// the stream publishes (coalescing sets how many tokens that is).
//
// The encoder only appends to a std::string the caller owns; it never writes to a socket
// and never blocks, so it can run inside TokenStreamer's callbacks on the decode thread:
// append there under the connection's own short lock and let the server's I/O thread
// write the buffer. In pull mode, call it from the thread that reads the stream.
//
// A rejection known before the first token (ContinuousBatcher closes a rejected stream
// inside submit) should become a real HTTP status (http_status(end)), not an event
// stream; once the 200 and the first events are sent, a failure can only be the end
// event's status.
//
// Thread-safety: not thread-safe (it counts tokens): one producer, or calls ordered by
// the caller, as TokenStreamer's callbacks are. Exceptions: appending throws
// std::bad_alloc, and whatever Format throws.
template <class Token, class Format = DefaultTokenFormat>
class SseEncoder {
 public:
  // An encoder whose first token event will carry id `tokens_before + chunk size`
  // (tokens_before > 0 when resuming a stream). Never allocates. Thread-safe.
  explicit SseEncoder(Format format = Format{}, std::uint64_t tokens_before = 0) noexcept(
      std::is_nothrow_move_constructible_v<Format>)
      : format_(std::move(format)), tokens_(tokens_before) {}

  // Appends one `event: token` event holding tokens (nothing for an empty span). Allocates
  // in out and scratch space. Throws std::bad_alloc, or what Format throws. Not
  // thread-safe: see the class comment.
  void append_tokens(std::string& out, std::span<const Token> tokens) {
    if (tokens.empty()) return;
    data_.clear();
    format_(data_, tokens);
    tokens_ += tokens.size();
    append_sse_event(out, "token", data_, std::to_string(tokens_));
  }

  // Appends the `event: end` event for end. Allocates in out; throws std::bad_alloc.
  // Not thread-safe: see the class comment.
  void append_end(std::string& out, const StreamEnd& end) {
    data_.clear();
    data_.append("{\"status\":\"");
    data_.append(to_string(end.status));
    data_.append("\",\"reason\":\"");
    data_.append(to_string(end.reason));
    data_.append("\",\"http_status\":");
    data_.append(std::to_string(http_status(end)));
    data_.append(",\"tokens\":");
    data_.append(std::to_string(end.tokens));
    if (retryable(end.status, end.reason) && end.retry_after > std::chrono::nanoseconds::zero()) {
      data_.append(",\"retry_after_ms\":");
      data_.append(std::to_string(retry_after_milliseconds(end.retry_after)));
    }
    data_.append(",\"message\":\"");
    detail::json_escape_append(data_, end.message);
    data_.append("\"}");
    append_sse_event(out, "end", data_, std::to_string(tokens_));
  }

  // Appends a keep-alive comment (see append_sse_comment). Allocates in out. Not
  // thread-safe: see the class comment.
  void append_keep_alive(std::string& out, std::string_view text = "keep-alive") { append_sse_comment(out, text); }

  // Tokens encoded so far (plus tokens_before). Never blocks. Not thread-safe: read it
  // where the appends are ordered.
  [[nodiscard]] std::uint64_t tokens() const noexcept { return tokens_; }

 private:
  Format format_;
  std::uint64_t tokens_;
  std::string data_;  // the current event's data, reused
};

}  // namespace tailbatch
