// libtorch_encoder: a libtorch transformer encoder served through a tailbatch Pipeline.
//
// The weights file is made by the build (libtorch_make_weights, torch::save) and loaded
// here with torch::load, one module per lane. Texts are tokenized before submit, so that
// their length is their cost; a TokenBudget with length buckets forms the batches; each
// batch is one padded tensor with a src_key_padding_mask, run under torch::InferenceMode.
//
// It sets libtorch's intra-op threads from the lane count (warning when lanes x threads
// oversubscribe the cores), warms up through warmup() and Readiness and prints the first
// model call against the steady state, classifies a few texts, then serves a burst and
// prints what batching did. With --threads-table it measures the throughput of each lanes
// x threads layout instead (1 x 1, 1 x 2, 2 x 1, 2 x 2; docs/performance.md).
//
//   libtorch_encoder [--weights PATH] [--lanes 1] [--threads 0] [--requests 2000]
//   libtorch_encoder --threads-table [--requests 2000]
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <mutex>
#include <string>
#include <string_view>
#include <tailbatch/warmup.hpp>
#include <thread>
#include <vector>

#include "encoder_pipeline.hpp"

namespace tl = tailbatch_libtorch;
using namespace std::chrono;

namespace {

double ms(nanoseconds d) { return duration<double, std::milli>(d).count(); }

// Every model call's size and duration, in order.
struct CallLog {
  std::mutex mu;
  std::vector<std::pair<std::size_t, nanoseconds>> calls;
  tl::EncoderPipeline::Model wrap() {
    return [this](std::span<const tl::TokenizedText> in, std::span<tl::Encoding> out,
                  tl::TorchLane& lane) {
      const auto t0 = steady_clock::now();
      tl::EncoderModel{}(in, out, lane);
      const auto d = steady_clock::now() - t0;
      std::lock_guard lock(mu);
      calls.emplace_back(in.size(), duration_cast<nanoseconds>(d));
    };
  }
};

struct BurstResult {
  double requests_per_s = 0;
  double mean_batch = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  std::size_t ok = 0;
};

// n requests from two client threads at once, with callbacks; latency from each submit.
BurstResult burst(tl::EncoderPipeline& pipeline, const std::vector<tl::TokenizedText>& requests,
                  std::size_t n) {
  std::vector<nanoseconds> latency(n);
  std::atomic<std::size_t> done{0}, ok{0};
  const auto before = pipeline.stats();
  const auto t0 = steady_clock::now();
  std::vector<std::thread> clients;
  for (std::size_t c = 0; c < 2; ++c) {
    clients.emplace_back([&, c] {
      for (std::size_t i = c; i < n; i += 2) {
        const auto sent = steady_clock::now();
        pipeline.submit(requests[i % requests.size()],
                        [&, i, sent](tailbatch::Outcome<tl::Encoding>&& o) {
                          latency[i] = steady_clock::now() - sent;
                          if (o.ok()) ok.fetch_add(1, std::memory_order_relaxed);
                          done.fetch_add(1, std::memory_order_release);
                        });
      }
    });
  }
  for (auto& t : clients) t.join();
  while (done.load(std::memory_order_acquire) < n) std::this_thread::sleep_for(200us);
  const double seconds = duration<double>(steady_clock::now() - t0).count();
  const auto after = pipeline.stats();
  std::sort(latency.begin(), latency.end());
  BurstResult r;
  r.ok = ok.load();
  r.requests_per_s = static_cast<double>(n) / seconds;
  const auto batches = after.batches() - before.batches();
  r.mean_batch =
      batches ? static_cast<double>(after.batched_requests - before.batched_requests) / batches
              : 0.0;
  r.p50_ms = ms(latency[n / 2]);
  r.p99_ms = ms(latency[std::min(n - 1, n * 99 / 100)]);
  return r;
}

void print_line(std::string_view line) { fmt::print("{}\n", line); }

int threads_table(const std::string& weights, const std::vector<tl::TokenizedText>& requests,
                  std::size_t n) {
  fmt::print(
      "lanes x intra-op threads on {} cores, {} requests at once (TokenBudget, max_batch 32, 2 "
      "ms)\n",
      std::thread::hardware_concurrency(), n);
  fmt::print("  {:>5} {:>7} {:>14} {:>9} {:>10} {:>10}  {}\n", "lanes", "threads", "requests/s",
             "mean", "p50 ms", "p99 ms", "");
  const std::pair<std::size_t, std::size_t> layouts[] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}};
  for (const auto& [lanes_n, threads] : layouts) {
    tl::TorchLanes lanes(lanes_n, weights);
    const tl::ThreadPlan plan = tl::set_intra_op_threads(lanes_n, threads);
    tl::EncoderPipeline pipeline(tl::EncoderModel{}, tl::encoder_policy(),
                                 tl::encoder_pipeline_config(), lanes);
    (void)tailbatch::warmup(pipeline, std::span<const tl::TokenizedText>(requests.data(), 64));
    (void)burst(pipeline, requests, n / 4);  // settle
    const BurstResult r = burst(pipeline, requests, n);
    fmt::print("  {:>5} {:>7} {:>14.0f} {:>9.1f} {:>10.2f} {:>10.2f}  {}\n", lanes_n, threads,
               r.requests_per_s, r.mean_batch, r.p50_ms, r.p99_ms,
               plan.oversubscribed() ? "oversubscribed" : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"libtorch_encoder: a libtorch transformer encoder behind a tailbatch Pipeline"};
  std::string weights = TAILBATCH_LIBTORCH_WEIGHTS;
  std::size_t lanes_n = 1, threads = 0, requests_n = 2000;
  bool table = false;
  app.add_option("--weights", weights, "weights file (torch::save)")->capture_default_str();
  app.add_option("--lanes", lanes_n, "lanes (a module each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  app.add_option("--threads", threads, "intra-op threads per lane (0: cores / lanes)")
      ->capture_default_str();
  app.add_option("--requests", requests_n, "requests in the burst")
      ->capture_default_str()
      ->check(CLI::Range(100, 1000000));
  app.add_flag("--threads-table", table, "measure each lanes x threads layout");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto start = steady_clock::now();
    tl::TorchLanes lanes(lanes_n, weights);  // each lane: load_encoder(weights), torch::load
    const tl::EncoderConfig& config = lanes.lane(0).module()->config;
    const tl::TextTokenizer tokenize(config);
    std::vector<tl::TokenizedText> requests;
    std::uint64_t id = 0;
    for (const std::string& t : tl::sample_texts(4096)) requests.push_back(tokenize(t, id++));
    if (table) return threads_table(weights, requests, requests_n);

    fmt::print(
        "model: {} layers, d_model {}, {} heads, ffn {}, vocabulary {}, up to {} tokens, {} "
        "classes; "
        "weights {} loaded in {:.0f} ms ({} lane{})\n",
        config.layers, config.d_model, config.heads, config.ffn, config.vocab_size,
        config.max_tokens, config.classes, weights, ms(steady_clock::now() - start), lanes_n,
        lanes_n == 1 ? "" : "s");
    const tl::ThreadPlan plan = tl::set_intra_op_threads(lanes_n, threads, 0, print_line);
    fmt::print("threads: {} lane{} x {} intra-op thread{} on {} cores\n", plan.lanes,
               plan.lanes == 1 ? "" : "s", plan.threads_per_lane,
               plan.threads_per_lane == 1 ? "" : "s", plan.cores);

    CallLog log;
    tailbatch::Readiness ready;
    tl::EncoderPipeline pipeline(log.wrap(), tl::encoder_policy(), tl::encoder_pipeline_config(),
                                 lanes);

    // Warm-up: every batch size the policy forms, on every lane, before ready.
    const tailbatch::WarmupReport w = tailbatch::warmup(
        pipeline, std::span<const tl::TokenizedText>(requests.data(), 64), {.readiness = &ready});
    std::vector<std::pair<std::size_t, nanoseconds>> warm_calls;
    {
      std::lock_guard lock(log.mu);
      warm_calls = log.calls;
    }
    fmt::print("warmup: {} requests in {} batches, sizes", w.requests, w.batches);
    for (std::size_t s : w.sizes) fmt::print(" {}", s);
    fmt::print(", {:.0f} ms; ready: {}{}\n", ms(w.elapsed), ready.is_ready() ? "yes" : "no",
               w.ok() ? "" : " (" + w.first_error + ")");
    if (!ready.is_ready()) return 1;

    // The steady state at the first call's size: the same requests, one batch at a time.
    const std::size_t first_size = warm_calls.front().first;
    std::vector<nanoseconds> steady;
    for (int rep = 0; rep < 31; ++rep) {
      std::vector<std::future<tailbatch::Outcome<tl::Encoding>>> f;
      for (std::size_t i = 0; i < first_size; ++i) f.push_back(pipeline.submit(requests[i]));
      for (auto& x : f) (void)x.get();
      std::lock_guard lock(log.mu);
      steady.push_back(log.calls.back().second);
    }
    std::sort(steady.begin(), steady.end());
    fmt::print(
        "first model call (batch {}, cold): {:.2f} ms; steady state, same batch: {:.2f} ms (median "
        "of 31): "
        "{:.1f}x; warmup() paid it before ready\n",
        first_size, ms(warm_calls.front().second), ms(steady[15]),
        ms(warm_calls.front().second) / std::max(ms(steady[15]), 1e-9));

    // A few texts, alone.
    const char* const texts[] = {"the food was excellent and the staff lovely",
                                 "rude staff, never again", "a quiet clean room with a view",
                                 "slow"};
    for (const char* t : texts) {
      const auto o = pipeline.submit(tokenize(t)).get();
      if (!o.ok()) {
        fmt::print("  {:<46} failed: {}\n", t, o.message());
        return 1;
      }
      const tl::Encoding& e = o.value();
      fmt::print("  {:<46} class {}  embedding [{:+.3f} {:+.3f} {:+.3f} ...]\n", t, e.label,
                 e.embedding[0], e.embedding[1], e.embedding[2]);
    }

    const BurstResult r = burst(pipeline, requests, requests_n);
    fmt::print(
        "burst: {} of {} ok, {:.0f} requests/s, mean batch {:.1f}, latency p50 {:.2f} ms, p99 "
        "{:.2f} ms\n",
        r.ok, requests_n, r.requests_per_s, r.mean_batch, r.p50_ms, r.p99_ms);
    return r.ok == requests_n ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "libtorch_encoder: {}\n", e.what());
    return 1;
  }
}
