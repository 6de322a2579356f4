// tailbatch-serve, the Server: what the connections share, the Pipelines, the batcher, the metrics
// (server.hpp). One of the parts tailbatch_serve.cpp includes, in this order: options.hpp,
// server.hpp, connection.hpp, models.hpp, classic_routes.hpp, openai_routes.hpp; not a header to
// include elsewhere.
#pragma once

namespace tailbatch_serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace tb = tailbatch;
namespace ref = tailbatch::reference;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;
using namespace std::chrono_literals;

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

// What the classify admission reads from the rest of the server: the wait a request may
// spend queued (its default deadline's budget) and the Pipeline's drain rate. Written at
// start-up and by the warm-up thread, read by the limit algorithm. Thread-safe.
struct SloInputs {
  std::atomic<std::int64_t> wait_budget_ns{0};
  std::function<double()> drain_rate;  // requests/s; set once, before any request
};

// The classify limit. With --limit N, N. Otherwise it comes from the SLO by Little's law: the
// Pipeline serves drain rate x wait budget requests within the wait a request may spend
// queued (its default deadline), and admits queue_budgets times that, queued and running
// together; beyond it a request is refused at once, 503 overloaded. Why more than one budget's
// worth: under a closed loop (each client sends again as soon as it is answered) a refusal at
// the door comes straight back, and the retries take the processor from the model (measured
// in docs/performance.md: 0.8x the goodput with one budget's worth); an admitted request that
// cannot start by its deadline leaves the queue unexecuted at its deadline (504), which paces
// such a client at one answer per budget, and what is served is still served within the
// target. At least two full batches per lane slot, so that batches always fill; recomputed
// once per sample window (50 ms). Copyable; not thread-safe (owned by one limiter).
class SloLimit {
 public:
  static constexpr bool learns = true;
  static constexpr double queue_budgets = 4.0;
  SloLimit(std::shared_ptr<const SloInputs> inputs, std::uint32_t floor, std::uint32_t ceiling,
           std::optional<std::uint32_t> fixed)
      : inputs_(std::move(inputs)),
        floor_(std::max<std::uint32_t>(1, floor)),
        ceiling_(std::max(floor_, ceiling)),
        fixed_(fixed),
        limit_(fixed ? *fixed : ceiling_) {}  // until measured, the queue's capacity bounds it

  [[nodiscard]] std::uint32_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return fixed_ ? *fixed_ : ceiling_; }
  [[nodiscard]] tb::WindowSpec next_window() const noexcept {
    return {std::chrono::milliseconds(50), 1, false};
  }
  std::uint32_t on_window(const tb::LimitWindow&) noexcept {
    if (fixed_) return limit_;
    double rate = 0.0;
    if (inputs_->drain_rate) rate = inputs_->drain_rate();
    const double budget_s =
        static_cast<double>(inputs_->wait_budget_ns.load(std::memory_order_relaxed)) / 1e9;
    const double want = rate * budget_s * queue_budgets;
    limit_ = static_cast<std::uint32_t>(std::clamp(std::isfinite(want) ? want : 0.0,
                                                   static_cast<double>(floor_),
                                                   static_cast<double>(ceiling_)));
    return limit_;
  }

 private:
  std::shared_ptr<const SloInputs> inputs_;
  std::uint32_t floor_, ceiling_;
  std::optional<std::uint32_t> fixed_;
  std::uint32_t limit_;
};

// The Pipeline's admission stage: the ConcurrencyLimiter, or (--limit 0) nobody. Warm-up
// batches pass without a permit, so that warming up works whatever the limit.
class ServerAdmission {
 public:
  using Limiter = tb::ConcurrencyLimiter<SloLimit>;
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
  void make_reference_embedder();
  void make_libtorch_embedder();
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
  // Whether the request may use /v1/*: no key is configured, or its bearer token is
  // --api-key's or one of --api-keys' (whose tenant it notes in the connection's context).
  [[nodiscard]] bool authorize(const std::shared_ptr<Connection>& c,
                               const http::request<http::string_body>& req);
  // The tenant a request is served for: its API key's (--api-keys), else its OpenAI `user`
  // field's, else (--tenant-header) its X-Tenant header's, else the default tenant 0. Names
  // are interned (TenantNames: at most its capacity get an id of their own).
  [[nodiscard]] tb::TenantId tenant_of(const std::shared_ptr<Connection>& c,
                                       const http::request<http::string_body>& req,
                                       std::string_view user = {});
  // The generation's end bound from X-Request-Timeout-Ms (none without the header).
  SteadyTime completion_deadline_of(const http::request<http::string_body>& req,
                                    SteadyTime arrival) const;
  std::string stats_json();
  // A request's deadline: its X-Request-Timeout-Ms, else the default (classify: from the
  // SLO unless --default-timeout-ms; others: --default-timeout-ms). Answers 400 and returns
  // nullopt for a malformed header.
  std::optional<SteadyTime> deadline_of(const std::shared_ptr<Connection>& c,
                                        const http::request<http::string_body>& req,
                                        bool classify = false);
  // Classify's default wait budget (see deadline_of).
  [[nodiscard]] std::chrono::nanoseconds classify_default_budget() const noexcept;

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
  // Tenants: the keys of --api-keys with their tenants, the interned names, and the
  // TenantsConfig every front door is built with (weights and quotas).
  struct TenantKey {
    std::string key;
    tb::TenantId tenant = 0;
  };
  std::vector<TenantKey> tenant_keys_;
  tb::TenantNames tenant_names_;
  tb::TenantsConfig tenants_;
  // The classify deadline's budget and the drain rate, for the limiter's SloLimit.
  std::shared_ptr<SloInputs> slo_inputs_ = std::make_shared<SloInputs>();
  std::unique_ptr<ServerAdmission::Limiter> limiter_;  // null with --limit 0
  ServerAdmission admission_;
  std::unique_ptr<ClassifyPipeline> pipeline_;
  std::unique_ptr<ref::GeneratorKvStore> kv_store_;  // --kv-blocks: the generator's KV cache
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<EmbedPipeline> embed_pipeline_;  // null with --embed-model libtorch
#ifdef TAILBATCH_SERVE_LIBTORCH
  // --embed-model libtorch: the encoder's lanes (each its own module, loaded from
  // --embed-weights) and its Pipeline; both null otherwise. The lanes outlive the Pipeline.
  std::unique_ptr<tailbatch_libtorch::TorchLanes> torch_lanes_;
  std::unique_ptr<tailbatch_libtorch::EncoderPipeline> torch_embed_;
  std::optional<tailbatch_libtorch::TextTokenizer> torch_tokenizer_;
#endif
  std::string_view embed_model_id_ = embedder_model_id;  // what /v1/models lists
  std::size_t embed_dim_ = 0;                            // an embedding's length
  std::size_t embed_max_tokens_ = 0;             // longer inputs get 400 context_length_exceeded
  std::optional<ref::Tokenizer> embed_counter_;  // counts an input's tokens (to max + 1)
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
  std::uint64_t autoscale_last_rejected_ = 0;
  bool autoscale_off_ = false;
  bool loopback_bind_ = false;  // bound to a loopback address: the Host header is checked
  // Requests per second one lane ran in the warm-up's fastest full batch, times the lanes;
  // written by the warm-up thread before readiness_ (release), read after it (acquire).
  double measured_capacity_rps_ = 0.0;
};

}  // namespace tailbatch_serve
