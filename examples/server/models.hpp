// tailbatch-serve, model set-up: the classifier Pipeline, the generator's ContinuousBatcher, the
// embedder Pipeline, the metrics (models.hpp). One of the parts tailbatch_serve.cpp includes, in
// this order: options.hpp, server.hpp, connection.hpp, models.hpp, classic_routes.hpp,
// openai_routes.hpp; not a header to include elsewhere.
#pragma once

namespace tailbatch_serve {

// ---- Server ---------------------------------------------------------------------------

ref::ClassifierConfig classifier_config() { return ref::ClassifierConfig{}; }

// The classify limiter: --limit N's static limit, or (no --limit) the SLO's (SloLimit).
std::unique_ptr<ServerAdmission::Limiter> make_limiter(const Options& o,
                                                       tb::MetricsRegistry& registry,
                                                       std::shared_ptr<const SloInputs> inputs) {
  if (!o.limit_from_slo && o.limit == 0) return nullptr;
  tb::ConcurrencyLimiterConfig lo;
  lo.queue_capacity = 0;
  lo.metrics = &registry;
  lo.metric_labels = {{"route", "classify"}};
  const std::size_t batch_slots = o.max_batch * o.lanes;
  // At most what the queue holds and the lanes run (the queue refuses first then).
  const auto floor = static_cast<std::uint32_t>(std::min<std::size_t>(2 * batch_slots, 1u << 20));
  const auto ceiling = static_cast<std::uint32_t>(
      std::min<std::size_t>(o.queue_capacity + 2 * batch_slots, tb::kMaxConcurrencyLimit));
  return std::make_unique<ServerAdmission::Limiter>(
      SloLimit(std::move(inputs), floor, ceiling,
               o.limit_from_slo ? std::nullopt : std::optional<std::uint32_t>(o.limit)),
      lo);
}

// The classify requests' wait budget when the client sets none: --default-timeout-ms, or
// from the SLO. A request that starts by its deadline still has its batch to run and its
// answer to write: the budget is the target less four full batches' time (the warm-up's
// measurement, batch_time: a lane busy with the batch before, the request's own, and as
// much again for the I/O thread and a loaded machine), at least two batches' time; 75 % of
// the target while no batch has been timed.
std::chrono::nanoseconds classify_wait_budget(const Options& o,
                                              std::chrono::nanoseconds batch_time) {
  const auto target = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double, std::milli>(o.slo_p95_ms));
  if (batch_time <= std::chrono::nanoseconds::zero()) return target * 3 / 4;
  return std::max(target - 4 * batch_time, 2 * batch_time);
}

// --api-keys FILE: one "KEY TENANT [WEIGHT [MAX_IN_FLIGHT]]" per line, '#' to the end of a
// line a comment, blank lines skipped. Fills keys (each key once) and tenants (a tenant's
// weight and quota, each tenant once; a tenant named on several lines must say the same).
// Throws std::runtime_error naming the file and line for what it cannot read.
void load_api_keys(const Options& o, tb::TenantNames& names, tb::TenantsConfig& tenants,
                   std::vector<std::pair<std::string, tb::TenantId>>& keys) {
  std::ifstream in(o.api_keys_file);
  if (!in) throw std::runtime_error("--api-keys: cannot read " + o.api_keys_file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto where = [&] {
      return "--api-keys: " + o.api_keys_file + ":" + std::to_string(n) + ": ";
    };
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    std::string key, tenant, extra;
    if (!(fields >> key)) continue;
    tb::TenantQuota q = tenants.defaults;
    if (!(fields >> tenant))
      throw std::runtime_error(where() + "expected KEY TENANT [WEIGHT [MAX_IN_FLIGHT]]");
    if (tenant != tailbatch_serve::loggable(tenant))
      throw std::runtime_error(where() + "a tenant is 1 to 64 visible ASCII characters");
    if (fields >> extra) {
      char* end = nullptr;
      q.weight = std::strtod(extra.c_str(), &end);
      if (end == extra.c_str() || *end != '\0' || !std::isfinite(q.weight) || !(q.weight > 0.0))
        throw std::runtime_error(where() + "the weight must be a number > 0, got " + extra);
      if (fields >> extra) {
        q.max_in_flight = static_cast<std::size_t>(std::strtoull(extra.c_str(), &end, 10));
        if (end == extra.c_str() || *end != '\0' || extra.front() == '-')
          throw std::runtime_error(where() + "MAX_IN_FLIGHT must be a whole number, got " + extra);
      }
    }
    if (fields >> extra) throw std::runtime_error(where() + "more than four fields");
    for (const auto& k : keys) {
      if (k.first == key) throw std::runtime_error(where() + "this key is listed twice");
    }
    const tb::TenantId id = names.id(tenant);
    if (id == names.other_id()) throw std::runtime_error(where() + "too many tenants");
    bool listed = false;
    for (const auto& [t, quota] : tenants.tenants) {
      if (t != id) continue;
      listed = true;
      if (quota.weight != q.weight || quota.max_in_flight != q.max_in_flight)
        throw std::runtime_error(where() + "tenant " + tenant +
                                 " was given another weight or quota");
    }
    if (!listed) tenants.tenants.emplace_back(id, q);
    keys.emplace_back(key, id);
  }
  if (keys.empty()) throw std::runtime_error("--api-keys: " + o.api_keys_file + " holds no key");
}

// Testing and demos: --model-delay-ms makes every classify batch slower, --fail-on-text
// makes a batch holding exactly that text throw. Wrapped around the model callable.
ClassifyPipeline::Model with_test_switches(ClassifyPipeline::Model inner, const Options& o) {
  return [inner = std::move(inner), delay = std::chrono::milliseconds(o.model_delay_ms),
          fail = o.fail_on_text](std::span<const std::string> texts, std::span<ref::Prediction> out,
                                 tb::HostLanes::Lane& lane) {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (!fail.empty() && std::find(texts.begin(), texts.end(), fail) != texts.end())
      throw std::runtime_error("the model refused a text (--fail-on-text)");
    inner(texts, out, lane);
  };
}

// The registry's histograms get a bucket bound at the SLO, so that a rule reading
// le="0.15" for --slo-p95-ms=150 (deploy/prometheus/) reads an exact bucket.
tb::MetricsRegistryConfig metrics_config(const Options& o) {
  tb::MetricsRegistryConfig c;
  c.buckets.extra_boundaries_seconds = {o.slo_p95_ms / 1000.0};
  return c;
}

// The reference embedder: the classifier's embedding table as a model of its own, behind a
// second Pipeline so that the inputs of many clients batch together. An input's vector is the
// mean of its tokens' rows (the classifier's first stage), L2-normalised.
void Server::make_reference_embedder() {
  embed_model_id_ = embedder_model_id;
  embed_dim_ = classifier_.config().embed_dim;
  embed_max_tokens_ = classifier_.config().max_tokens;
  tb::PipelineConfig<std::string> ec;
  ec.queue_capacity = opt_.queue_capacity;
  ec.drain_timeout = std::chrono::milliseconds(opt_.drain_timeout_ms);
  ec.metrics = &registry_;
  ec.metric_labels = {{"pipeline", "embed"}};
  ec.tenants = tenants_;
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
      tb::FixedWindow(opt_.max_batch, std::chrono::microseconds(opt_.window_us)), ec);
}

// --embed-model libtorch: examples/libtorch's encoder (a transformer encoder written with
// torch::nn) behind a Pipeline of its own, as in that example: inputs tokenized before
// submit, their token count their cost, batched by a TokenBudget with length buckets, run
// on one TorchLane (libtorch's intra-op threads: all the cores). Throws std::runtime_error,
// naming the file, when the weights cannot be loaded.
void Server::make_libtorch_embedder() {
#ifdef TAILBATCH_SERVE_LIBTORCH
  namespace tl = tailbatch_libtorch;
  torch_lanes_ = std::make_unique<tl::TorchLanes>(1, opt_.embed_weights);
  (void)tl::set_intra_op_threads(1);
  const tl::EncoderConfig c = torch_lanes_->lane(0).module()->config;
  torch_tokenizer_.emplace(c);
  embed_model_id_ = libtorch_embedder_model_id;
  embed_dim_ = static_cast<std::size_t>(c.d_model);
  embed_max_tokens_ = static_cast<std::size_t>(c.max_tokens - 1);  // [CLS] takes one
  embed_counter_.emplace(
      ref::TokenizerConfig{.vocab_size = static_cast<std::uint32_t>(c.vocab_size - 2),
                           .max_tokens = embed_max_tokens_ + 1});
  tb::PipelineConfig<tl::TokenizedText> ec = tl::encoder_pipeline_config(opt_.queue_capacity);
  ec.drain_timeout = std::chrono::milliseconds(opt_.drain_timeout_ms);
  ec.tenants = tenants_;
  ec.metrics = &registry_;
  ec.metric_labels = {{"pipeline", "embed"}};
  torch_embed_ = std::make_unique<tl::EncoderPipeline>(
      tl::EncoderModel{},
      tl::encoder_policy(opt_.max_batch, std::chrono::microseconds(opt_.window_us)), ec,
      *torch_lanes_);
#else
  throw std::runtime_error("--embed-model libtorch: this build has no libtorch");
#endif
}

Server::Server(const Options& o)
    : opt_(o),
      registry_(metrics_config(o)),
      classifier_(classifier_config()),
      classifier_model_(classifier_),
      text_generator_(generator_),
      lanes_(o.lanes),
      limiter_(make_limiter(o, registry_, slo_inputs_)),
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
  // Tenants: the scheduling, the default quota, the keys file's tenants.
  tenants_.scheduling = *tb::parse_scheduling(o.scheduling);
  tenants_.defaults.max_in_flight = o.tenant_max_in_flight;
  // The per-tenant series are labelled with the tenants' names ("" is the default tenant).
  tenants_.tenant_name = [names = &tenant_names_](tb::TenantId id) {
    std::string n = names->name(id);
    return n.empty() ? std::string("default") : n;
  };
  if (!o.api_keys_file.empty()) {
    std::vector<std::pair<std::string, tb::TenantId>> keys;
    load_api_keys(o, tenant_names_, tenants_, keys);
    for (auto& [key, id] : keys) tenant_keys_.push_back(TenantKey{std::move(key), id});
  }
  tb::PipelineConfig<std::string> pc;
  pc.queue_capacity = o.queue_capacity;
  pc.tenants = tenants_;
  pc.queue.policy = *tb::parse_queue_policy(o.queue_policy);
  // The standing-queue shedding of adaptive-lifo and codel scaled to the SLO: folly's 5 ms
  // suits RPCs of a few ms; a 100 ms target would shed requests it could still answer in
  // time (under wrk -c512 the 2xx/s fell to 0.75x that of 64 connections with 5 ms).
  const double codel_ms = o.codel_target_ms > 0 ? o.codel_target_ms : std::min(o.slo_p95_ms / 10.0, 50.0);
  pc.queue.codel_target = std::chrono::duration_cast<tb::BatchDuration>(
      std::chrono::duration<double, std::milli>(codel_ms));
  pc.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  pc.check_admission_limit = false;  // a small --limit is how tests force rejections
  pc.metrics = &registry_;
  pc.metric_labels = {{"pipeline", "classify"}};
  // The model callable is the classifier and the batch-size count, nothing else. The
  // test switches (--model-delay-ms, --fail-on-text) wrap it from outside, only when set.
  ClassifyPipeline::Model model = [this](std::span<const std::string> texts,
                                         std::span<ref::Prediction> out,
                                         tb::HostLanes::Lane& lane) {
    const std::size_t n = texts.size();
    if (n >= 1 && n <= batch_sizes_.size())
      batch_sizes_[n - 1].fetch_add(1, std::memory_order_relaxed);
    classifier_model_(texts, out, lane);
  };
  if (opt_.model_delay_ms > 0 || !opt_.fail_on_text.empty())
    model = with_test_switches(std::move(model), opt_);
  pipeline_ = std::make_unique<ClassifyPipeline>(
      model, tb::FixedWindow(o.max_batch, std::chrono::microseconds(o.window_us)), pc, lanes_,
      admission_);
  slo_inputs_->drain_rate = [p = pipeline_.get()] { return p->drain_rate_approx(); };
  const std::chrono::nanoseconds wait =
      o.default_timeout_from_slo || o.default_timeout_ms == 0
          ? classify_wait_budget(o, {})
          : std::chrono::nanoseconds(std::chrono::milliseconds(o.default_timeout_ms));
  slo_inputs_->wait_budget_ns.store(wait.count(), std::memory_order_relaxed);

  tb::ContinuousBatcherConfig bc;
  bc.max_active = o.gen_max_active;
  bc.queue_capacity = o.gen_queue_capacity;
  bc.token_budget = o.gen_token_budget;
  bc.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  bc.metrics = &registry_;
  bc.metric_labels = {{"model", "generate"}};
  bc.tenants = tenants_;
  bc.workers = 1;  // the decode thread, started here; it waits for work until run() accepts
  if (o.kv_blocks > 0) {
    bc.kv.mode = o.kv_mode == "reserve" ? tb::KvMode::reserve : tb::KvMode::grow;
    bc.kv.total_blocks = o.kv_blocks;
    bc.kv.block_size = o.kv_block_size;
    bc.kv.watermark_blocks = o.kv_blocks / 100;  // vLLM's 1 %
    kv_store_ = std::make_unique<ref::GeneratorKvStore>(o.kv_blocks, o.kv_block_size,
                                                        generator_.config().hidden_dim);
  }
  batcher_ = std::make_unique<Batcher>(
      [this](std::span<Batcher::Sequence> batch) {
        std::size_t emitting = 0;
        for (const auto& s : batch) emitting += s.emits() ? 1 : 0;
        if (opt_.decode_delay_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(opt_.decode_delay_ms));
        if (kv_store_) {
          text_generator_.step_sequences(batch, *kv_store_);
        } else {
          text_generator_.step_sequences(batch);
        }
        token_rate_.add(emitting, std::chrono::steady_clock::now());
        const std::size_t n = batch.size();
        if (n >= 1 && n <= decode_batch_sizes_.size())
          decode_batch_sizes_[n - 1].fetch_add(1, std::memory_order_relaxed);
      },
      bc);

  // The embedder (--embed-model): the libtorch encoder, or the reference one below.
  if (o.embed_model == "libtorch") {
    make_libtorch_embedder();
  } else {
    make_reference_embedder();
  }

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

}  // namespace tailbatch_serve
