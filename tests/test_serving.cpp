// Serving adapters: every status mapping, Retry-After rounding at its edges, and SSE
// framing checked by a parser written from the event-stream specification (so that what
// the encoder writes is read back as the events it meant), also through a TokenStreamer
// in callback and in pull mode.
#include <tailbatch/serving.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::Error;
using tailbatch::Outcome;
using tailbatch::RejectReason;
using tailbatch::Status;
using tailbatch::StreamEnd;

namespace {

struct Event {
  std::string id;     // the last event ID in force when it was dispatched
  std::string type;   // "message" when no event field was given
  std::string data;
};

struct Parsed {
  std::vector<Event> events;
  std::vector<std::string> comments;
};

// Each event as "id type data", to compare a whole stream at once.
std::vector<std::string> lines_of(const Parsed& p) {
  std::vector<std::string> out;
  for (const Event& e : p.events) out.push_back(e.id + " " + e.type + " " + e.data);
  return out;
}

// The HTML Living Standard's event-stream interpretation (9.2.6), for one complete
// stream: lines end at CRLF, LF or CR; a line starting with ':' is a comment; `field:
// value` drops one leading space from value; data lines join with LF; an empty line
// dispatches (only if the data buffer is not empty), dropping one trailing LF.
Parsed parse_sse(std::string_view s) {
  Parsed p;
  std::string data, type, last_id;
  bool have_data = false;
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t end = i;
    while (end < s.size() && s[end] != '\n' && s[end] != '\r') ++end;
    REQUIRE(end < s.size());  // every line the encoder writes is terminated
    std::string_view line = s.substr(i, end - i);
    i = end + 1;
    if (s[end] == '\r' && i < s.size() && s[i] == '\n') ++i;
    if (line.empty()) {
      if (have_data) {
        if (!data.empty() && data.back() == '\n') data.pop_back();
        p.events.push_back({last_id, type.empty() ? "message" : type, data});
      }
      data.clear();
      type.clear();
      have_data = false;
      continue;
    }
    if (line.front() == ':') {
      std::string_view c = line.substr(1);
      if (!c.empty() && c.front() == ' ') c.remove_prefix(1);
      p.comments.emplace_back(c);
      continue;
    }
    const std::size_t colon = line.find(':');
    std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    if (field == "data") {
      data.append(value);
      data.push_back('\n');
      have_data = true;
    } else if (field == "event") {
      type = value;
    } else if (field == "id") {
      if (value.find('\0') == std::string_view::npos) last_id = value;
    }
  }
  return p;
}

}  // namespace

TEST_CASE("http_status maps every status and reject reason", "[serving]") {
  using tailbatch::http_status;
  CHECK(http_status(Status::ok) == 200);
  CHECK(http_status(Status::rejected, RejectReason::too_large) == 413);
  CHECK(http_status(Status::rejected, RejectReason::queue_full) == 503);
  CHECK(http_status(Status::rejected, RejectReason::overloaded) == 503);
  CHECK(http_status(Status::rejected, RejectReason::shutting_down) == 503);
  CHECK(http_status(Status::rejected, RejectReason::none) == 503);
  CHECK(http_status(Status::rejected, RejectReason::shed) == 503);
  CHECK(http_status(Status::rejected, RejectReason::quota_exceeded) == 429);
  static_assert(http_status(Status::rejected, RejectReason::quota_exceeded) == 429);
  CHECK(http_status(Status::deadline_exceeded) == 504);
  CHECK(http_status(Status::cancelled) == 499);
  CHECK(http_status(Status::failed) == 500);
  // The reason matters only for rejections.
  CHECK(http_status(Status::failed, RejectReason::too_large) == 500);
  CHECK(http_status(Status::ok, RejectReason::queue_full) == 200);
  static_assert(http_status(Status::rejected, RejectReason::too_large) == 413);
}

TEST_CASE("http_status of an Outcome, an Error and a StreamEnd agree with the pair", "[serving]") {
  using tailbatch::http_status;
  const Outcome<int> ok(7);
  CHECK(http_status(ok) == 200);
  for (auto r : {RejectReason::queue_full, RejectReason::overloaded, RejectReason::shutting_down,
                 RejectReason::too_large}) {
    const Error e{Status::rejected, r, "no", 68ms};
    const Outcome<int> o(e);
    CHECK(http_status(o) == http_status(Status::rejected, r));
    CHECK(http_status(e) == http_status(Status::rejected, r));
    StreamEnd end;
    end.status = Status::rejected;
    end.reason = r;
    CHECK(http_status(end) == http_status(Status::rejected, r));
  }
  for (auto s : {Status::deadline_exceeded, Status::cancelled, Status::failed}) {
    const Outcome<std::string> o(Error{s, RejectReason::none, "x", {}});
    CHECK(http_status(o) == http_status(s));
  }
}

TEST_CASE("retryable covers the capacity rejections only", "[serving]") {
  using tailbatch::retryable;
  CHECK(retryable(Status::rejected, RejectReason::queue_full));
  CHECK(retryable(Status::rejected, RejectReason::overloaded));
  CHECK(retryable(Status::rejected, RejectReason::shutting_down));
  CHECK(retryable(Status::rejected, RejectReason::shed));
  CHECK(retryable(Status::rejected, RejectReason::quota_exceeded));
  CHECK_FALSE(retryable(Status::rejected, RejectReason::too_large));
  CHECK_FALSE(retryable(Status::failed, RejectReason::none));
  CHECK_FALSE(retryable(Status::deadline_exceeded, RejectReason::none));
  CHECK_FALSE(retryable(Status::ok, RejectReason::none));
}

TEST_CASE("reason phrases for every code the mapping produces", "[serving]") {
  using tailbatch::http_reason_phrase;
  CHECK(http_reason_phrase(200) == "OK");
  CHECK(http_reason_phrase(413) == "Content Too Large");
  CHECK(http_reason_phrase(499) == "Client Closed Request");
  CHECK(http_reason_phrase(500) == "Internal Server Error");
  CHECK(http_reason_phrase(503) == "Service Unavailable");
  CHECK(http_reason_phrase(504) == "Gateway Timeout");
  CHECK(http_reason_phrase(999) == "Unknown");
}

TEST_CASE("retry_after_seconds rounds up to whole seconds", "[serving]") {
  using tailbatch::retry_after_seconds;
  CHECK(retry_after_seconds(0ns) == 0);    // unknown
  CHECK(retry_after_seconds(-5ms) == 0);   // nonsense is unknown too
  CHECK(retry_after_seconds(1ns) == 1);
  CHECK(retry_after_seconds(68ms) == 1);   // the case that must not become "0"
  CHECK(retry_after_seconds(999ms) == 1);
  CHECK(retry_after_seconds(999'999'999ns) == 1);
  CHECK(retry_after_seconds(1s) == 1);
  CHECK(retry_after_seconds(1s + 1ns) == 2);
  CHECK(retry_after_seconds(2500ms) == 3);
  CHECK(retry_after_seconds(std::chrono::hours(1)) == 3600);
  CHECK(retry_after_seconds(std::chrono::nanoseconds::max()) == 9'223'372'037ULL);
  static_assert(tailbatch::retry_after_seconds(std::chrono::milliseconds(68)) == 1);
}

TEST_CASE("retry_after_milliseconds rounds up to whole milliseconds", "[serving]") {
  using tailbatch::retry_after_milliseconds;
  CHECK(retry_after_milliseconds(0ns) == 0);
  CHECK(retry_after_milliseconds(-1ns) == 0);
  CHECK(retry_after_milliseconds(1ns) == 1);
  CHECK(retry_after_milliseconds(999'999ns) == 1);
  CHECK(retry_after_milliseconds(1ms) == 1);
  CHECK(retry_after_milliseconds(1ms + 1ns) == 2);
  CHECK(retry_after_milliseconds(68ms) == 68);
  CHECK(retry_after_milliseconds(999ms) == 999);
  CHECK(retry_after_milliseconds(1s) == 1000);
  CHECK(retry_after_milliseconds(std::chrono::nanoseconds::max()) == 9'223'372'036'855ULL);
}

TEST_CASE("an event with single-line data", "[serving][sse]") {
  std::string out;
  tailbatch::append_sse_event(out, "token", "hello", "1");
  CHECK(out == "id: 1\nevent: token\ndata: hello\n\n");
  const Parsed p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].id == "1");
  CHECK(p.events[0].type == "token");
  CHECK(p.events[0].data == "hello");
}

TEST_CASE("multi-line data becomes one data line per line, with every line-break form", "[serving][sse]") {
  std::string out;
  tailbatch::append_sse_event(out, "token", "a\nb\r\nc\rd");
  CHECK(out == "event: token\ndata: a\ndata: b\ndata: c\ndata: d\n\n");
  const Parsed p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data == "a\nb\nc\nd");  // the client joins with LF
}

TEST_CASE("data edge cases survive the round trip", "[serving][sse]") {
  // What comes back is the data with every CRLF and CR turned into LF.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", ""},                  // empty data still dispatches an event
      {"\n", "\n"},              // a lone line break
      {"x\n", "x\n"},            // a trailing line break is kept
      {"\n\n", "\n\n"},
      {"\r\n", "\n"},
      {"\r\r", "\n\n"},
      {"\n\r", "\n\n"},          // LF then CR: two breaks, not one CRLF
      {" leading space", " leading space"},
      {"  two", "  two"},
      {":colon first", ":colon first"},
      {"data: inside", "data: inside"},
      {"id: 9\n\nevent: end", "id: 9\n\nevent: end"},  // cannot inject fields or end the event
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},
      {"caf\xc3\xa9 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xf0\x9f\x98\x80"},
  };
  for (const auto& [data, expected] : cases) {
    INFO("data: " << data);
    std::string out;
    tailbatch::append_sse_event(out, "token", data, "4");
    const Parsed p = parse_sse(out);
    REQUIRE(p.events.size() == 1);
    CHECK(p.events[0].data == expected);
    CHECK(p.events[0].type == "token");
    CHECK(p.events[0].id == "4");
    // Exactly one empty line: at the end.
    CHECK(out.find("\n\n") == out.size() - 2);
  }
}

TEST_CASE("line breaks and NUL are removed from id and event", "[serving][sse]") {
  std::string out;
  tailbatch::append_sse_event(out, "to\r\nken", "x", std::string("1\n2\0", 4));
  CHECK(out == "id: 12\nevent: token\ndata: x\n\n");
  // Empty id and event: the fields are left out (the type defaults to "message").
  out.clear();
  tailbatch::append_sse_event(out, "", "x", "");
  CHECK(out == "data: x\n\n");
  const Parsed p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].type == "message");
}

TEST_CASE("comments keep a stream alive and dispatch nothing", "[serving][sse]") {
  std::string out;
  tailbatch::append_sse_comment(out);
  CHECK(out == ": keep-alive\n\n");
  tailbatch::append_sse_comment(out, "two\nlines");
  tailbatch::append_sse_comment(out, "");
  const Parsed p = parse_sse(out);
  CHECK(p.events.empty());
  CHECK(p.comments == std::vector<std::string>{"keep-alive", "two", "lines", ""});
}

TEST_CASE("retry field", "[serving][sse]") {
  std::string out;
  tailbatch::append_sse_retry(out, 1500ms);
  CHECK(out == "retry: 1500\n\n");
  out.clear();
  tailbatch::append_sse_retry(out, -3ms);
  CHECK(out == "retry: 0\n\n");
}

TEST_CASE("SseEncoder: token events count tokens in their ids, the end carries the status", "[serving][sse]") {
  tailbatch::SseEncoder<std::int32_t> enc;
  std::string out;
  const std::vector<std::int32_t> a = {17, 4}, b = {912};
  enc.append_tokens(out, a);
  enc.append_tokens(out, std::span<const std::int32_t>{});  // nothing
  enc.append_keep_alive(out);
  enc.append_tokens(out, b);
  StreamEnd end;
  end.tokens = 3;
  enc.append_end(out, end);
  CHECK(enc.tokens() == 3);
  const Parsed p = parse_sse(out);
  CHECK(lines_of(p) ==
        std::vector<std::string>{
            "2 token [17,4]", "3 token [912]",
            R"(3 end {"status":"ok","reason":"none","http_status":200,"tokens":3,"message":""})"});
  CHECK(p.comments == std::vector<std::string>{"keep-alive"});
}

TEST_CASE("SseEncoder: a failed end escapes its message; a retryable one has retry_after_ms", "[serving][sse]") {
  tailbatch::SseEncoder<std::int32_t> enc(tailbatch::DefaultTokenFormat{}, 10);
  std::string out;
  StreamEnd end;
  end.status = Status::failed;
  end.message = "model \"said\"\nno\\\x01";
  end.tokens = 10;
  enc.append_end(out, end);
  Parsed p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].id == "10");
  CHECK(p.events[0].data ==
        R"({"status":"failed","reason":"none","http_status":500,"tokens":10,"message":"model \"said\"\nno\\\u0001"})");

  out.clear();
  end = StreamEnd{};
  end.status = Status::rejected;
  end.reason = RejectReason::queue_full;
  end.retry_after = 68ms + 1ns;
  enc.append_end(out, end);
  p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data ==
        R"({"status":"rejected","reason":"queue_full","http_status":503,"tokens":0,"retry_after_ms":69,"message":""})");
}

TEST_CASE("SseEncoder: string tokens with line breaks come back whole", "[serving][sse]") {
  tailbatch::SseEncoder<std::string> enc;
  std::string out;
  const std::vector<std::string> chunk = {"Hello", ",\nworld", "\r\n", "!"};
  enc.append_tokens(out, chunk);
  const Parsed p = parse_sse(out);
  REQUIRE(p.events.size() == 1);
  CHECK(p.events[0].data == "Hello,\nworld\n!");
  CHECK(p.events[0].id == "4");
}

TEST_CASE("SseEncoder: a format of one's own", "[serving][sse]") {
  auto words = [](std::string& out, std::span<const int> t) {
    for (int v : t) out.append(v == 0 ? "zero " : "other ");
  };
  tailbatch::SseEncoder<int, decltype(words)> enc(words);
  std::string out;
  const std::vector<int> t = {0, 5};
  enc.append_tokens(out, t);
  CHECK(out == "id: 2\nevent: token\ndata: zero other \n\n");
}

TEST_CASE("SseEncoder in TokenStreamer's callback mode appends on the producer's thread", "[serving][sse]") {
  // What a server does: the callbacks only append to a buffer the connection owns.
  std::string wire;
  auto enc = std::make_shared<tailbatch::SseEncoder<int>>();
  tailbatch::StreamCallbacks<int> cb;
  cb.on_tokens = [&, enc](std::span<const int> t) { enc->append_tokens(wire, t); };
  cb.on_end = [&, enc](const StreamEnd& e) { enc->append_end(wire, e); };
  tailbatch::TokenStreamerConfig opts;
  opts.coalesce_tokens = 2;
  opts.flush_first_token = true;
  tailbatch::TokenStreamer<int, tailbatch::ManualClock> s(opts, cb);
  for (int t : {1, 2, 3, 4}) REQUIRE(s.push(t));
  REQUIRE(s.close(Status::failed, "out of KV cache"));
  const Parsed p = parse_sse(wire);
  // The first token alone (flush_first_token), then {2,3}, then {4} flushed by close.
  CHECK(lines_of(p) ==
        std::vector<std::string>{
            "1 token [1]", "3 token [2,3]", "4 token [4]",
            R"(4 end {"status":"failed","reason":"none","http_status":500,"tokens":4,"message":"out of KV cache"})"});
}

TEST_CASE("SseEncoder in pull mode", "[serving][sse]") {
  tailbatch::TokenStreamer<int, tailbatch::ManualClock> s;
  for (int t : {7, 8, 9}) REQUIRE(s.push(t));
  REQUIRE(s.close(Status::deadline_exceeded, "too slow"));
  tailbatch::SseEncoder<int> enc;
  std::string wire;
  std::vector<int> chunk;
  while (s.next_chunk(chunk)) {
    enc.append_tokens(wire, chunk);
    chunk.clear();
  }
  enc.append_end(wire, s.wait_end());
  const Parsed p = parse_sse(wire);
  REQUIRE(p.events.size() == 2);
  CHECK(p.events[0].data == "[7,8,9]");
  CHECK(p.events[1].type == "end");
  CHECK(p.events[1].id == "3");
  CHECK(p.events[1].data.find(R"("status":"deadline_exceeded")") != std::string::npos);
  CHECK(p.events[1].data.find(R"("http_status":504)") != std::string::npos);
}
