// Writes the Prometheus exposition of tailbatch's real components to stdout, for
// `promtool check metrics` (tests/promtool.cmake). Nothing here names a component's metric:
// each component is constructed with its metrics on one MetricsRegistry, as a server
// would, and a little traffic is driven through it, so that a renamed metric, a bad label
// or a bad family in any of them reaches promtool:
//
//   Pipeline + ConcurrencyLimiter (AIMD)  tailbatch_pipeline_*, tailbatch_limiter_*
//   ContinuousBatcher                     tailbatch_generation_* (its streams' metrics too)
//   TokenStreamer on its own              StreamMetrics::registered
//   LatencyHistogram, WindowedHistogram   the registry's latency histograms, cumulative and
//                                         windowed, with an extra bound (an SLO target)
//   cuda::FallbackLanes (CUDA builds)     tailbatch_lanes_host_fallback, and on a GPU the
//                                         StreamPool's tailbatch_cuda_* metrics
//
// Everything runs on a ManualClock and is stepped by hand (poll(), poll()): no thread
// is started, the output is the same on every run, and it takes milliseconds. FallbackLanes
// needs the CUDA toolkit's headers and runtime, so it is built in only where CUDA is enabled
// (TAILBATCH_EXPOSITION_CUDA, set by tests/promtool.cmake).
//
// Last come the awkward cases the text format has to survive: escaped label values and
// help text, non-ASCII, special float values, a callback gauge that throws, and one that
// was unregistered before the scrape.
//
// Latency histograms are written as Prometheus histograms (the registry's default), or as
// summaries with `--summary` (LatencyExport::summary); tests/promtool.cmake lints both.
//
// Exit status: 0 with the exposition written; 1 if a component did not behave as driven
// (the traffic below checks its own outcomes, so that the exposition shows what it says).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <future>
#include <memory>
#include <stop_token>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/clock.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/token_streamer.hpp>

#if TAILBATCH_EXPOSITION_CUDA
#include <tailbatch/cuda/fallback_lanes.hpp>
#endif

using namespace std::chrono_literals;
using tailbatch::ManualClock;
using tailbatch::Status;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "metrics_exposition_main: %s\n", what);
    ++failures;
  }
}

// The Pipeline behind an AIMD ConcurrencyLimiter, both on one ManualClock, with one
// request of each outcome: ok, failed (the model throws on -1), deadline_exceeded,
// cancelled, and rejected by the limiter (overloaded). The components live until after the
// scrape: their gauges are callbacks into them.
struct PipelineRig {
  using Limiter = tailbatch::ConcurrencyLimiter<tailbatch::AimdLimit, ManualClock>;
  using Pipe = tailbatch::Pipeline<int, int, tailbatch::FixedWindow, tailbatch::HostLanes, Limiter, ManualClock>;

  static Pipe::Config config(tailbatch::MetricsRegistry& registry) {
    Pipe::Config c;
    c.metrics = &registry;
    c.metric_labels = {{"pipeline", "classifier"}};
    return c;
  }

  PipelineRig(tailbatch::MetricsRegistry& registry, ManualClock clock)
      : clock_(clock),
        limiter_(tailbatch::AimdLimit(tailbatch::AimdLimitConfig{.initial_limit = 8, .min_limit = 8, .max_limit = 64}),
                 tailbatch::ConcurrencyLimiterConfig{.queue_capacity = 0, .metrics = &registry,
                                           .metric_labels = {{"pipeline", "classifier"}}},
                 clock),
        pipeline_(
            [clock](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) mutable {
              for (std::size_t i = 0; i < in.size(); ++i) {
                if (in[i] < 0) throw std::runtime_error("the model rejects negative input");
                out[i] = 2 * in[i];
              }
              clock.advance(3ms + 250us * static_cast<long>(in.size()));
            },
            tailbatch::FixedWindow(4, 2ms), config(registry), lanes_, limiter_, clock) {}

  void drive() {
    std::vector<std::future<tailbatch::Outcome<int>>> ok;
    for (int i = 0; i < 5; ++i) ok.push_back(pipeline_.submit(i));
    std::stop_source cancel;
    auto cancelled = pipeline_.submit(100, tailbatch::SubmitOptions{.cancel = cancel.get_token()});
    auto late = pipeline_.submit(101, tailbatch::SubmitOptions{.deadline = clock_.now() + 1ms});
    auto also_ok = pipeline_.submit(6);
    auto overloaded = pipeline_.submit(102);  // the limit is 8: a ninth request in flight is refused
    cancel.request_stop();
    auto run = [&] {
      for (int round = 0; round < 30; ++round) {
        clock_.advance(1ms);
        (void)pipeline_.poll();
      }
    };
    run();
    ok.push_back(std::move(also_ok));
    auto failed = pipeline_.submit(-1);  // alone in its batch: only it fails
    run();
    std::size_t good = 0;
    for (auto& f : ok) good += f.get().ok() ? 1 : 0;
    expect(good == ok.size(), "a pipeline request did not complete ok");
    expect(cancelled.get().status() == Status::cancelled, "the cancelled request was not cancelled");
    expect(late.get().status() == Status::deadline_exceeded, "the late request did not miss its deadline");
    expect(failed.get().status() == Status::failed, "the model's exception did not fail its batch");
    expect(overloaded.get().status() == Status::rejected, "the limiter did not reject the ninth request");
  }

  ManualClock clock_;
  tailbatch::HostLanes lanes_{1, 1};
  Limiter limiter_;
  Pipe pipeline_;
};

// The ContinuousBatcher stepped by hand: three sequences to completion, one too large for
// the token budget.
struct BatcherRig {
  using Batcher = tailbatch::ContinuousBatcher<int, tailbatch::NoSequenceState, ManualClock>;

  static tailbatch::ContinuousBatcherConfig config(tailbatch::MetricsRegistry& registry) {
    tailbatch::ContinuousBatcherConfig c;
    c.max_active = 2;
    c.token_budget = 64;
    c.metrics = &registry;
    c.metric_labels = {{"pipeline", "generator"}};
    return c;
  }

  BatcherRig(tailbatch::MetricsRegistry& registry, ManualClock clock)
      : batcher_(
            [clock](std::span<Batcher::Sequence> batch) mutable {
              clock.advance(2ms);
              for (auto& s : batch)
                if (s.emits()) s.emit(static_cast<int>(s.generated()));
            },
            config(registry), clock) {}

  void drive() {
    std::vector<std::shared_ptr<Batcher::Stream>> streams;
    for (std::size_t n : {3, 5, 4}) {
      Batcher::Request r;
      r.prompt.assign(4, 1);
      r.max_new_tokens = n;
      streams.push_back(batcher_.submit(std::move(r)));
    }
    Batcher::Request huge;
    huge.prompt.assign(8, 1);
    huge.max_new_tokens = 1000;  // beyond the token budget: rejected, too_large
    auto rejected = batcher_.submit(std::move(huge));
    for (int i = 0; i < 50 && batcher_.stats().count(Status::ok) < 3; ++i) (void)batcher_.poll();
    for (auto& s : streams) {
      std::size_t tokens = 0;
      while (s->try_next()) ++tokens;  // the client reads its answer
      expect(s->closed() && s->end()->ok() && tokens > 0, "a sequence did not complete ok");
    }
    expect(rejected->closed() && rejected->end()->status == Status::rejected, "the huge sequence was not rejected");
  }

  Batcher batcher_;
};

// A TokenStreamer of one's own decode loop, with the standard stream metrics.
void drive_streamer(tailbatch::MetricsRegistry& registry, ManualClock clock) {
  const auto metrics = tailbatch::StreamMetrics::registered(registry, {{"pipeline", "standalone"}});
  tailbatch::TokenStreamer<int, ManualClock> ok_stream({}, clock, {}, &metrics);
  for (int i = 0; i < 5; ++i) {
    clock.advance(15ms);
    expect(ok_stream.push(i), "a token push was refused");
  }
  ok_stream.close(Status::ok);
  tailbatch::TokenStreamer<int, ManualClock> failed_stream({}, clock, {}, &metrics);
  clock.advance(40ms);
  (void)failed_stream.push(1);
  failed_stream.close(Status::failed, "the decode loop failed");
}

// What a server registers itself: a plain and a windowed latency histogram (the windowed one
// on the ManualClock), and an empty one (zero buckets; NaN quantiles as a summary).
void drive_histograms(tailbatch::MetricsRegistry& registry, ManualClock clock) {
  auto& total = registry.histogram("tailbatch_server_request_seconds", "Time from arrival to response",
                                   {{"route", "classify"}});
  auto& recent = registry.windowed_histogram("tailbatch_server_request_seconds", "Time from arrival to response",
                                             {{"route", "recent"}}, 5min, 10, {}, clock);
  for (int i = 1; i <= 1000; ++i) {
    total.record(std::chrono::microseconds(i * 37));
    recent.record(std::chrono::microseconds(i * 53));
  }
  (void)registry.histogram("tailbatch_server_request_seconds", "Time from arrival to response", {{"route", "idle"}});
}

#if TAILBATCH_EXPOSITION_CUDA
// FallbackLanes: CUDA lanes where a GPU can be used, host lanes (and the fallback gauge at 1)
// where it cannot. A lease is taken and returned as a Pipeline would.
void drive_fallback_lanes(tailbatch::MetricsRegistry& registry) {
  tailbatch::cuda::FallbackLanesConfig config;
  config.metrics = &registry;
  config.metric_labels = {{"pipeline", "classifier"}};
  static tailbatch::cuda::FallbackLanes lanes(std::move(config));  // its gauges live until exit
  auto lease = lanes.try_acquire();
  expect(lease.has_value(), "FallbackLanes gave no lane");
}
#endif

// The text format's awkward cases, under tailbatch_test_* names.
std::vector<tailbatch::CallbackRegistration> format_cases(tailbatch::MetricsRegistry& r) {
  r.gauge("tailbatch_test_escaping", "Help with a backslash \\ and a\nnewline, and \"quotes\".",
          {{"path", "C:\\models\\\"v2\"\nline two"}, {"name", "caf\xc3\xa9 \xe2\x9c\x93"}})
      .set(1);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "nan"}}).set(std::nan(""));
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "pos_inf"}}).set(INFINITY);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "neg_inf"}}).set(-INFINITY);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "tiny"}}).set(1e-300);
  std::vector<tailbatch::CallbackRegistration> kept;
  kept.push_back(r.gauge_callback("tailbatch_test_broken", "A callback that throws reads NaN.", {},
                                  []() -> double { throw std::runtime_error("unavailable"); }));
  {
    auto gone = r.gauge_callback("tailbatch_test_gone", "Unregistered before exposition.", {}, [] { return 1.0; });
  }
  return kept;
}

}  // namespace

int main(int argc, char** argv) {
  tailbatch::MetricsRegistryConfig config;
  if (argc > 1 && std::string(argv[1]) == "--summary") config.latency_export = tailbatch::LatencyExport::summary;
  config.buckets.extra_boundaries_seconds = {0.15};
  tailbatch::MetricsRegistry registry(config);
  ManualClock clock;
  PipelineRig pipeline(registry, clock);
  pipeline.drive();
  BatcherRig batcher(registry, clock);
  batcher.drive();
  drive_streamer(registry, clock);
  drive_histograms(registry, clock);
#if TAILBATCH_EXPOSITION_CUDA
  drive_fallback_lanes(registry);
#endif
  const auto kept = format_cases(registry);

  const std::string text = registry.prometheus();
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (text.empty()) ++failures;
  return failures == 0 ? 0 : 1;
}
