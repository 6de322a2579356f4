// libFuzzer target over tailbatch-serve's request decoding (request_decoding.hpp), built
// and run by scripts/fuzz.sh with clang's -fsanitize=fuzzer,address,undefined.
//
// The first byte of an input picks what the rest is:
//   0  a /v1/classify body          2  an X-Request-Timeout-Ms value
//   1  a /v1/generate body          3  raw request bytes, read by Beast's request parser
//                                      with the server's limits, then decoded by route
// Every decoded value and every error message goes through the JSON the server answers
// with, so that invalid UTF-8 in a message cannot make the answer throw. The decoders must
// never throw or crash: an escaping exception aborts the run.
#include "request_decoding.hpp"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

namespace http = boost::beast::http;
using tailbatch_serve::DecodeLimits;

void answer(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.empty()) std::abort();
}

void classify(std::string_view body, const DecodeLimits& limits) {
  std::string error;
  const auto r = tailbatch_serve::decode_classify(body, limits, error);
  if (!r) {
    if (error.empty()) std::abort();
    return answer({{"error", {{"message", error}}}});
  }
  if (r->texts.empty() || r->texts.size() > limits.max_texts) std::abort();
  if (!r->batch_form && r->texts.size() != 1) std::abort();
  for (const auto& t : r->texts) answer({{"text", t}});
}

void generate(std::string_view body, const DecodeLimits& limits) {
  std::string error;
  const auto r = tailbatch_serve::decode_generate(body, limits, error);
  if (!r) {
    if (error.empty()) std::abort();
    return answer({{"error", {{"message", error}}}});
  }
  if (r->max_tokens < 1 || r->max_tokens > limits.max_generate_tokens) std::abort();
  answer({{"prompt", r->prompt}});
}

void timeout(std::string_view value, const DecodeLimits& limits) {
  std::string error;
  const auto t = tailbatch_serve::decode_timeout(value, limits, error);
  if (t && (t->count() < 0 || t->count() > limits.max_timeout_ms)) std::abort();
  if (!t && error.empty()) std::abort();
}

void raw_request(std::string_view bytes, const DecodeLimits& limits) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(tailbatch_serve::header_limit_bytes);
  parser.body_limit(64 * 1024);
  parser.eager(true);
  boost::beast::error_code ec;
  std::size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    const std::size_t n = parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (ec == http::error::need_more) break;
    if (ec) return;
    if (n == 0) break;
    used += n;
  }
  if (!parser.is_header_done()) return;
  const auto& req = parser.get();
  const auto h = req.find(boost::beast::string_view(tailbatch_serve::timeout_header.data(),
                                                    tailbatch_serve::timeout_header.size()));
  if (h != req.end()) timeout(std::string_view(h->value().data(), h->value().size()), limits);
  if (!parser.is_done()) return;
  const std::string_view target(req.target().data(), req.target().size());
  if (target.starts_with("/v1/classify")) classify(req.body(), limits);
  if (target.starts_with("/v1/generate")) generate(req.body(), limits);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  DecodeLimits limits;
  limits.max_texts = 8;  // small bounds reach the limit checks quickly
  limits.max_generate_tokens = 64;
  limits.max_json_depth = 6;
  switch (data[0] % 4) {
    case 0: classify(rest, limits); break;
    case 1: generate(rest, limits); break;
    case 2: timeout(rest, limits); break;
    default: raw_request(rest, limits); break;
  }
  return 0;
}
