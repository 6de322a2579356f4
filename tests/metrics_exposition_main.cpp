// Writes a MetricsRegistry's Prometheus exposition to stdout, for `promtool check metrics`
// (tests/promtool.cmake). It registers every metric family docs/metrics.md says tailbatch's
// components export, with the label sets they use, plus the awkward cases the format has
// to survive: escaped label values and help text, non-ASCII, special float values, an
// empty summary, a callback gauge that throws, and a callback gauge already unregistered.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tailbatch/metrics.hpp>
#include <utility>

int main() {
  using namespace std::chrono_literals;
  tailbatch::MetricsRegistry r;
  const tailbatch::Labels pipeline{{"pipeline", "classifier"}};
  const auto with = [&](const char* k, const char* v) {
    return tailbatch::join_labels(pipeline, {{k, v}});
  };

  // The Pipeline's families (include/tailbatch/pipeline.hpp), names and label shapes as
  // docs/metrics.md lists them.
  const std::pair<const char*, const char*> outcomes[] = {{"ok", "none"},
                                                          {"rejected", "queue_full"},
                                                          {"rejected", "overloaded"},
                                                          {"rejected", "shutting_down"},
                                                          {"rejected", "too_large"},
                                                          {"deadline_exceeded", "none"},
                                                          {"cancelled", "none"},
                                                          {"failed", "none"}};
  for (const auto& [status, reason] : outcomes) {
    r.counter("tailbatch_pipeline_requests_total",
              "Requests completed, by status and reject reason",
              tailbatch::join_labels(pipeline, {{"status", status}, {"reason", reason}}))
        .inc(3);
  }
  for (const char* reason : {"size", "window", "deadline", "token_budget", "flush"}) {
    r.counter("tailbatch_pipeline_batches_total", "Batches dispatched, by the reason they closed",
              with("reason", reason))
        .inc(5);
  }
  for (const char* size : {"1", "2", "3-4", "5-8", "9-16", "17-32"}) {
    r.counter("tailbatch_pipeline_batch_size_total", "Batches dispatched, by size class",
              with("size", size))
        .inc();
  }
  r.counter("tailbatch_pipeline_batched_requests_total",
            "Requests executed in batches (padding excluded)", pipeline)
      .inc(205);
  r.counter("tailbatch_pipeline_callback_exceptions_total",
            "Completion callbacks that threw (caught and dropped)", pipeline);
  auto depth = r.gauge_callback("tailbatch_pipeline_queue_depth", "Requests waiting in the queue",
                                pipeline, [] { return 12.0; });
  auto in_flight =
      r.gauge_callback("tailbatch_pipeline_in_flight", "Requests in batches being executed",
                       pipeline, [] { return 42.0; });
  auto fill =
      r.gauge_callback("tailbatch_pipeline_batch_fill_ratio",
                       "Mean batch size over max_batch since start", pipeline, [] { return 0.4; });
  auto drain =
      r.gauge_callback("tailbatch_pipeline_drain_rate", "Requests taken off the queue per second",
                       pipeline, [] { return 351.5; });
  const char* stages[][2] = {
      {"tailbatch_pipeline_queue_wait_seconds",
       "Time from submit until the request's batch was formed"},
      {"tailbatch_pipeline_batch_formation_seconds",
       "Time from a batch's first request until the batch closed"},
      {"tailbatch_pipeline_model_seconds", "Time spent in the model call, per batch"},
      {"tailbatch_pipeline_end_to_end_seconds", "Time from submit until the request completed"},
  };
  int scale = 1;
  for (const auto& stage : stages) {
    auto& h = r.histogram(stage[0], stage[1], pipeline);
    for (int i = 1; i <= 1000; ++i) h.record(std::chrono::microseconds(i * 37 * scale));
    scale *= 2;
  }
  // A windowed series in the same family as a cumulative one.
  auto& recent = r.windowed_histogram("tailbatch_pipeline_end_to_end_seconds",
                                      "Time from submit until the request completed",
                                      {{"pipeline", "recent"}}, std::chrono::minutes(5));
  recent.record(120ms);

  // The generation families (continuous_batcher.hpp, token_streamer.hpp).
  const tailbatch::Labels gen{{"pipeline", "generator"}};
  const auto gen_with = [&](const char* k, const char* v) {
    return tailbatch::join_labels(gen, {{k, v}});
  };
  for (const char* status : {"ok", "rejected", "deadline_exceeded", "cancelled", "failed"}) {
    r.counter("tailbatch_generation_sequences_total", "Sequences completed, by status",
              gen_with("status", status))
        .inc();
  }
  for (const char* reason : {"queue_full", "shutting_down", "too_large"}) {
    r.counter("tailbatch_generation_rejected_total", "Sequences rejected, by reason",
              gen_with("reason", reason));
  }
  r.counter("tailbatch_generation_steps_total", "Decode steps run", gen).inc(1000);
  r.counter("tailbatch_generation_tokens_total", "Tokens emitted", gen).inc(123456);
  auto active = r.gauge_callback("tailbatch_generation_active_sequences",
                                 "Sequences in the active set", gen, [] { return 17.0; });
  auto waiting = r.gauge_callback("tailbatch_generation_waiting_sequences",
                                  "Sequences waiting for admission", gen, [] { return 3.0; });
  auto reserved =
      r.gauge_callback("tailbatch_generation_reserved_tokens",
                       "Token budget reserved by the active set", gen, [] { return 8192.0; });
  r.histogram("tailbatch_generation_step_seconds", "Duration of one step() call", gen).record(20ms);
  r.histogram("tailbatch_generation_queue_wait_seconds",
              "Time from submission to admission into the active set", gen)
      .record(3ms);
  (void)r.histogram("tailbatch_generation_time_to_first_token_seconds",
                    "Time from submission to the first token's emission",
                    gen);  // empty: NaN quantiles
  auto& itl = r.histogram("tailbatch_generation_inter_token_seconds",
                          "Time between consecutive tokens of a sequence", gen);
  itl.record(15ms);
  itl.record(25ms);
  r.histogram("tailbatch_generation_time_per_output_token_seconds",
              "Mean time per token after the first, per finished sequence", gen)
      .record(18ms);
  r.histogram("tailbatch_generation_end_to_end_seconds", "Time from submission to successful close",
              gen)
      .record(2s);

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
    auto gone = r.gauge_callback("tailbatch_test_gone", "Unregistered before exposition.", {},
                                 [] { return 1.0; });
  }

  const std::string text = r.prometheus();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return text.empty() ? 1 : 0;
}
