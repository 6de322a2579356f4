// tailbatch-serve: an asynchronous HTTP server around tailbatch, on Boost.Beast/Asio.
//
//   POST /v1/classify   {"text": "..."} or {"texts": [...]}   -> the reference classifier,
//                       through a ConcurrencyLimiter and a batching Pipeline
//   POST /v1/generate   {"prompt": "...", "max_tokens": N, "stream": true|false}
//                       -> the reference generator, through a ContinuousBatcher; SSE when
//                       streaming; a client that disconnects cancels its sequence
//   GET  /metrics       Prometheus text      GET /v1/stats   JSON summary
//   GET  /healthz       alive                GET /readyz     warmed up and not draining
//   GET  /dashboard     a live dashboard of /v1/stats (dashboard.html, embedded at build
//                       time); GET /static/chart.js serves Debian's libjs-chart.js to it
//
// Every --autoscale-interval-s (5 s; 0: off) a timer on the I/O threads evaluates an
// Autoscaler on this replica's readings over the interval (arrival rate, mean queue depth
// and in-flight, mean latency from the Pipeline; the recent p95 from the classify route's
// edge histogram) and exports its decision, tailbatch_autoscaler_desired_replicas, and the
// inputs it used on /metrics, labelled {pipeline="classify"} like the Pipeline's series.
//
// Threads, and who owns them:
//   * --io-threads I/O threads (this program's; the main thread is one of them) run every
//     socket operation, parse requests, submit to tailbatch and write responses. Each
//     connection's work runs on its own strand. No thread ever waits for a result: the
//     Pipeline and the ContinuousBatcher complete requests through callbacks, which only
//     post the result back to the connection's strand.
//   * The Pipeline owns its worker threads (--lanes of them, one per host lane): they form
//     batches and run the classifier.
//   * The ContinuousBatcher owns one decode thread, which runs the generator.
//   * A warm-up thread lives until the server is ready; on SIGTERM a drain thread shuts
//     the Pipeline and the batcher down and stops the I/O threads.
//   * The Autoscaler has no thread: its timer's handler runs on an I/O thread, on the
//     strand of the acceptor and the signal handler, so the drain cancels it safely.
//
// docs/serving.md describes the status mapping, the headers, draining and readiness.
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/generator.hpp>
#include <tailbatch/reference/sampler.hpp>
#include <tailbatch/reference/text.hpp>
#include <tailbatch/reference/tokenizer.hpp>
#include <tailbatch/serving.hpp>
#include <tailbatch/warmup.hpp>

#include "openai_protocol.hpp"
#include "request_decoding.hpp"

#ifndef TAILBATCH_SERVE_CHART_JS
#define TAILBATCH_SERVE_CHART_JS "/usr/share/javascript/chart.js/chart.min.js"
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

// examples/server/dashboard.html, embedded by examples/server_dashboard.cmake.
constexpr const char* dashboard_html =
#include "dashboard_html.inc"
    ;

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace tb = tailbatch;
namespace ref = tailbatch::reference;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;
using namespace std::chrono_literals;

struct Options {
  std::string host = "127.0.0.1";
  unsigned port = 8080;
  unsigned io_threads = 1;
  int backlog = 4096;
  std::size_t max_body_bytes = 1 << 20;
  unsigned idle_timeout_ms = 30'000;

  std::size_t max_batch = 32;
  unsigned window_us = 2000;
  std::size_t lanes = 1;
  std::size_t queue_capacity = 4096;
  unsigned limit = 256;
  unsigned default_timeout_ms = 2000;
  unsigned warmup_rounds = 2;
  unsigned drain_timeout_ms = 5000;
  unsigned stats_window_s = 60;
  double slo_p95_ms = 100.0;  // drawn on the dashboard; reported in /v1/stats; the Autoscaler's SLO

  double autoscale_interval_s = 5.0;  // 0: no Autoscaler
  double capacity_rps = 0.0;          // per replica; 0: measured by the warm-up
  int replicas = 1;  // the fleet this replica sees itself in (--replicas, TAILBATCH_REPLICAS)

  std::size_t gen_max_active = 16;
  std::size_t gen_queue_capacity = 256;
  std::size_t gen_max_tokens = 1024;
  std::size_t gen_token_budget = 65536;

  std::size_t gen_max_prompt_tokens = 256;  // longer prompts get 400 (context_length_exceeded)

  std::string api_key;  // --api-key / TAILBATCH_API_KEY; empty: open
  unsigned sse_keepalive_ms =
      10'000;  // a ": keep-alive" comment on a stream idle this long; 0: none
  double littles_law_interval_s = 10.0;  // the Pipeline's Little's-law check; 0: off
  bool access_log = false;               // one stderr line per response (errors are always logged)
  unsigned max_connections = 10'000;  // open client connections; more wait in the kernel's backlog
  unsigned write_timeout_ms =
      30'000;  // a response (or stream chunk) not written in this long closes

  // Testing and demos only: wrapped around the model callables, never inside them.
  std::string fail_on_text;
  unsigned model_delay_ms = 0;
  unsigned decode_delay_ms = 0;
};

// The names /v1/models lists.
constexpr std::string_view generator_model_id = "tailbatch-reference-generator";
constexpr std::string_view embedder_model_id = "tailbatch-reference-embedder";

// Events per second over the last `seconds` whole seconds (fewer right after start).
class RateWindow {
 public:
  explicit RateWindow(unsigned seconds)
      : buckets_(seconds ? seconds : 1), start_(std::chrono::steady_clock::now()) {}
  void add(std::uint64_t n, SteadyTime now) {
    const auto sec = second_of(now);
    std::lock_guard lock(mu_);
    auto& b = buckets_[static_cast<std::size_t>(sec) % buckets_.size()];
    if (b.first != sec) b = {sec, 0};
    b.second += n;
  }
  [[nodiscard]] double per_second(SteadyTime now) const {
    const auto sec = second_of(now);
    const auto span = static_cast<std::int64_t>(buckets_.size());
    std::uint64_t sum = 0;
    {
      std::lock_guard lock(mu_);
      for (const auto& b : buckets_) {
        if (b.first > sec - span && b.first <= sec) sum += b.second;
      }
    }
    const double elapsed =
        std::min(std::chrono::duration<double>(now - start_).count(), static_cast<double>(span));
    return elapsed > 0 ? static_cast<double>(sum) / std::max(elapsed, 1.0) : 0.0;
  }

 private:
  [[nodiscard]] std::int64_t second_of(SteadyTime t) const {
    return std::chrono::duration_cast<std::chrono::seconds>(t - start_).count();
  }
  mutable std::mutex mu_;
  std::vector<std::pair<std::int64_t, std::uint64_t>> buckets_;
  SteadyTime start_;
};

// The Pipeline's admission stage: the ConcurrencyLimiter, or (limit 0) nobody. Warm-up
// batches pass without a permit, so that warming up works whatever the limit.
class ServerAdmission {
 public:
  using Limiter = tb::ConcurrencyLimiter<tb::StaticLimit>;
  using Ticket = Limiter::Permit;
  explicit ServerAdmission(Limiter* limiter) noexcept : limiter_(limiter) {}
  [[nodiscard]] std::optional<Ticket> try_admit() noexcept {
    if (warming_.load(std::memory_order_relaxed)) return Ticket{};
    if (limiter_ == nullptr) return std::nullopt;
    return limiter_->try_admit();
  }
  void release(Ticket&& ticket, tb::Status status, std::chrono::nanoseconds latency) noexcept {
    if (limiter_ != nullptr) limiter_->release(std::move(ticket), status, latency);
  }
  void set_warming(bool on) noexcept { warming_.store(on, std::memory_order_relaxed); }

 private:
  Limiter* limiter_;
  std::atomic<bool> warming_{true};
};
static_assert(tb::AdmissionPolicy<ServerAdmission>);

using ClassifyPipeline =
    tb::Pipeline<std::string, ref::Prediction, tb::FixedWindow, tb::HostLanes, ServerAdmission>;
using Batcher = tb::ContinuousBatcher<std::int32_t, ref::TextSequenceState>;
using EmbedPipeline = tb::Pipeline<std::string, std::vector<float>>;
using tailbatch_serve::ApiError;

bool iequal(std::string_view a, std::string_view b) {
  return beast::iequals(beast::string_view(a.data(), a.size()),
                        beast::string_view(b.data(), b.size()));
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class Connection;

// Everything the server shares between connections.
class Server {
 public:
  explicit Server(const Options& o);
  int run();

  const Options& options() const noexcept { return opt_; }
  asio::io_context& io() noexcept { return ioc_; }
  bool draining() const noexcept { return draining_.load(std::memory_order_acquire); }
  bool ready() const noexcept { return readiness_.is_ready() && !draining(); }

  // Request handling (called on a connection's strand).
  void handle(const std::shared_ptr<Connection>& c, http::request<http::string_body>&& req);
  void count_response(std::string_view route, int code, SteadyTime arrival);
  void count_disconnect() { disconnects_->inc(); }
  void request_started() { in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void request_finished() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  void connection_opened() { connections_.fetch_add(1, std::memory_order_relaxed); }
  void connection_closed() {
    connections_.fetch_sub(1, std::memory_order_relaxed);
    // Accepting paused at --max-connections resumes once one closes.
    if (accept_paused_.exchange(false, std::memory_order_acq_rel))
      asio::post(accept_strand_, [this] { accept(); });
  }

  const tailbatch_serve::DecodeLimits& limits() const noexcept { return limits_; }
  // A fresh x-request-id: "req-" and 24 hex digits (a per-process salt and a counter).
  std::string new_request_id() {
    char buf[48];
    std::snprintf(
        buf, sizeof buf, "req-%08x%016llx", id_salt_,
        static_cast<unsigned long long>(request_seq_.fetch_add(1, std::memory_order_relaxed)));
    return buf;
  }

 private:
  friend class Connection;
  void accept();
  void begin_drain();
  void warm_up();
  void schedule_autoscale();
  void autoscale_tick();
  void schedule_littles_law();
  void wait_signal();
  void classify(const std::shared_ptr<Connection>& c, const http::request<http::string_body>& req);
  void generate(const std::shared_ptr<Connection>& c, const http::request<http::string_body>& req);
  // The OpenAI routes.
  void models(const std::shared_ptr<Connection>& c);
  void completions(const std::shared_ptr<Connection>& c,
                   const http::request<http::string_body>& req, bool chat);
  void embeddings(const std::shared_ptr<Connection>& c,
                  const http::request<http::string_body>& req);
  [[nodiscard]] bool authorized(const http::request<http::string_body>& req) const;
  // The generation's end bound from X-Request-Timeout-Ms (none without the header).
  SteadyTime completion_deadline_of(const http::request<http::string_body>& req,
                                    SteadyTime arrival) const;
  std::string stats_json();
  std::optional<SteadyTime> deadline_of(const std::shared_ptr<Connection>& c,
                                        const http::request<http::string_body>& req);

  Options opt_;
  tailbatch_serve::DecodeLimits limits_;
  tailbatch_serve::OpenAiLimits oai_limits_;
  tb::MetricsRegistry registry_;
  ref::Classifier classifier_;
  ref::ClassifierModel classifier_model_;
  ref::Generator generator_;
  ref::TextGenerator text_generator_;
  ref::TextVocabulary vocab_;
  tb::HostLanes lanes_;
  std::unique_ptr<ServerAdmission::Limiter> limiter_;  // null with --limit 0
  ServerAdmission admission_;
  std::unique_ptr<ClassifyPipeline> pipeline_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<EmbedPipeline> embed_pipeline_;
  std::int64_t created_ = 0;  // /v1/models' "created": the server's start, Unix seconds
  std::vector<std::atomic<std::uint64_t>> batch_sizes_;  // [size - 1]: batches run of that size
  std::vector<std::atomic<std::uint64_t>>
      decode_batch_sizes_;  // [size - 1]: decode steps over that many
  RateWindow classify_rate_;
  RateWindow token_rate_;
  std::atomic<std::uint64_t> next_seed_{1};
  std::atomic<std::uint64_t> request_seq_{1};
  unsigned id_salt_ = 0;

  std::mutex counters_mu_;
  std::map<std::pair<std::string, int>, tb::Counter*> responses_;
  tb::WindowedHistogram<>* classify_latency_ = nullptr;
  tb::WindowedHistogram<>* generate_latency_ = nullptr;
  tb::WindowedHistogram<>* ttft_ = nullptr;
  tb::Counter* disconnects_ = nullptr;
  tb::Counter* littles_checks_ = nullptr;
  std::vector<tb::CallbackRegistration> gauges_;

  tb::Readiness readiness_{&registry_};  // tailbatch_ready; set by the warm-up
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int> connections_{0};
  std::mutex conns_mu_;
  std::vector<std::weak_ptr<Connection>> conns_;
  SteadyTime started_ = std::chrono::steady_clock::now();
  // Last: destroyed first, with the handlers (and connections) still queued in it.
  asio::io_context ioc_;
  // The acceptor and the signal handler share a strand: the drain closes the acceptor
  // while an accept may be completing on another I/O thread.
  asio::strand<asio::io_context::executor_type> accept_strand_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  std::thread warmup_thread_;
  std::thread drain_thread_;

  // The Autoscaler and its timer: used only on accept_strand_ (the timer's handler and the
  // drain's cancel), so one evaluator at a time. Made at the first tick after warm-up,
  // when the capacity is known.
  asio::steady_timer autoscale_timer_;
  asio::steady_timer littles_timer_;
  asio::steady_timer accept_timer_;
  std::atomic<bool> accept_paused_{false};
  tb::Counter* accept_errors_ = nullptr;
  std::unique_ptr<tb::Autoscaler> autoscaler_;
  std::optional<tb::PipelineOccupancy> autoscale_last_;  // the interval's start
  std::uint64_t autoscale_last_submitted_ = 0;
  bool autoscale_off_ = false;
  bool loopback_bind_ = false;  // bound to a loopback address: the Host header is checked
  // Requests per second one lane ran in the warm-up's fastest full batch, times the lanes;
  // written by the warm-up thread before readiness_ (release), read after it (acquire).
  double measured_capacity_rps_ = 0.0;
};

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
    res->reason(std::string(code == 401   ? "Unauthorized"
                            : code == 415 ? "Unsupported Media Type"
                            : code == 501 ? "Not Implemented"
                                          : tb::http_reason_phrase(code)));
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
    return {{"id", job.id},
            {"object", job.chat ? "chat.completion" : "text_completion"},
            {"created", job.created},
            {"model", job.model},
            {"choices", json::array({std::move(choice)})},
            {"usage", usage_json(job)}};
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
    return {{"id", job.id},
            {"object", job.chat ? "chat.completion.chunk" : "text_completion"},
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

// ---- Server ---------------------------------------------------------------------------

ref::ClassifierConfig classifier_config() { return ref::ClassifierConfig{}; }

std::unique_ptr<ServerAdmission::Limiter> make_limiter(const Options& o,
                                                       tb::MetricsRegistry& registry) {
  if (o.limit == 0) return nullptr;
  tb::ConcurrencyLimiterConfig lo;
  lo.queue_capacity = 0;
  lo.metrics = &registry;
  lo.metric_labels = {{"route", "classify"}};
  return std::make_unique<ServerAdmission::Limiter>(tb::StaticLimit(o.limit), lo);
}

// The registry's histograms get a bucket bound at the SLO, so that a rule reading
// le="0.15" for --slo-p95-ms=150 (deploy/prometheus/) reads an exact bucket.
tb::MetricsRegistryConfig metrics_config(const Options& o) {
  tb::MetricsRegistryConfig c;
  c.buckets.extra_boundaries_seconds = {o.slo_p95_ms / 1000.0};
  return c;
}

Server::Server(const Options& o)
    : opt_(o),
      registry_(metrics_config(o)),
      classifier_(classifier_config()),
      classifier_model_(classifier_),
      text_generator_(generator_),
      lanes_(o.lanes),
      limiter_(make_limiter(o, registry_)),
      admission_(limiter_.get()),
      batch_sizes_(o.max_batch),
      decode_batch_sizes_(o.gen_max_active),
      classify_rate_(10),
      token_rate_(10),
      accept_strand_(asio::make_strand(ioc_)),
      acceptor_(accept_strand_),
      signals_(accept_strand_, SIGINT, SIGTERM, SIGHUP),
      autoscale_timer_(accept_strand_),
      littles_timer_(accept_strand_),
      accept_timer_(accept_strand_) {
  limits_.max_generate_tokens = o.gen_max_tokens;
  oai_limits_.max_tokens = o.gen_max_tokens;
  created_ = std::chrono::duration_cast<std::chrono::seconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  id_salt_ = static_cast<unsigned>(std::random_device{}());
  tb::PipelineConfig<std::string> pc;
  pc.queue_capacity = o.queue_capacity;
  pc.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  pc.check_admission_limit = false;  // a small --limit is how tests force rejections
  pc.metrics = &registry_;
  pc.metric_labels = {{"pipeline", "classify"}};
  auto model = [this](std::span<const std::string> texts, std::span<ref::Prediction> out,
                      tb::HostLanes::Lane& lane) {
    const std::size_t n = texts.size();
    if (n >= 1 && n <= batch_sizes_.size())
      batch_sizes_[n - 1].fetch_add(1, std::memory_order_relaxed);
    if (opt_.model_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(opt_.model_delay_ms));
    if (!opt_.fail_on_text.empty()) {
      for (const auto& t : texts) {
        if (t == opt_.fail_on_text)
          throw std::runtime_error("the model refused a text (--fail-on-text)");
      }
    }
    classifier_model_(texts, out, lane);
  };
  pipeline_ = std::make_unique<ClassifyPipeline>(
      model, tb::FixedWindow(o.max_batch, std::chrono::microseconds(o.window_us)), pc, lanes_,
      admission_);

  tb::ContinuousBatcherConfig bc;
  bc.max_active = o.gen_max_active;
  bc.queue_capacity = o.gen_queue_capacity;
  bc.token_budget = o.gen_token_budget;
  bc.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  bc.metrics = &registry_;
  bc.metric_labels = {{"model", "generate"}};
  bc.workers = 1;  // the decode thread, started here; it waits for work until run() accepts
  batcher_ = std::make_unique<Batcher>(
      [this](std::span<Batcher::Sequence> batch) {
        std::size_t emitting = 0;
        for (const auto& s : batch) emitting += s.emits() ? 1 : 0;
        if (opt_.decode_delay_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(opt_.decode_delay_ms));
        text_generator_.step_sequences(batch);
        token_rate_.add(emitting, std::chrono::steady_clock::now());
        const std::size_t n = batch.size();
        if (n >= 1 && n <= decode_batch_sizes_.size())
          decode_batch_sizes_[n - 1].fetch_add(1, std::memory_order_relaxed);
      },
      bc);

  // The embedder: the classifier's embedding table as a model of its own, behind a second
  // Pipeline so that the inputs of many clients batch together. An input's vector is the
  // mean of its tokens' rows (the classifier's first stage), L2-normalised.
  tb::PipelineConfig<std::string> ec;
  ec.queue_capacity = o.queue_capacity;
  ec.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  ec.metrics = &registry_;
  ec.metric_labels = {{"pipeline", "embed"}};
  embed_pipeline_ = std::make_unique<EmbedPipeline>(
      [this](std::span<const std::string> texts, std::span<std::vector<float>> out,
             tb::HostLanes::Lane&) {
        const ref::ClassifierWeights w = classifier_.weights();
        const std::size_t dim = w.embed_dim;
        std::vector<std::uint32_t> ids;
        for (std::size_t i = 0; i < texts.size(); ++i) {
          ids.clear();
          classifier_.tokenizer().tokenize(texts[i], ids);
          if (ids.size() > classifier_.config().max_tokens)
            ids.resize(classifier_.config().max_tokens);
          std::vector<double> sum(dim, 0.0);
          for (std::uint32_t t : ids) {
            for (std::size_t k = 0; k < dim; ++k) sum[k] += w.embeddings[std::size_t{t} * dim + k];
          }
          double norm = 0.0;
          for (double x : sum) norm += x * x;
          norm = std::sqrt(norm);
          out[i].resize(dim);
          for (std::size_t k = 0; k < dim; ++k)
            out[i][k] = norm > 0.0 ? static_cast<float>(sum[k] / norm) : 0.0f;
        }
      },
      tb::FixedWindow(o.max_batch, std::chrono::microseconds(o.window_us)), ec);

  const auto window = std::chrono::seconds(o.stats_window_s);
  classify_latency_ = &registry_.windowed_histogram(
      "tailbatch_serve_request_duration_seconds",
      "Time from a request's headers read to its response, recent window", {{"route", "classify"}},
      window);
  generate_latency_ = &registry_.windowed_histogram(
      "tailbatch_serve_request_duration_seconds",
      "Time from a request's headers read to its response, recent window", {{"route", "generate"}},
      window);
  ttft_ = &registry_.windowed_histogram(
      "tailbatch_serve_time_to_first_token_seconds",
      "Time from a generate request's headers read to its first token, recent window",
      {{"route", "generate"}}, window);
  accept_errors_ = &registry_.counter(
      "tailbatch_serve_accept_errors_total",
      "accept() failures for lack of file descriptors or memory; each waits 100 ms");
  littles_checks_ = &registry_.counter(
      "tailbatch_serve_littles_law_checks_total",
      "Little's-law checks run on the classify Pipeline (--littles-law-interval-s)");
  disconnects_ = &registry_.counter(
      "tailbatch_serve_client_disconnects_total",
      "Requests whose client disconnected before the response; their work was cancelled");
  gauges_.push_back(registry_.gauge_callback("tailbatch_serve_ready",
                                             "1 once warmed up and not draining", {},
                                             [this] { return ready() ? 1.0 : 0.0; }));
  gauges_.push_back(registry_.gauge_callback("tailbatch_serve_draining", "1 after SIGTERM", {},
                                             [this] { return draining() ? 1.0 : 0.0; }));
  gauges_.push_back(
      registry_.gauge_callback("tailbatch_serve_in_flight_requests",
                               "HTTP requests handed to tailbatch and not yet answered", {},
                               [this] { return static_cast<double>(in_flight_.load()); }));
  gauges_.push_back(
      registry_.gauge_callback("tailbatch_serve_open_connections", "Open client connections", {},
                               [this] { return static_cast<double>(connections_.load()); }));
}

void Server::count_response(std::string_view route, int code, SteadyTime arrival) {
  const auto now = std::chrono::steady_clock::now();
  if (route == "classify") {
    classify_latency_->record(now - arrival);
    if (code == 200) classify_rate_.add(1, now);
  } else if (route == "generate") {
    generate_latency_->record(now - arrival);
  }
  std::lock_guard lock(counters_mu_);
  auto key = std::make_pair(std::string(route), code);
  auto it = responses_.find(key);
  if (it == responses_.end()) {
    tb::Counter& c = registry_.counter(
        "tailbatch_serve_responses_total", "HTTP responses, by route and status code",
        {{"route", std::string(route)}, {"code", std::to_string(code)}});
    it = responses_.emplace(std::move(key), &c).first;
  }
  it->second->inc();
}

std::optional<SteadyTime> Server::deadline_of(const std::shared_ptr<Connection>& c,
                                              const http::request<http::string_body>& req) {
  const auto h = req.find(beast::string_view(tailbatch_serve::timeout_header.data(),
                                             tailbatch_serve::timeout_header.size()));
  std::chrono::milliseconds budget(opt_.default_timeout_ms);
  if (h != req.end()) {
    std::string error;
    auto t = tailbatch_serve::decode_timeout(std::string_view(h->value().data(), h->value().size()),
                                             limits_, error);
    if (!t) {
      c->respond_error(400, "bad_request", error);
      return std::nullopt;
    }
    budget = *t;
    if (budget.count() == 0) return SteadyTime::max();  // 0: no budget, as in SubmitOptions
  } else if (budget.count() == 0) {
    return SteadyTime::max();
  }
  return c->context().arrival + budget;
}

bool Server::authorized(const http::request<http::string_body>& req) const {
  if (opt_.api_key.empty()) return true;
  const auto h = req.find(http::field::authorization);
  if (h == req.end()) return false;
  const std::string_view v(h->value().data(), h->value().size());
  constexpr std::string_view bearer = "Bearer ";
  if (v.size() < bearer.size() || !iequal(v.substr(0, bearer.size()), bearer)) return false;
  return tailbatch_serve::constant_time_equal(v.substr(bearer.size()), opt_.api_key);
}

namespace {
bool is_loopback_host(std::string_view host) {
  // Host: name[:port]; [v6]:port.
  if (host.starts_with("[")) {
    const auto close = host.find(']');
    host = close == std::string_view::npos ? host : host.substr(1, close - 1);
  } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
    host = host.substr(0, colon);
  }
  return iequal(host, "localhost") || host == "::1" || host.starts_with("127.");
}
}  // namespace

void Server::handle(const std::shared_ptr<Connection>& c, http::request<http::string_body>&& req) {
  std::string_view target(req.target().data(), req.target().size());
  // Absolute-form targets (RFC 9112 3.2.2: "http://host/path") name the path after the authority.
  if (target.starts_with("http://") || target.starts_with("https://")) {
    const auto slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  target = target.substr(0, target.find('?'));
  struct Route {
    std::string_view path, label;
    http::verb method;
  };
  static constexpr std::array<Route, 12> routes = {
      {{"/v1/classify", "classify", http::verb::post},
       {"/v1/generate", "generate", http::verb::post},
       {"/v1/models", "models", http::verb::get},
       {"/v1/completions", "completions", http::verb::post},
       {"/v1/chat/completions", "chat_completions", http::verb::post},
       {"/v1/embeddings", "embeddings", http::verb::post},
       {"/metrics", "metrics", http::verb::get},
       {"/v1/stats", "stats", http::verb::get},
       {"/healthz", "healthz", http::verb::get},
       {"/readyz", "readyz", http::verb::get},
       {"/dashboard", "dashboard", http::verb::get},
       {"/static/chart.js", "static", http::verb::get}}};
  // DNS rebinding: a server bound to loopback answers only requests addressed to loopback.
  if (loopback_bind_) {
    const auto host = req.find(http::field::host);
    if (host != req.end() &&
        !is_loopback_host(std::string_view(host->value().data(), host->value().size()))) {
      return c->respond_error(400, "bad_request",
                              "the Host header must name a loopback address on this server", {}, "",
                              "invalid_host");
    }
  }
  const Route* route = nullptr;
  for (const auto& r : routes) {
    if (r.path == target) route = &r;
  }
  // The message does not echo the path: a reflected string is the start of many attacks.
  if (!route)
    return c->respond_error(404, "not_found", "no such route; see docs/serving.md for the routes");
  c->context().route = std::string(route->label);
  const bool api = target.starts_with("/v1/");
  if (api && !authorized(req)) {
    return c->respond_error(401, "unauthorized",
                            "a valid API key is required: Authorization: Bearer <key>",
                            {{"WWW-Authenticate", "Bearer"}}, "", "invalid_api_key");
  }
  const bool head_ok = req.method() == http::verb::head && route->method == http::verb::get;
  if (req.method() != route->method && !head_ok) {
    return c->respond_error(405, "method_not_allowed",
                            "use " + std::string(http::to_string(route->method)),
                            {{"Allow", std::string(http::to_string(route->method)) +
                                           (route->method == http::verb::get ? ", HEAD" : "")}});
  }
  if (route->method == http::verb::post) {
    // A cross-site form or fetch without a preflight can send text/plain, never
    // application/json: requiring it keeps web pages from forging requests.
    const auto ct = req.find(http::field::content_type);
    const std::string_view type = ct == req.end()
                                      ? std::string_view()
                                      : std::string_view(ct->value().data(), ct->value().size());
    const std::string_view media = type.substr(0, type.find(';'));
    if (!iequal(media.substr(0, media.find_last_not_of(" \t") + 1), "application/json")) {
      return c->respond_error(415, "unsupported_media_type",
                              "POST bodies must be Content-Type: application/json", {}, "",
                              "unsupported_media_type");
    }
  }
  if (route->label == "classify") return classify(c, req);
  if (route->label == "generate") return generate(c, req);
  if (route->label == "models") return models(c);
  if (route->label == "completions") return completions(c, req, false);
  if (route->label == "chat_completions") return completions(c, req, true);
  if (route->label == "embeddings") return embeddings(c, req);
  if (route->label == "metrics")
    return c->respond(200, registry_.prometheus(), "text/plain; version=0.0.4; charset=utf-8");
  if (route->label == "stats") return c->respond(200, stats_json());
  if (route->label == "healthz") return c->respond(200, R"({"status":"alive"})");
  if (route->label == "dashboard")
    return c->respond(200, dashboard_html, "text/html; charset=utf-8");
  if (route->label == "static") {
    // Read per request (about 200 kB, from the page cache): the package may be installed
    // or upgraded while the server runs.
    std::ifstream in(TAILBATCH_SERVE_CHART_JS, std::ios::binary);
    if (!in)
      return c->respond_error(404, "not_found",
                              "Chart.js not found at " TAILBATCH_SERVE_CHART_JS
                              "; install libjs-chart.js");
    std::string js((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return c->respond(200, std::move(js), "text/javascript; charset=utf-8",
                      {{"Cache-Control", "max-age=3600"}});
  }
  if (ready()) return c->respond(200, R"({"status":"ready"})");
  return c->respond(503, draining() ? R"({"status":"draining"})" : R"({"status":"warming_up"})");
}

void Server::classify(const std::shared_ptr<Connection>& c,
                      const http::request<http::string_body>& req) {
  std::string error;
  auto decoded = tailbatch_serve::decode_classify(req.body(), limits_, error);
  if (!decoded) return c->respond_error(400, "bad_request", error);
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  auto job = std::make_shared<Connection::ClassifyJob>();
  const std::size_t n = decoded->texts.size();
  job->conn = c;
  job->batch_form = decoded->batch_form;
  job->outcomes.resize(n);
  job->remaining.store(n, std::memory_order_relaxed);
  c->set_classify_job(job);
  c->work_started();
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;  // queue wait and latency count from the headers' arrival
  so.cancel = job->cancel.get_token();
  for (std::size_t i = 0; i < n; ++i) {
    pipeline_->submit(std::move(decoded->texts[i]), so, [job, i](tb::Outcome<ref::Prediction>&& o) {
      job->outcomes[i].emplace(std::move(o));
      if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        auto conn = job->conn;
        asio::post(conn->executor(), [conn] { conn->finish_classify(); });
      }
    });
  }
}

SteadyTime Server::completion_deadline_of(const http::request<http::string_body>& req,
                                          SteadyTime arrival) const {
  const auto h = req.find(beast::string_view(tailbatch_serve::timeout_header.data(),
                                             tailbatch_serve::timeout_header.size()));
  if (h == req.end()) return SteadyTime::max();
  std::string error;
  const auto t = tailbatch_serve::decode_timeout(
      std::string_view(h->value().data(), h->value().size()), limits_, error);
  if (!t || t->count() == 0)
    return SteadyTime::max();  // malformed: already answered 400; 0: no budget
  return arrival + *t;
}

namespace {
// The batcher's callbacks for one generation: tokens and the end are appended to the job
// under its lock (on the decode thread) and one flush at a time is posted to the strand.
void post_flush(const std::shared_ptr<Connection::GenerateJob>& j) {
  if (j->posted) return;
  j->posted = true;
  auto conn = j->conn;
  asio::post(conn->executor(), [conn, j] { conn->flush_generate(j); });
}
}  // namespace

void Server::generate(const std::shared_ptr<Connection>& c,
                      const http::request<http::string_body>& req) {
  std::string error;
  auto decoded = tailbatch_serve::decode_generate(req.body(), limits_, error);
  if (!decoded) return c->respond_error(400, "bad_request", error);
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  Batcher::Request r;
  vocab_.encode(decoded->prompt, r.prompt);
  if (r.prompt.size() > opt_.gen_max_prompt_tokens) {
    return c->respond_error(400, "bad_request",
                            "the prompt has " + std::to_string(r.prompt.size()) +
                                " tokens; at most " + std::to_string(opt_.gen_max_prompt_tokens) +
                                " (--gen-max-prompt-tokens)",
                            {}, "prompt", "context_length_exceeded");
  }
  r.max_new_tokens = decoded->max_tokens;
  r.state = text_generator_.new_state({}, next_seed_.fetch_add(1, std::memory_order_relaxed));
  r.completion_deadline = completion_deadline_of(req, c->context().arrival);
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;  // queue wait counts from the headers' arrival
  auto job = std::make_shared<Connection::GenerateJob>();
  job->conn = c;
  job->stream = decoded->stream;
  tb::StreamCallbacks<std::int32_t> cb;
  cb.on_tokens = [job, ttft = ttft_,
                  arrival = c->context().arrival](std::span<const std::int32_t> t) {
    std::lock_guard lock(job->mu);
    if (!job->any_tokens) ttft->record(std::chrono::steady_clock::now() - arrival);
    job->any_tokens = true;
    if (job->stream) {
      job->encoder.append_tokens(job->outbox, t);
    } else {
      job->tokens.insert(job->tokens.end(), t.begin(), t.end());
    }
    post_flush(job);
  };
  cb.on_end = [job](const tb::StreamEnd& e) {
    std::lock_guard lock(job->mu);
    job->end = e;
    if (job->stream && (job->any_tokens || e.ok())) job->encoder.append_end(job->outbox, e);
    post_flush(job);
  };
  c->work_started();
  // Registered before submit: a rejection ends the stream inside submit.
  c->set_generate(job, nullptr);
  auto stream = batcher_->submit(std::move(r), so, std::move(cb));
  c->set_generate(job, std::move(stream));
}

void Server::models(const std::shared_ptr<Connection>& c) {
  json data = json::array();
  for (std::string_view id : {generator_model_id, embedder_model_id}) {
    data.push_back(
        {{"id", id}, {"object", "model"}, {"created", created_}, {"owned_by", "tailbatch"}});
  }
  c->respond(200, dump(json{{"object", "list"}, {"data", std::move(data)}}));
}

void Server::completions(const std::shared_ptr<Connection>& c,
                         const http::request<http::string_body>& req, bool chat) {
  ApiError err;
  auto decoded = tailbatch_serve::decode_completion(req.body(), chat, limits_, oai_limits_, err);
  if (!decoded) return c->respond_api_error(err);
  c->context().user = tailbatch_serve::loggable(decoded->user);
  if (decoded->model != generator_model_id) {
    return c->respond_api_error(
        ApiError{404,
                 "the model '" + tailbatch_serve::loggable(decoded->model) +
                     "' does not exist or does not generate text; GET /v1/models lists them",
                 "model", "model_not_found"});
  }
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  Batcher::Request r;
  vocab_.encode(decoded->prompt, r.prompt);
  if (r.prompt.size() > opt_.gen_max_prompt_tokens) {
    return c->respond_api_error(
        ApiError{400,
                 "the prompt has " + std::to_string(r.prompt.size()) + " tokens; at most " +
                     std::to_string(opt_.gen_max_prompt_tokens) + " are served",
                 chat ? "messages" : "prompt", "context_length_exceeded"});
  }
  auto job = std::make_shared<Connection::GenerateJob>();
  job->conn = c;
  job->openai = true;
  job->chat = chat;
  job->stream = decoded->stream;
  job->include_usage = decoded->include_usage;
  job->id = (chat ? "chatcmpl-" : "cmpl-") + c->context().request_id;
  job->model = decoded->model;
  job->created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  job->prompt_tokens = r.prompt.size();
  job->max_tokens = decoded->max_tokens;
  job->stop = ref::StopMatcher(decoded->stop);
  const std::uint64_t seed =
      decoded->seed ? static_cast<std::uint64_t>(*decoded->seed)
                    : next_seed_.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ULL;
  r.max_new_tokens = decoded->max_tokens;
  r.state = text_generator_.new_state({decoded->temperature, decoded->top_p}, seed, decoded->stop);
  r.completion_deadline = completion_deadline_of(req, c->context().arrival);
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;
  tb::StreamCallbacks<std::int32_t> cb;
  cb.on_tokens = [job, ttft = ttft_,
                  arrival = c->context().arrival](std::span<const std::int32_t> t) {
    std::lock_guard lock(job->mu);
    const bool first = !job->any_tokens;
    if (first) ttft->record(std::chrono::steady_clock::now() - arrival);
    job->any_tokens = true;
    std::string released;
    for (std::int32_t id : t) {
      ++job->completion_tokens;
      job->piece.clear();
      ref::TextVocabulary::append_piece(id, job->piece);
      released += job->stop.push(job->piece);
    }
    if (!job->stream) {
      job->text += released;
      return;  // one flush, at the end
    }
    if (first && job->chat) {
      Connection::append_event(job->outbox, Connection::chunk_json(*job, "", true, std::nullopt));
    }
    if (!released.empty())
      Connection::append_event(job->outbox,
                               Connection::chunk_json(*job, released, false, std::nullopt));
    post_flush(job);
  };
  cb.on_end = [job](const tb::StreamEnd& e) {
    std::lock_guard lock(job->mu);
    job->end = e;
    const std::string rest = job->stop.finish();
    if (!job->stream) {
      job->text += rest;
    } else if (job->any_tokens || e.ok()) {
      if (!job->any_tokens && job->chat) {
        Connection::append_event(job->outbox, Connection::chunk_json(*job, "", true, std::nullopt));
      }
      if (e.ok()) {
        Connection::append_event(
            job->outbox,
            Connection::chunk_json(*job, rest, false, Connection::finish_reason(*job)));
        if (job->include_usage) {
          json u = Connection::chunk_json(*job, "", false, std::nullopt);
          u["choices"] = json::array();
          u["usage"] = Connection::usage_json(*job);
          Connection::append_event(job->outbox, u);
        }
      } else {
        // A failure after the stream started: in band, then the end.
        if (!rest.empty())
          Connection::append_event(job->outbox,
                                   Connection::chunk_json(*job, rest, false, std::nullopt));
        Connection::append_event(job->outbox,
                                 Connection::outcome_error_json(Connection::error_of(e)));
      }
      job->outbox += "data: [DONE]\n\n";
    }
    post_flush(job);
  };
  c->work_started();
  c->set_generate(job, nullptr);
  auto stream = batcher_->submit(std::move(r), so, std::move(cb));
  c->set_generate(job, std::move(stream));
}

void Server::embeddings(const std::shared_ptr<Connection>& c,
                        const http::request<http::string_body>& req) {
  const std::size_t dim = classifier_.config().embed_dim;
  ApiError err;
  auto decoded = tailbatch_serve::decode_embeddings(req.body(), limits_, oai_limits_, dim, err);
  if (!decoded) return c->respond_api_error(err);
  c->context().user = tailbatch_serve::loggable(decoded->user);
  if (decoded->model != embedder_model_id) {
    return c->respond_api_error(
        ApiError{404,
                 "the model '" + tailbatch_serve::loggable(decoded->model) +
                     "' does not exist or does not embed; GET /v1/models lists them",
                 "model", "model_not_found"});
  }
  const std::size_t limit = classifier_.config().max_tokens;
  std::size_t prompt_tokens = 0;
  std::vector<std::uint32_t> ids;
  for (std::size_t i = 0; i < decoded->inputs.size(); ++i) {
    ids.clear();
    classifier_.tokenizer().tokenize(decoded->inputs[i], ids);
    if (ids.size() > limit) {
      return c->respond_api_error(ApiError{400,
                                           "input " + std::to_string(i) + " has more than " +
                                               std::to_string(limit) +
                                               " tokens, the embedder's limit",
                                           "input", "context_length_exceeded"});
    }
    prompt_tokens += ids.size();
  }
  const auto deadline = deadline_of(c, req);
  if (!deadline) return;
  struct EmbedJob {
    std::shared_ptr<Connection> conn;
    std::vector<std::optional<tb::Outcome<std::vector<float>>>> outcomes;
    std::atomic<std::size_t> remaining{0};
    tb::CancellationSource cancel;
    bool base64 = false;
    std::size_t prompt_tokens = 0;
    std::string model;
  };
  auto job = std::make_shared<EmbedJob>();
  const std::size_t n = decoded->inputs.size();
  job->conn = c;
  job->outcomes.resize(n);
  job->remaining.store(n, std::memory_order_relaxed);
  job->base64 = decoded->base64;
  job->prompt_tokens = prompt_tokens;
  job->model = decoded->model;
  // The Connection watches for a disconnect through a classify job's cancel source; an
  // embeddings request shares that path with an empty ClassifyJob holding the same source.
  auto watch = std::make_shared<Connection::ClassifyJob>();
  watch->conn = c;
  job->cancel = watch->cancel;
  c->set_classify_job(watch);
  c->work_started();
  tb::SubmitOptions so;
  so.deadline = *deadline;
  so.arrival = c->context().arrival;
  so.cancel = job->cancel.get_token();
  for (std::size_t i = 0; i < n; ++i) {
    embed_pipeline_->submit(
        std::move(decoded->inputs[i]), so, [job, i](tb::Outcome<std::vector<float>>&& o) {
          job->outcomes[i].emplace(std::move(o));
          if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
          auto conn = job->conn;
          asio::post(conn->executor(), [conn, job] {
            json data = json::array();
            for (std::size_t k = 0; k < job->outcomes.size(); ++k) {
              auto& out = *job->outcomes[k];
              if (!out.ok())
                return conn->finish_custom(
                    [e = out.error()](Connection& cc) { cc.respond_outcome_error(e); });
              json item = {{"object", "embedding"}, {"index", k}};
              const std::vector<float>& v = out.value();
              if (job->base64) {
                item["embedding"] = tailbatch_serve::base64(std::string_view(
                    reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
              } else {
                item["embedding"] = v;
              }
              data.push_back(std::move(item));
            }
            json body = {
                {"object", "list"},
                {"data", std::move(data)},
                {"model", job->model},
                {"usage",
                 {{"prompt_tokens", job->prompt_tokens}, {"total_tokens", job->prompt_tokens}}}};
            conn->finish_custom(
                [b = dump(body)](Connection& cc) mutable { cc.respond(200, std::move(b)); });
          });
        });
  }
}

std::string Server::stats_json() {
  const auto now = std::chrono::steady_clock::now();
  const tb::PipelineStats ps = pipeline_->stats();
  const auto cs = batcher_->stats();
  auto pct = [](const tb::HistogramSnapshot& s) {
    auto ms = [&](double p) {
      return s.count() ? static_cast<double>(s.percentile(p).count()) / 1e6 : 0.0;
    };
    return json{{"count", s.count()}, {"p50", ms(50)}, {"p95", ms(95)}, {"p99", ms(99)}};
  };
  json reasons = json::object(), responses = json::object();
  for (std::size_t i = 0; i < tb::dispatch_reason_count; ++i) {
    const auto r = static_cast<tb::DispatchReason>(i);
    reasons[std::string(tb::to_string(r))] = ps.count(r);
  }
  {
    std::lock_guard lock(counters_mu_);
    for (const auto& [key, counter] : responses_)
      responses[key.first][std::to_string(key.second)] = counter->value();
  }
  json sizes = json::object();
  for (std::size_t i = 0; i < batch_sizes_.size(); ++i) {
    const auto v = batch_sizes_[i].load(std::memory_order_relaxed);
    if (v) sizes[std::to_string(i + 1)] = v;
  }
  json decode_sizes = json::object();
  for (std::size_t i = 0; i < decode_batch_sizes_.size(); ++i) {
    const auto v = decode_batch_sizes_[i].load(std::memory_order_relaxed);
    if (v) decode_sizes[std::to_string(i + 1)] = v;
  }
  json by_status = json::object(), rejections = json::object();
  for (auto s : {tb::Status::ok, tb::Status::rejected, tb::Status::deadline_exceeded,
                 tb::Status::cancelled, tb::Status::failed}) {
    by_status[std::string(tb::to_string(s))] = ps.count(s);
  }
  for (auto r : {tb::RejectReason::queue_full, tb::RejectReason::overloaded,
                 tb::RejectReason::shutting_down, tb::RejectReason::too_large}) {
    rejections[std::string(tb::to_string(r))] = ps.count(r);
  }
  json j;
  j["ready"] = ready();
  j["draining"] = draining();
  j["uptime_s"] = std::chrono::duration<double>(now - started_).count();
  j["window_s"] = opt_.stats_window_s;
  j["slo_p95_ms"] = opt_.slo_p95_ms;
  j["classify"] = {{"latency_ms", pct(classify_latency_->snapshot())},
                   {"queue_depth", pipeline_->queued_approx()},
                   {"in_flight", pipeline_->in_flight_approx()},
                   {"batches", ps.batches()},
                   {"batched_requests", ps.batched_requests},
                   {"mean_batch", ps.batches() ? static_cast<double>(ps.batched_requests) /
                                                     static_cast<double>(ps.batches())
                                               : 0.0},
                   {"batch_sizes", sizes},
                   {"requests", by_status},
                   {"rejections", rejections},
                   {"requests_per_s", classify_rate_.per_second(now)},
                   {"max_batch", opt_.max_batch},
                   {"limit", opt_.limit},
                   {"limit_current", limiter_ ? limiter_->limit() : 0u},
                   {"dispatch_reasons", reasons}};
  j["generate"] = {{"latency_ms", pct(generate_latency_->snapshot())},
                   {"ttft_ms", pct(ttft_->snapshot())},
                   {"active", batcher_->active_approx()},
                   {"waiting", batcher_->waiting_approx()},
                   {"submitted", cs.submitted},
                   {"steps", cs.steps},
                   {"tokens", cs.tokens},
                   {"tokens_per_s", token_rate_.per_second(now)},
                   {"decode_batch_sizes", decode_sizes},
                   {"requests",
                    {{"ok", cs.count(tb::Status::ok)},
                     {"rejected", cs.count(tb::Status::rejected)},
                     {"deadline_exceeded", cs.count(tb::Status::deadline_exceeded)},
                     {"cancelled", cs.count(tb::Status::cancelled)},
                     {"failed", cs.count(tb::Status::failed)}}}};
  j["http"] = {{"in_flight", in_flight_.load()},
               {"connections", connections_.load()},
               {"client_disconnects", disconnects_->value()},
               {"responses", responses}};
  return dump(j);
}

void Server::accept() {
  if (!acceptor_.is_open()) return;
  if (connections_.load(std::memory_order_relaxed) >= static_cast<int>(opt_.max_connections)) {
    // At the cap: stop accepting (clients wait in the backlog) until a connection closes.
    accept_paused_.store(true, std::memory_order_release);
    if (connections_.load(std::memory_order_relaxed) >= static_cast<int>(opt_.max_connections) ||
        !accept_paused_.exchange(false, std::memory_order_acq_rel)) {
      return;
    }
  }
  acceptor_.async_accept(asio::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (!acceptor_.is_open()) return;  // closed by the drain
      if (ec == asio::error::no_descriptors || ec.value() == EMFILE || ec.value() == ENFILE ||
          ec == asio::error::no_buffer_space || ec == asio::error::no_memory) {
        // Out of file descriptors: the pending connection stays in the backlog and accept
        // would fail again at once. Wait instead of spinning.
        accept_errors_->inc();
        accept_timer_.expires_after(100ms);
        accept_timer_.async_wait([this](beast::error_code e) {
          if (!e) accept();
        });
        return;
      }
      return accept();
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto c = std::make_shared<Connection>(*this, std::move(socket));
    {
      std::lock_guard lock(conns_mu_);
      std::erase_if(conns_, [](const auto& w) { return w.expired(); });
      conns_.push_back(c);
    }
    c->start();
    accept();
  });
}

void Server::warm_up() {
  // The library's warmup(): batches of every size up to max_batch, --warmup-rounds times
  // per lane, through the Pipeline itself, before the server says it is ready; the same
  // for the embedder; a few decode steps of the generator. Then one more round of full
  // classify batches, timed: its rate is the capacity the Autoscaler plans with unless
  // --capacity-rps says otherwise.
  if (opt_.warmup_rounds > 0) {
    const std::vector<std::string> samples = {"a warm-up text of a few words",
                                              "another, longer warm-up text: "
                                              "it reads like a short review"};
    tb::WarmupConfig wc;
    wc.rounds = opt_.warmup_rounds;
    for (std::size_t size = 1; size <= opt_.max_batch; ++size) wc.sizes.push_back(size);
    const tb::WarmupReport classify =
        tb::warmup(*pipeline_, std::span<const std::string>(samples), wc);
    const tb::WarmupReport embed =
        tb::warmup(*embed_pipeline_, std::span<const std::string>(samples), wc);
    if (!classify.ok() || !embed.ok()) {
      std::fprintf(stderr, "tailbatch-serve: warm-up incomplete (%s); serving anyway\n",
                   (!classify.ok() ? classify.first_error : embed.first_error).c_str());
    }
    tb::WarmupConfig timed;
    timed.sizes = {opt_.max_batch};
    timed.rounds = opt_.warmup_rounds;
    const tb::WarmupReport full =
        tb::warmup(*pipeline_, std::span<const std::string>(samples), timed);
    const double s = std::chrono::duration<double>(full.elapsed).count();
    if (full.ok() && s > 0.0) measured_capacity_rps_ = static_cast<double>(full.requests) / s;
    // The generator: a few steps over a full decode batch.
    std::vector<std::shared_ptr<Batcher::Stream>> streams;
    for (std::size_t i = 0; i < opt_.gen_max_active; ++i) {
      Batcher::Request r;
      vocab_.encode(samples[i % samples.size()], r.prompt);
      r.max_new_tokens = 4;
      r.state = text_generator_.new_state({}, i);
      streams.push_back(batcher_->submit(std::move(r)));
    }
    for (auto& st : streams) (void)st->wait_end();
  }
  admission_.set_warming(false);
  readiness_.set_ready(true);
  std::fprintf(stderr, "tailbatch-serve: warmed up (batch sizes 1..%zu, %u rounds each); ready\n",
               opt_.max_batch, opt_.warmup_rounds);
}

void Server::begin_drain() {
  if (draining_.exchange(true)) return;
  std::fprintf(stderr, "tailbatch-serve: draining (up to %u ms)\n", opt_.drain_timeout_ms);
  beast::error_code ignored;
  acceptor_.close(ignored);
  autoscale_timer_.cancel();  // on accept_strand_, like the timer's handler
  littles_timer_.cancel();
  accept_timer_.cancel();
  drain_thread_ = std::thread([this] {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.drain_timeout_ms) + 1s;
    // Queued and running work finishes (or is answered shutting_down) within the drain timeout.
    std::thread p([this] { pipeline_->shutdown(); });
    std::thread e([this] { embed_pipeline_->shutdown(); });
    batcher_->shutdown();
    p.join();
    e.join();
    // Responses being written.
    while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(2ms);
    // Idle keep-alive connections close now, busy ones after their response.
    std::vector<std::shared_ptr<Connection>> live;
    {
      std::lock_guard lock(conns_mu_);
      for (auto& w : conns_) {
        if (auto c = w.lock()) live.push_back(std::move(c));
      }
    }
    for (auto& c : live) asio::post(c->executor(), [c] { c->drain(); });
    live.clear();
    while (connections_.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(2ms);
    ioc_.stop();
  });
}

// SIGTERM, SIGINT and SIGHUP drain; a second one while draining exits at once.
void Server::wait_signal() {
  signals_.async_wait([this](beast::error_code ec, int sig) {
    if (ec) return;
    if (draining()) {
      std::fprintf(stderr, "tailbatch-serve: signal %d while draining: exiting now\n", sig);
      std::fflush(stderr);
      std::_Exit(1);
    }
    begin_drain();
    wait_signal();
  });
}

// On accept_strand_: the classify Pipeline's Little's-law check over the interval since the
// last one; it sets tailbatch_pipeline_littles_law_deviation and
// tailbatch_pipeline_hidden_queue_suspected and logs a suspected hidden queue.
void Server::schedule_littles_law() {
  littles_timer_.expires_after(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(opt_.littles_law_interval_s)));
  littles_timer_.async_wait([this](beast::error_code ec) {
    if (ec || draining()) return;
    if (ready()) {
      (void)pipeline_->check_littles_law();
      littles_checks_->inc();
    }
    schedule_littles_law();
  });
}

void Server::schedule_autoscale() {
  const auto interval = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(opt_.autoscale_interval_s));
  autoscale_timer_.expires_after(interval);
  autoscale_timer_.async_wait([this](beast::error_code ec) {
    if (ec || draining() || autoscale_off_) return;  // cancelled by the drain
    autoscale_tick();
    if (!autoscale_off_) schedule_autoscale();
  });
}

// On accept_strand_. This replica's readings over the interval since the last tick: the
// arrival rate (every submit to the Pipeline, rejected ones included: demand the replica
// saw), the time-averaged queue depth and in-flight and the mean latency from the
// Pipeline's occupancy integrals (so the Little's-law check compares averages of one
// window), and the p95 of the classify route from the edge histogram (arrival to
// response, --stats-window-s). Nothing is evaluated before the replica is ready: the
// warm-up's batches are not load.
void Server::autoscale_tick() {
  const tb::PipelineOccupancy occ = pipeline_->occupancy();
  const std::uint64_t submitted = pipeline_->stats().submitted;
  const auto restart = [&] {
    autoscale_last_ = occ;
    autoscale_last_submitted_ = submitted;
  };
  if (!ready()) return restart();
  try {
    if (!autoscaler_) {
      tb::AutoscalerConfig ac;
      ac.capacity_rps = opt_.capacity_rps > 0.0 ? opt_.capacity_rps : measured_capacity_rps_;
      if (!(std::isfinite(ac.capacity_rps) && ac.capacity_rps > 0.0)) {
        std::fprintf(stderr,
                     "tailbatch-serve: no capacity measured in the warm-up; the Autoscaler is off "
                     "(set --capacity-rps)\n");
        autoscale_off_ = true;
        return;
      }
      ac.slo_p95 = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double, std::milli>(opt_.slo_p95_ms));
      ac.max_replicas = std::max(ac.max_replicas, opt_.replicas);
      // HPA's stabilisation windows stay (they only compare recommendations), its rate
      // limits go: they count the replicas added or removed within a period against the
      // count passed in, and this replica's view of the fleet (--replicas) does not follow
      // what the orchestrator did. The HPA or KEDA object that follows this gauge applies
      // them to the replicas really running (deploy/kubernetes/).
      ac.behavior.scale_up.policies.clear();
      ac.behavior.scale_down.policies.clear();
      ac.metrics = &registry_;
      ac.metric_labels = {{"pipeline", "classify"}};
      autoscaler_ = std::make_unique<tb::Autoscaler>(ac);
      std::fprintf(
          stderr,
          "tailbatch-serve: autoscaler every %g s, capacity %.0f requests/s per replica (%s), "
          "%d replica(s), p95 SLO %g ms\n",
          opt_.autoscale_interval_s, ac.capacity_rps,
          opt_.capacity_rps > 0.0 ? "--capacity-rps" : "measured in the warm-up", opt_.replicas,
          opt_.slo_p95_ms);
      return restart();
    }
    if (!autoscale_last_) return restart();
    const tb::OccupancyWindow w = tb::occupancy_between(*autoscale_last_, occ);
    const double seconds = std::chrono::duration<double>(w.window).count();
    if (!(seconds > 0.0)) return;
    tb::ReplicaSignals mine;
    const std::uint64_t arrived =
        submitted >= autoscale_last_submitted_ ? submitted - autoscale_last_submitted_ : 0;
    mine.arrival_rps = static_cast<double>(arrived) / seconds;
    mine.queue_depth = w.mean_queued;
    mine.in_flight = w.mean_executing;
    mine.mean_latency = w.mean_latency;
    const tb::HistogramSnapshot recent = classify_latency_->snapshot();
    if (recent.count() > 0) mine.p95 = recent.percentile(95);
    restart();
    // The fleet as this replica sees it: --replicas replicas, each loaded like this one
    // (a load balancer spreads requests evenly), so that the decision is for the fleet.
    const std::vector<tb::ReplicaSignals> fleet(static_cast<std::size_t>(opt_.replicas), mine);
    (void)autoscaler_->evaluate(std::chrono::steady_clock::now(), opt_.replicas, fleet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tailbatch-serve: autoscaler evaluation failed: %s\n", e.what());
  }
}

int Server::run() {
  const auto address = asio::ip::make_address(opt_.host);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(opt_.port));
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(asio::socket_base::reuse_address(true));
  acceptor_.bind(endpoint);
  acceptor_.listen(opt_.backlog);
  const auto bound = acceptor_.local_endpoint();
  loopback_bind_ = address.is_loopback();
  // Bound beyond this machine without a key: anyone who reaches the port may use it; say so.
  const bool open = !loopback_bind_ && opt_.api_key.empty();
  std::printf("listening on %s:%u%s\n", bound.address().to_string().c_str(),
              static_cast<unsigned>(bound.port()),
              open ? " (open: no --api-key; anyone who reaches this address may call /v1/*)" : "");
  std::fflush(stdout);

  wait_signal();
  accept();
  if (opt_.littles_law_interval_s > 0.0)
    asio::dispatch(accept_strand_, [this] { schedule_littles_law(); });
  warmup_thread_ = std::thread([this] { warm_up(); });
  if (opt_.autoscale_interval_s > 0.0)
    asio::dispatch(accept_strand_, [this] { schedule_autoscale(); });

  std::vector<std::thread> io;
  for (unsigned i = 1; i < opt_.io_threads; ++i) io.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (auto& t : io) t.join();
  if (drain_thread_.joinable()) drain_thread_.join();
  if (warmup_thread_.joinable()) warmup_thread_.join();
  std::fprintf(stderr, "tailbatch-serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tailbatch-serve: the reference classifier and generator behind tailbatch, over HTTP.\n"
      "Threads: --io-threads I/O threads (the main thread is one) own the sockets and never wait "
      "for a\n"
      "result; the Pipeline owns --lanes worker threads that form batches and run the classifier; "
      "the\n"
      "ContinuousBatcher owns one decode thread for the generator; a warm-up thread runs until "
      "ready.\n"
      "Prints 'listening on HOST:PORT' as its first line on stdout. SIGTERM drains and exits 0.",
      "tailbatch-serve"};
  app.add_option("--host", o.host, "Address to bind")->capture_default_str();
  app.add_option("--port", o.port, "Port to bind; 0 picks a free one")->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "I/O threads (sockets, parsing, responses)")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  app.add_option("--backlog", o.backlog,
                 "listen() backlog (the kernel caps it at net.core.somaxconn)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-body-bytes", o.max_body_bytes, "Largest request body; larger ones get 413")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", o.idle_timeout_ms,
                 "Close a keep-alive connection idle this long")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  app.add_option("--max-batch", o.max_batch, "Largest classify batch (1: batching off)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str();
  app.add_option("--window-us", o.window_us,
                 "Longest a classify batch waits to fill, in microseconds")
      ->capture_default_str();
  app.add_option("--lanes", o.lanes,
                 "Host lanes for the classifier (one Pipeline worker thread each)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{256}))
      ->capture_default_str();
  app.add_option("--queue-capacity", o.queue_capacity,
                 "Classify requests that may wait; more get 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 24))
      ->capture_default_str();
  app.add_option(
         "--limit", o.limit,
         "ConcurrencyLimiter limit on classify requests admitted; beyond it 503 overloaded. "
         "0 admits none (sheds all classify load)")
      ->capture_default_str();
  app.add_option("--default-timeout-ms", o.default_timeout_ms,
                 "Deadline for requests without an X-Request-Timeout-Ms header (0: none)")
      ->capture_default_str();
  app.add_option("--warmup-rounds", o.warmup_rounds,
                 "Warm-up batches of each size before /readyz says ready")
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms,
                 "On SIGTERM, how long in-flight work may take to finish")
      ->capture_default_str();
  app.add_option("--slo-p95-ms", o.slo_p95_ms,
                 "The p95 latency SLO, ms: drawn on /dashboard, in /v1/stats, and the Autoscaler's "
                 "latency trigger "
                 "(a p95 at 80 % of it asks for one more replica)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option(
         "--autoscale-interval-s", o.autoscale_interval_s,
         "Evaluate the Autoscaler this often (seconds, fractions allowed) and export its decision, "
         "tailbatch_autoscaler_desired_replicas, and its inputs on /metrics; 0: off")
      ->check(CLI::Range(0.0, 3600.0))
      ->check(CLI::Validator(
          [](const std::string& v) -> std::string {
            const double s = std::strtod(v.c_str(), nullptr);
            return s == 0.0 || s >= 0.01 ? std::string() : "must be 0 (off) or at least 0.01";
          },
          "0 or >= 0.01"))
      ->capture_default_str();
  app.add_option("--capacity-rps", o.capacity_rps,
                 "Classify requests per second one replica serves within its SLO (tailbatch-plan's "
                 "instance_rps, or "
                 "tailbatch-load --url's saturation point); the Autoscaler plans 70 % of it. 0: "
                 "the warm-up's fastest "
                 "full batch times the lanes, an upper bound from the model alone")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--replicas", o.replicas,
                 "Replicas the fleet runs, as this replica sees it: the Autoscaler decides for "
                 "that many replicas "
                 "each loaded like this one")
      ->envname("TAILBATCH_REPLICAS")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--stats-window-s", o.stats_window_s,
                 "Window of the latency percentiles in /v1/stats and /metrics")
      ->check(CLI::Range(1u, 3600u))
      ->capture_default_str();
  app.add_option("--gen-max-active", o.gen_max_active, "Sequences decoded together")
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
      ->capture_default_str();
  app.add_option("--gen-max-waiting", o.gen_queue_capacity,
                 "Generate requests that may wait; more get 503 queue_full")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--gen-max-tokens", o.gen_max_tokens,
                 "Largest max_tokens a generate request may ask for")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option(
         "--gen-token-budget", o.gen_token_budget,
         "Tokens the active sequences may reserve (prompt + max_tokens each); a request that alone "
         "exceeds it gets 413")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--gen-max-prompt-tokens", o.gen_max_prompt_tokens,
                 "Longest prompt, in tokens, a generation may have; longer ones get 400 "
                 "context_length_exceeded")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--api-key", o.api_key,
                 "Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise); /healthz, /readyz, "
                 "/metrics, "
                 "/dashboard stay open. Without a key the server is open")
      ->envname("TAILBATCH_API_KEY");
  app.add_option("--sse-keepalive-ms", o.sse_keepalive_ms,
                 "Send a ': keep-alive' comment on an event stream idle this long; 0: never")
      ->capture_default_str();
  app.add_option("--littles-law-interval-s", o.littles_law_interval_s,
                 "Run the classify Pipeline's Little's-law check this often "
                 "(tailbatch_pipeline_hidden_queue_suspected); "
                 "0: off")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_flag("--access-log", o.access_log,
               "One stderr line per response (request id, route, status, ms); "
               "error responses are logged always");
  app.add_option("--max-connections", o.max_connections,
                 "Open client connections at most; further ones wait in the listen backlog")
      ->check(CLI::Range(1u, 1'000'000u))
      ->capture_default_str();
  app.add_option(
         "--write-timeout-ms", o.write_timeout_ms,
         "Close a connection whose response (or stream chunk) is not written within this long")
      ->check(CLI::Range(1u, 3'600'000u))
      ->capture_default_str();
  app.add_option(
         "--decode-delay-ms", o.decode_delay_ms,
         "Testing and demos: every decode step takes this much longer, as a slower model would")
      ->capture_default_str();
  app.add_option("--fail-on-text", o.fail_on_text,
                 "Testing: a classify batch holding exactly this text throws in the model (500 for "
                 "its requests)");
  app.add_option(
         "--model-delay-ms", o.model_delay_ms,
         "Testing and demos: every classify batch takes this much longer, as a slower model would")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    Server server(o);
    return server.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tailbatch-serve: %s\n", e.what());
    return 1;
  }
}
