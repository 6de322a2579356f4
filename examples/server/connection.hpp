// tailbatch-serve, one HTTP connection: reading, responses, the disconnect watch and the SSE writer
// (connection.hpp). One of the parts tailbatch_serve.cpp includes, in this order: options.hpp,
// server.hpp, connection.hpp, models.hpp, classic_routes.hpp, openai_routes.hpp; not a header to
// include elsewhere.
#pragma once

namespace tailbatch_serve {

// One client connection. Every member runs on the connection's strand; the completion
// callbacks (on tailbatch's threads) only fill a job and post back to the strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // What the server knows of the request being served.
  struct RequestContext {
    SteadyTime arrival{};  // taken right after the request's headers were read
    std::string route;     // metrics label
    unsigned version = 11;
    bool keep_alive = true;
    bool head = false;       // a HEAD request: headers only
    std::string request_id;  // x-request-id: the client's, or generated
    std::string method;      // for the log line
    std::string user;        // an OpenAI request's "user", logged
    // The tenant its API key names (--api-keys); unset without such a key.
    std::optional<tb::TenantId> key_tenant;
  };

  // A classify request in flight: one Pipeline submit per text.
  struct ClassifyJob {
    std::shared_ptr<Connection> conn;
    std::vector<std::optional<tb::Outcome<ref::Prediction>>> outcomes;
    std::atomic<std::size_t> remaining{0};
    tb::CancellationSource cancel;
    bool batch_form = false;
  };

  // A generate request in flight. The stream's callbacks (decode thread) append under mu
  // and post one flush to the strand at a time.
  struct GenerateJob {
    std::shared_ptr<Connection> conn;
    bool stream = false;
    std::mutex mu;
    std::string outbox;
    std::vector<std::int32_t> tokens;
    tb::SseEncoder<std::int32_t> encoder;
    bool posted = false;
    bool any_tokens = false;
    std::optional<tb::StreamEnd> end;
    // OpenAI routes (openai is false for /v1/generate).
    bool openai = false;
    bool chat = false;
    bool include_usage = false;
    std::string id, model;
    std::int64_t created = 0;
    std::size_t prompt_tokens = 0, completion_tokens = 0, max_tokens = 0;
    ref::StopMatcher stop;  // the consumer's copy: cuts the text the client sees
    std::string text;       // non-streamed: the whole text so far
    std::string piece;      // scratch
  };

  Connection(Server& s, tcp::socket&& socket)
      : srv_(s), stream_(std::move(socket)), keepalive_timer_(stream_.get_executor()) {
    srv_.connection_opened();
  }
  ~Connection() { srv_.connection_closed(); }

  void start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }
  asio::any_io_executor executor() { return stream_.get_executor(); }
  RequestContext& context() noexcept { return ctx_; }

  // Called on the strand when the server drains: an idle connection is closed now, a
  // busy one after its response.
  void drain() {
    if (reading_header_ && buffer_.size() == 0) hard_close();
  }

  // ---- responses ---------------------------------------------------------------------
  void respond(int code, std::string body, std::string_view content_type = "application/json",
               const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    srv_.count_response(ctx_.route, code, ctx_.arrival);
    log_response(code);
    if (gone_) return request_done();
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(ctx_.version);
    res->result(static_cast<unsigned>(code));
    res->reason(std::string(tb::http_reason_phrase(code)));
    res->set(http::field::server, "tailbatch-serve");
    res->set(http::field::content_type, std::string(content_type));
    res->set("x-request-id", ctx_.request_id);
    for (const auto& [k, v] : headers) res->set(k, v);
    const bool keep = ctx_.keep_alive && !srv_.draining() && !close_after_;
    res->keep_alive(keep);
    res->body() = std::move(body);
    res->prepare_payload();
    if (ctx_.head) res->body().clear();  // Content-Length stays the GET's
    writing_ = true;
    // A client that does not read its response loses the connection after --write-timeout-ms.
    stream_.expires_after(std::chrono::milliseconds(srv_.options().write_timeout_ms));
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res, keep](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        self->stream_.expires_never();
                        if (ec) self->gone_ = true;
                        if (!keep) self->close_after_ = true;
                        self->request_done();
                      });
  }

  // Every error body: OpenAI's {"error": {"message", "type", "param", "code"}}, plus
  // "status" (the classic routes' word for it, e.g. "bad_request"), which they always had.
  void respond_error(int code, std::string_view status, std::string_view message,
                     std::vector<std::pair<std::string, std::string>> headers = {},
                     std::string_view param = {}, std::string_view err_code = {}) {
    json j =
        tailbatch_serve::error_json(ApiError{code, std::string(message), std::string(param),
                                             std::string(err_code.empty() ? status : err_code)});
    j["error"]["status"] = status;
    respond(code, dump(j), "application/json", headers);
  }

  void respond_api_error(const ApiError& e) {
    respond_error(e.status, e.status == 404 ? "not_found" : "bad_request", e.message, {}, e.param,
                  e.code);
  }

  static std::vector<std::pair<std::string, std::string>> retry_headers(const tb::Error& e) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (tb::retryable(e.status, e.reason)) {
      // An unknown hint still gets a Retry-After: one second.
      const auto hint = e.retry_after > 0ns ? e.retry_after : std::chrono::nanoseconds(1s);
      headers.emplace_back("Retry-After", std::to_string(tb::retry_after_seconds(hint)));
      headers.emplace_back("retry-after-ms", std::to_string(tb::retry_after_milliseconds(hint)));
    }
    return headers;
  }

  // The OpenAI error object of an outcome: code is the reason (queue_full, overloaded,
  // too_large, shutting_down) or else the status (deadline_exceeded, cancelled, failed).
  static json outcome_error_json(const tb::Error& e) {
    const std::string_view code =
        e.reason != tb::RejectReason::none ? tb::to_string(e.reason) : tb::to_string(e.status);
    json j =
        tailbatch_serve::error_json(ApiError{tb::http_status(e), e.message, "", std::string(code)});
    j["error"]["status"] = tb::to_string(e.status);
    j["error"]["reason"] = tb::to_string(e.reason);
    return j;
  }

  void respond_outcome_error(const tb::Error& e) {
    respond(tb::http_status(e), dump(outcome_error_json(e)), "application/json", retry_headers(e));
  }

  // One stderr line per response with --access-log; error responses always.
  void log_response(int code) {
    if (!srv_.options().access_log && code < 400) return;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ctx_.arrival)
            .count();
    std::fprintf(stderr, "tailbatch-serve: request %s %s %s %d %.1f ms%s%s\n",
                 ctx_.request_id.c_str(), ctx_.method.c_str(), ctx_.route.c_str(), code, ms,
                 ctx_.user.empty() ? "" : " user=", ctx_.user.c_str());
  }

  // ---- async work --------------------------------------------------------------------
  // Called on the strand once a request has been handed to tailbatch: watch the socket so
  // that a client who leaves cancels its work.
  void work_started() {
    busy_ = true;
    srv_.request_started();
    watch();
  }

  void set_classify_job(std::shared_ptr<ClassifyJob> j) { classify_job_ = std::move(j); }
  void set_generate(std::shared_ptr<GenerateJob> j, std::shared_ptr<Batcher::Stream> s) {
    generate_job_ = std::move(j);
    generate_stream_ = std::move(s);
  }

  // On the strand: a request that used the classify job's disconnect path (embeddings) is
  // done; answer runs the response.
  template <class Answer>
  void finish_custom(Answer&& answer) {
    auto job = std::move(classify_job_);
    busy_ = false;
    srv_.request_finished();
    if (job) job->conn.reset();
    answer(*this);
  }

  // On the strand: every text of the classify job has its outcome.
  void finish_classify() {
    auto job = std::move(classify_job_);
    busy_ = false;
    srv_.request_finished();
    if (!job) return;
    job->conn.reset();
    const tb::Error* first_error = nullptr;
    json results = json::array();
    for (std::size_t i = 0; i < job->outcomes.size(); ++i) {
      auto& o = *job->outcomes[i];
      if (!o.ok()) {
        if (!first_error) first_error = &o.error();
        continue;
      }
      const ref::Prediction& p = o.value();
      const bool truncated = p.truncated;
      results.push_back({{"label", ref::to_string(p.label)},
                         {"score", static_cast<double>(p.confidence())},
                         {"truncated", truncated}});
    }
    if (first_error) return respond_outcome_error(*first_error);
    if (job->batch_form) return respond(200, dump(json{{"results", std::move(results)}}));
    respond(200, dump(results.at(0)));
  }

  // On the strand: the generate job has new bytes, or its end.
  void flush_generate(const std::shared_ptr<GenerateJob>& job) {
    std::string data;
    std::optional<tb::StreamEnd> end;
    bool any = false;
    std::vector<std::int32_t> tokens;
    std::string text;
    {
      std::lock_guard lock(job->mu);
      data.swap(job->outbox);
      job->posted = false;
      end = job->end;
      any = job->any_tokens;
      if (end && !job->stream) {
        tokens.swap(job->tokens);
        text.swap(job->text);
      }
    }
    if (job != generate_job_) return;  // a late flush of a finished job
    if (end) {
      generate_job_.reset();
      generate_stream_.reset();
      job->conn.reset();
      busy_ = false;
      srv_.request_finished();
    }
    if (!job->stream) {
      if (!end) return;
      if (job->openai) {
        if (!end->ok()) return respond_outcome_error(error_of(*end));
        return respond(200, dump(completion_json(*job, text, finish_reason(*job))));
      }
      if (!end->ok() && tokens.empty()) return respond_outcome_error(error_of(*end));
      json j = {{"tokens", tokens},
                {"status", tb::to_string(end->status)},
                {"reason", tb::to_string(end->reason)},
                {"message", end->message}};
      return respond(tb::http_status(*end), dump(j));
    }
    if (!sse_started_) {
      if (end && !any && !end->ok()) return respond_outcome_error(error_of(*end));
      sse_started_ = true;
      // HTTP/1.0 has no chunked encoding: its stream is the raw bytes, ended by closing.
      sse_chunked_ = ctx_.version >= 11;
      std::string head = std::string(sse_chunked_ ? "HTTP/1.1" : "HTTP/1.0") +
                         " 200 OK\r\nServer: tailbatch-serve\r\nContent-Type: text/event-stream\r\n"
                         "Cache-Control: no-cache\r\nx-request-id: " +
                         ctx_.request_id + "\r\n";
      if (sse_chunked_) head += "Transfer-Encoding: chunked\r\n";
      const bool keep = ctx_.keep_alive && sse_chunked_ && !srv_.draining();
      if (!keep) close_after_ = true;
      head += keep ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      wq_ += head;
      start_keepalive();
    }
    queue_sse(data);
    if (end) {
      if (sse_chunked_) wq_ += "0\r\n\r\n";
      sse_done_ = true;
      keepalive_timer_.cancel();
      srv_.count_response(ctx_.route, 200, ctx_.arrival);
      log_response(end->ok() ? 200 : tb::http_status(*end));
    }
    write_queued();
  }

  // ---- OpenAI response bodies (built on the decode thread for stream chunks) -----------
  static std::string finish_reason(const GenerateJob& job) {
    if (job.stop.stopped()) return "stop";
    return job.completion_tokens >= job.max_tokens ? "length" : "stop";
  }

  static json usage_json(const GenerateJob& job) {
    return {{"prompt_tokens", job.prompt_tokens},
            {"completion_tokens", job.completion_tokens},
            {"total_tokens", job.prompt_tokens + job.completion_tokens}};
  }

  static json completion_json(const GenerateJob& job, const std::string& text,
                              const std::string& finish) {
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    if (job.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    json body =
        envelope_json(job, job.chat ? "chat.completion" : "text_completion", std::move(choice));
    body["usage"] = usage_json(job);
    return body;
  }

  // One streamed chunk: text (chat: a delta, with the role in the first), or the finish.
  static json chunk_json(const GenerateJob& job, const std::string& text, bool with_role,
                         const std::optional<std::string>& finish) {
    json choice = {{"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", finish ? json(*finish) : json(nullptr)}};
    if (job.chat) {
      json delta = json::object();
      if (with_role) delta["role"] = "assistant";
      if (!text.empty() || with_role) delta["content"] = text;
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = text;
    }
    return envelope_json(job, job.chat ? "chat.completion.chunk" : "text_completion",
                         std::move(choice));
  }

  // What a completion body and a streamed chunk share around their one choice.
  static json envelope_json(const GenerateJob& job, const char* object, json choice) {
    return {{"id", job.id},
            {"object", object},
            {"created", job.created},
            {"model", job.model},
            {"choices", json::array({std::move(choice)})}};
  }

  static void append_event(std::string& out, const json& j) {
    out += "data: ";
    out += dump(j);
    out += "\n\n";
  }

  static tb::Error error_of(const tb::StreamEnd& e) {
    return tb::Error{e.status, e.reason, e.message, e.retry_after};
  }

 private:
  // Frames SSE bytes for the wire: a chunk (HTTP/1.1) or raw (HTTP/1.0).
  void queue_sse(std::string_view data) {
    if (data.empty()) return;
    if (sse_chunked_) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      wq_ += size;
      wq_ += data;
      wq_ += "\r\n";
    } else {
      wq_ += data;
    }
    last_sse_ = std::chrono::steady_clock::now();
  }

  // A ": keep-alive" comment whenever the stream has been idle --sse-keepalive-ms, so that
  // proxies and clients with read timeouts keep a slow generation's connection.
  void start_keepalive() {
    const auto ms = srv_.options().sse_keepalive_ms;
    if (ms == 0) return;
    last_sse_ = std::chrono::steady_clock::now();
    keepalive_timer_.expires_at(last_sse_ + std::chrono::milliseconds(ms));
    keepalive_timer_.async_wait(
        [self = shared_from_this()](beast::error_code ec) { self->on_keepalive(ec); });
  }

  void on_keepalive(beast::error_code ec) {
    if (ec || !sse_started_ || sse_done_ || gone_) return;
    const auto interval = std::chrono::milliseconds(srv_.options().sse_keepalive_ms);
    if (std::chrono::steady_clock::now() - last_sse_ >= interval) {
      queue_sse(": keep-alive\n\n");
      write_queued();
    }
    keepalive_timer_.expires_at(last_sse_ + interval);
    keepalive_timer_.async_wait(
        [self = shared_from_this()](beast::error_code e) { self->on_keepalive(e); });
  }

  // A client's x-request-id if it is 1 to 128 visible ASCII characters, else a new one.
  std::string request_id_of(const http::request_parser<http::string_body>::value_type& req) {
    const auto h = req.find("x-request-id");
    if (h != req.end()) {
      const std::string_view v(h->value().data(), h->value().size());
      const bool fine =
          !v.empty() && v.size() <= 128 &&
          std::all_of(v.begin(), v.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
      if (fine) return std::string(v);
    }
    return srv_.new_request_id();
  }

  void read_header() {
    reading_header_ = true;
    if (srv_.draining() && buffer_.size() == 0) return hard_close();
    parser_.emplace();
    parser_->body_limit(srv_.options().max_body_bytes);
    parser_->header_limit(tailbatch_serve::header_limit_bytes);
    stream_.expires_after(std::chrono::milliseconds(srv_.options().idle_timeout_ms));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    reading_header_ = false;
    // The request's arrival: its headers are in. Everything after this (the body, the
    // parse, the queue, the model) counts toward its latency.
    ctx_ = RequestContext{};
    ctx_.arrival = std::chrono::steady_clock::now();
    ctx_.route = "other";
    ctx_.request_id = ec ? srv_.new_request_id() : request_id_of(parser_->get());
    if (ec) return on_read_error(ec);
    ctx_.version = parser_->get().version();
    ctx_.keep_alive = parser_->get().keep_alive();
    ctx_.method = std::string(http::to_string(parser_->get().method()));
    ctx_.head = parser_->get().method() == http::verb::head;
    if (const auto te = parser_->get().find(http::field::transfer_encoding);
        te != parser_->get().end()) {
      // Only "chunked" alone: with another coding before it ("gzip, chunked") the body
      // would be read as plain text while it is not.
      if (!iequal(std::string_view(te->value().data(), te->value().size()), "chunked")) {
        close_after_ = true;
        return respond_error(501, "not_implemented", "the only Transfer-Encoding served is chunked",
                             {}, "", "unsupported_transfer_encoding");
      }
    }
    if (ctx_.version >= 11 && beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      // curl asks before sending a body over 1 KiB, and waits a second for the answer.
      static const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(go_on),
                        [self = shared_from_this()](beast::error_code e, std::size_t) {
                          if (e) return self->hard_close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code e, std::size_t) { self->on_body(e); });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::bad_descriptor) {
      return hard_close();
    }
    close_after_ = true;
    if (ec == http::error::body_limit) {
      return respond_error(
          413, "too_large",
          "the request body exceeds " + std::to_string(srv_.options().max_body_bytes) + " bytes");
    }
    if (ec == http::error::header_limit)
      return respond_error(431, "bad_request", "the request headers are too large");
    respond_error(400, "bad_request", "malformed HTTP request: " + ec.message());
  }

  void on_body(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    auto self = shared_from_this();
    srv_.handle(self, parser_->release());
  }

  // A read while the request is in tailbatch's hands: an error means the client left.
  void watch() {
    if (watching_ || gone_) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->on_watch(ec, n);
                            });
  }

  void on_watch(beast::error_code ec, std::size_t n) {
    watching_ = false;
    if (!ec) {
      buffer_.commit(n);  // a pipelined request: kept for the next read
      // Keep watching: a client may send a byte and then leave. Past 64 KiB of pipelined
      // bytes the watch stops (the client's own backpressure then holds it).
      if (busy_ && !want_next_ && buffer_.size() < 64 * 1024) watch();
    } else if (ec != asio::error::operation_aborted || !want_next_) {
      if (!gone_ && busy_) {
        gone_ = true;
        srv_.count_disconnect();
        if (classify_job_) classify_job_->cancel.request_stop();
        if (generate_stream_) generate_stream_->cancel();
      }
      gone_ = true;
    }
    if (want_next_) {
      want_next_ = false;
      next_request();
    }
  }

  void write_queued() {
    if (writing_ || wq_.empty()) {
      if (!writing_ && sse_done_) {
        sse_done_ = false;
        sse_started_ = false;
        request_done();
      }
      return;
    }
    if (gone_) {
      wq_.clear();
      if (sse_done_) {
        sse_done_ = false;
        sse_started_ = false;
        request_done();
      }
      return;
    }
    writing_ = true;
    auto buf = std::make_shared<std::string>(std::move(wq_));
    wq_.clear();
    stream_.expires_after(std::chrono::milliseconds(srv_.options().write_timeout_ms));
    asio::async_write(stream_, asio::buffer(*buf),
                      [self = shared_from_this(), buf](beast::error_code ec, std::size_t) {
                        self->writing_ = false;
                        self->stream_.expires_never();
                        if (ec && !self->gone_) {
                          self->gone_ = true;
                          if (self->busy_) {
                            self->srv_.count_disconnect();
                            if (self->generate_stream_) self->generate_stream_->cancel();
                          }
                        }
                        self->write_queued();
                      });
  }

  // The response is written (or the client is gone): read the next request, or close.
  void request_done() {
    if (busy_) return;  // a response written before the work ended (cannot happen) waits
    if (watching_) {
      // The disconnect watch must end before the next read starts.
      want_next_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    next_request();
  }

  void next_request() {
    if (gone_) return hard_close();
    if (close_after_ || srv_.draining()) return close();
    read_header();
  }

  // Closes after a response: stops sending, then reads and drops what the client still
  // sends (an unread body) for up to a second, so that closing does not reset the
  // connection before the client has read the response.
  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(1s);
    linger();
  }

  void linger() {
    stream_.async_read_some(asio::buffer(discard_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              if (ec) return self->hard_close();
                              self->linger();
                            });
  }

  void hard_close() {
    keepalive_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  Server& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  RequestContext ctx_;
  std::shared_ptr<ClassifyJob> classify_job_;
  std::shared_ptr<GenerateJob> generate_job_;
  std::shared_ptr<Batcher::Stream> generate_stream_;
  std::string wq_;  // SSE bytes waiting for the current write to finish
  std::array<char, 4096> discard_{};
  bool reading_header_ = false;
  bool busy_ = false;       // tailbatch holds this request
  bool watching_ = false;   // a disconnect-watch read is outstanding
  bool want_next_ = false;  // the watch was cancelled to read the next request
  bool gone_ = false;       // the client left (or a write failed)
  bool writing_ = false;
  bool close_after_ = false;
  bool sse_started_ = false;
  bool sse_done_ = false;
  bool sse_chunked_ = true;
  asio::steady_timer keepalive_timer_;
  SteadyTime last_sse_{};
};

}  // namespace tailbatch_serve
