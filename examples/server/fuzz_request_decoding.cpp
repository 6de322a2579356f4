// libFuzzer target over tailbatch-serve's request decoding (request_decoding.hpp), built
// and run by scripts/fuzz.sh with clang's -fsanitize=fuzzer,address,undefined.
//
// The first byte of an input picks what the rest is:
//   0  a /v1/classify body          4  a /v1/completions body (openai_protocol.hpp)
//   1  a /v1/generate body          5  a /v1/chat/completions body
//   2  an X-Request-Timeout-Ms value  6  a /v1/embeddings body
//   3  raw request bytes, read by Beast's request parser with the server's limits, then
//      decoded by route
// Every decoded value and every error message goes through the JSON the server answers
// with, so that invalid UTF-8 in a message cannot make the answer throw. The decoders must
// never throw or crash: an escaping exception aborts the run.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "openai_protocol.hpp"
#include "request_decoding.hpp"

namespace {

namespace http = boost::beast::http;
using tailbatch_serve::DecodeLimits;

void answer(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.empty()) std::abort();
}

// A classic route's error must carry a message; it goes out in the JSON the server sends.
void classic_error(const std::string& error) {
  if (error.empty()) std::abort();
  answer({{"error", {{"message", error}}}});
}

void classify(std::string_view body, const DecodeLimits& limits) {
  std::string error;
  const auto r = tailbatch_serve::decode_classify(body, limits, error);
  if (!r) return classic_error(error);
  if (r->texts.empty() || r->texts.size() > limits.max_texts) std::abort();
  if (!r->batch_form && r->texts.size() != 1) std::abort();
  for (const auto& t : r->texts) answer({{"text", t}});
}

void generate(std::string_view body, const DecodeLimits& limits) {
  std::string error;
  const auto r = tailbatch_serve::decode_generate(body, limits, error);
  if (!r) return classic_error(error);
  if (r->max_tokens < 1 || r->max_tokens > limits.max_generate_tokens) std::abort();
  answer({{"prompt", r->prompt}});
}

// An OpenAI error must name a status the server sends and carry a message; a decoded
// request must respect every limit the decoder promises.
void api_error(const tailbatch_serve::ApiError& e) {
  if (e.message.empty() || (e.status != 400 && e.status != 404)) std::abort();
  answer(tailbatch_serve::error_json(e));
}

void completion(std::string_view body, bool chat, const DecodeLimits& limits) {
  tailbatch_serve::OpenAiLimits ol;
  ol.max_tokens = 64;
  ol.max_messages = 8;
  tailbatch_serve::ApiError e;
  const auto r = tailbatch_serve::decode_completion(body, chat, limits, ol, e);
  if (!r) return api_error(e);
  if (r->max_tokens < 1 || r->max_tokens > ol.max_tokens || r->stop.size() > ol.max_stop)
    std::abort();
  for (const auto& s : r->stop) {
    if (s.empty() || s.size() > ol.max_stop_bytes) std::abort();
  }
  if (!(r->temperature >= 0.0f && r->temperature <= 2.0f) || !(r->top_p > 0.0f && r->top_p <= 1.0f))
    std::abort();
  if (chat != r->chat || (chat && !r->prompt.ends_with("assistant:"))) std::abort();
  answer(
      {{"model", r->model}, {"prompt", r->prompt}, {"user", tailbatch_serve::loggable(r->user)}});
}

void embeddings(std::string_view body, const DecodeLimits& limits) {
  tailbatch_serve::OpenAiLimits ol;
  ol.max_embedding_inputs = 8;
  tailbatch_serve::ApiError e;
  const auto r = tailbatch_serve::decode_embeddings(body, limits, ol, 16, e);
  if (!r) return api_error(e);
  if (r->inputs.empty() || r->inputs.size() > ol.max_embedding_inputs) std::abort();
  for (const auto& in : r->inputs) answer({{"input", in}, {"b64", tailbatch_serve::base64(in)}});
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
    const std::size_t n =
        parser.put(boost::asio::buffer(bytes.data() + used, bytes.size() - used), ec);
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
  if (target.starts_with("/v1/completions")) completion(req.body(), false, limits);
  if (target.starts_with("/v1/chat/completions")) completion(req.body(), true, limits);
  if (target.starts_with("/v1/embeddings")) embeddings(req.body(), limits);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  DecodeLimits limits;
  limits.max_texts = 8;  // small bounds reach the limit checks quickly
  limits.max_generate_tokens = 64;
  limits.max_json_depth = 6;
  switch (data[0] % 7) {
    case 0:
      classify(rest, limits);
      break;
    case 1:
      generate(rest, limits);
      break;
    case 2:
      timeout(rest, limits);
      break;
    case 4:
      completion(rest, false, limits);
      break;
    case 5:
      completion(rest, true, limits);
      break;
    case 6:
      embeddings(rest, limits);
      break;
    default:
      raw_request(rest, limits);
      break;
  }
  return 0;
}
