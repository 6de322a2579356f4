// tailbatch-serve, model set-up: the classifier Pipeline, the generator's ContinuousBatcher, the
// embedder Pipeline, the metrics (models.hpp). One of the parts tailbatch_serve.cpp includes, in
// this order: options.hpp, server.hpp, connection.hpp, models.hpp, classic_routes.hpp,
// openai_routes.hpp; not a header to include elsewhere.
#pragma once

namespace tailbatch_serve {

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

  tb::ContinuousBatcherConfig bc;
  bc.max_active = o.gen_max_active;
  bc.queue_capacity = o.gen_queue_capacity;
  bc.token_budget = o.gen_token_budget;
  bc.drain_timeout = std::chrono::milliseconds(o.drain_timeout_ms);
  bc.metrics = &registry_;
  bc.metric_labels = {{"model", "generate"}};
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
