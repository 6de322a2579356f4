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
// The parts, by role: options.hpp (flags), server.hpp (what the connections share),
// connection.hpp (one HTTP connection and its SSE writer), models.hpp (model set-up),
// classic_routes.hpp (routing, /v1/classify, /v1/generate, stats and probes),
// openai_routes.hpp (the OpenAI API; openai_protocol.hpp decodes its bodies); this file is
// start-up: accepting, warm-up and readiness, signals and the drain, the periodic checks.
// examples/minimal_server.cpp is the one-route version to read first.
//
// docs/serving.md describes the status mapping, the headers, draining and readiness;
// docs/openai-api.md the OpenAI routes.
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/generator.hpp>
#include <tailbatch/reference/sampler.hpp>
#include <tailbatch/reference/text.hpp>
#include <tailbatch/reference/tokenizer.hpp>
#include <tailbatch/serving.hpp>
#include <tailbatch/tenants.hpp>
#include <tailbatch/warmup.hpp>

#include "openai_protocol.hpp"
#include "request_decoding.hpp"

// Built with libtorch (examples/server.cmake, where find_package(Torch) succeeded):
// --embed-model libtorch serves /v1/embeddings from examples/libtorch's encoder.
#ifdef TAILBATCH_SERVE_LIBTORCH
#include "encoder_pipeline.hpp"
#endif

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
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

// The parts, in the order they build on each other.
// clang-format off
#include "options.hpp"
#include "server.hpp"
#include "connection.hpp"
#include "models.hpp"
#include "classic_routes.hpp"
#include "openai_routes.hpp"
// clang-format on

namespace tailbatch_serve {

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
    tb::WarmupReport embed;
    if (embed_pipeline_)
      embed = tb::warmup(*embed_pipeline_, std::span<const std::string>(samples), wc);
#ifdef TAILBATCH_SERVE_LIBTORCH
    if (torch_embed_) {
      std::vector<tailbatch_libtorch::TokenizedText> tokenized;
      for (const std::string& t : samples) tokenized.push_back((*torch_tokenizer_)(t));
      embed = tb::warmup(*torch_embed_,
                         std::span<const tailbatch_libtorch::TokenizedText>(tokenized), wc);
    }
#endif
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
    // The classify deadline's budget from the SLO, now that a full batch is timed.
    if (measured_capacity_rps_ > 0.0 && opt_.default_timeout_from_slo) {
      const double batch_s =
          static_cast<double>(opt_.max_batch * opt_.lanes) / measured_capacity_rps_;
      const auto budget =
          classify_wait_budget(opt_, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::duration<double>(batch_s)));
      slo_inputs_->wait_budget_ns.store(budget.count(), std::memory_order_relaxed);
    }
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
  if (opt_.default_timeout_from_slo || opt_.limit_from_slo) {
    std::fprintf(
        stderr,
        "tailbatch-serve: classify admission from the SLO (p95 %g ms): %s deadline %.1f ms, "
        "limit %s\n",
        opt_.slo_p95_ms, opt_.default_timeout_from_slo ? "default" : "--default-timeout-ms",
        std::chrono::duration<double, std::milli>(classify_default_budget()).count(),
        opt_.limit_from_slo ? "drain rate x deadline" : "--limit");
  }
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
    std::thread e([this] {
      if (embed_pipeline_) embed_pipeline_->shutdown();
#ifdef TAILBATCH_SERVE_LIBTORCH
      if (torch_embed_) torch_embed_->shutdown();
#endif
    });
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
  const auto counts = pipeline_->stats();
  const std::uint64_t submitted = counts.submitted;
  const std::uint64_t rejected = counts.count(tb::Status::rejected);
  const auto restart = [&] {
    autoscale_last_ = occ;
    autoscale_last_submitted_ = submitted;
    autoscale_last_rejected_ = rejected;
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
    // Refused at the door: demand, but never queued, so the Little's-law check leaves them out.
    const std::uint64_t refused =
        rejected >= autoscale_last_rejected_ ? std::min(rejected - autoscale_last_rejected_, arrived) : 0;
    mine.rejected_rps = static_cast<double>(refused) / seconds;
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
  const bool open = !loopback_bind_ && opt_.api_key.empty() && tenant_keys_.empty();
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

}  // namespace tailbatch_serve

int main(int argc, char** argv) {
  tailbatch_serve::Options o;
  if (const int rc = tailbatch_serve::parse_options(argc, argv, o); rc >= 0) return rc;
  std::signal(SIGPIPE, SIG_IGN);
  try {
    tailbatch_serve::Server server(o);
    return server.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tailbatch-serve: %s\n", e.what());
    return 1;
  }
}
