// Writes a MetricsRegistry's Prometheus exposition to stdout, for `promtool check metrics`
// (tests/promtool.cmake). It registers every metric family docs/metrics.md says tailbatch's
// components export, with the label sets they use, plus the awkward cases the format has
// to survive: escaped label values and help text, non-ASCII, special float values, an
// empty summary, a callback gauge that throws, and a callback gauge already unregistered.
#include <tailbatch/metrics.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

int main() {
  using namespace std::chrono_literals;
  tailbatch::MetricsRegistry r;
  const tailbatch::Labels pipeline{{"pipeline", "classifier"}};
  const auto with = [&](const char* k, const char* v) { return tailbatch::join_labels(pipeline, {{k, v}}); };

  // Requests and outcomes.
  for (const char* status : {"ok", "rejected", "deadline_exceeded", "cancelled", "failed"}) {
    r.counter("tailbatch_requests_total", "Requests completed, by final status.", with("status", status)).inc(3);
  }
  for (const char* reason : {"queue_full", "overloaded", "shutting_down", "too_large"}) {
    r.counter("tailbatch_rejected_total", "Requests rejected, by reason.", with("reason", reason)).inc();
  }

  // Queue, in-flight and the limiter.
  auto depth = r.gauge_callback("tailbatch_queue_depth", "Requests waiting in the queue.", pipeline,
                                [] { return 12.0; });
  auto in_flight = r.gauge_callback("tailbatch_in_flight", "Requests admitted and not yet completed.",
                                    pipeline, [] { return 42.0; });
  r.gauge("tailbatch_concurrency_limit", "The concurrency limiter's current limit.", pipeline).set(50);
  r.gauge("tailbatch_lane_in_flight", "Batches executing on a lane.", with("lane", "0")).set(2);

  // Batches.
  for (const char* size : {"1", "8", "32"}) {
    r.counter("tailbatch_batches_total", "Batches executed, by batch size.", with("size", size)).inc(5);
  }
  for (const char* closed_by : {"size", "window", "token_budget", "deadline", "drain"}) {
    r.counter("tailbatch_batches_closed_total", "Batches closed, by what closed the window.",
              with("closed_by", closed_by))
        .inc();
  }
  r.counter("tailbatch_batched_requests_total", "Requests executed in batches.", pipeline).inc(205);

  // Latency summaries, in seconds.
  const char* stages[][2] = {
      {"tailbatch_queue_wait_seconds", "Time from admission until the request's batch closed."},
      {"tailbatch_batch_formation_seconds", "Time from a batch's first request until it closed."},
      {"tailbatch_model_seconds", "Duration of the model call, per batch."},
      {"tailbatch_end_to_end_seconds", "Time from submit until the result was delivered."},
  };
  int scale = 1;
  for (const auto& stage : stages) {
    auto& h = r.histogram(stage[0], stage[1], pipeline);
    for (int i = 1; i <= 1000; ++i) h.record(std::chrono::microseconds(i * 37 * scale));
    scale *= 2;
  }
  auto& recent = r.windowed_histogram("tailbatch_end_to_end_seconds", "Time from submit until the result was delivered.",
                                      {{"pipeline", "recent"}}, std::chrono::minutes(5));
  recent.record(120ms);
  (void)r.histogram("tailbatch_time_to_first_token_seconds", "Time from submit until the first token (empty here).",
                    {{"pipeline", "generator"}});
  auto& itl = r.histogram("tailbatch_inter_token_seconds", "Time between consecutive tokens of a sequence.",
                          {{"pipeline", "generator"}});
  itl.record(15ms);
  itl.record(25ms);

  // Generation.
  r.counter("tailbatch_tokens_total", "Tokens generated.", {{"pipeline", "generator"}}).inc(123456);
  r.gauge("tailbatch_tokens_per_second", "Tokens generated per second over the last window.",
          {{"pipeline", "generator"}})
      .set(2345.5);
  r.gauge("tailbatch_active_sequences", "Sequences in the continuous batch.", {{"pipeline", "generator"}}).set(17);

  // What the format must survive.
  r.gauge("tailbatch_test_escaping", "Help with a backslash \\ and a\nnewline, and \"quotes\".",
          {{"path", "C:\\models\\\"v2\"\nline two"}, {"name", "caf\xc3\xa9 \xe2\x9c\x93"}})
      .set(1);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "nan"}}).set(std::nan(""));
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "pos_inf"}}).set(INFINITY);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "neg_inf"}}).set(-INFINITY);
  r.gauge("tailbatch_test_special", "Special values.", {{"value", "tiny"}}).set(1e-300);
  auto broken = r.gauge_callback("tailbatch_test_broken", "A callback that throws reads NaN.", {},
                                 []() -> double { throw std::runtime_error("unavailable"); });
  {
    auto gone = r.gauge_callback("tailbatch_test_gone", "Unregistered before exposition.", {}, [] { return 1.0; });
  }

  const std::string text = r.prometheus();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return text.empty() ? 1 : 0;
}
