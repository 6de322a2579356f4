// Metrics as a serving loop registers them, and the Little's-law self-check of the latency
// field guide (docs/latency-field-guide.md).
//
// A small batching server runs for 20 simulated seconds on a ManualClock (so the output is
// the same on every run): Poisson arrivals at 350 requests/s, a bounded queue, a 6 ms
// batch window, up to 32 requests a batch, two model streams taking 18 ms + 2.5 ms per
// extra request (the latency field guide's exercise). It exports the families tailbatch's
// Pipeline exports: requests by status and reject reason, batches by what closed them, queue depth
// and in-flight as callback gauges, and latency summaries. At the end it prints the
// Prometheus text a /metrics handler would
// serve, then checks Little's law twice: with end-to-end latency (consistent), and with
// only the model's time, the mistake of starting the timer after the queue, which the
// check exposes as a hidden queue.
//
//   $ ./metrics_exposition
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <random>
#include <string>
#include <tailbatch/clock.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/littles_law.hpp>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  using Clock = tailbatch::ManualClock;
  using TimePoint = Clock::time_point;

  // --- what a server registers at start-up -------------------------------------------
  tailbatch::MetricsRegistry registry;
  const tailbatch::Labels labels{{"pipeline", "classifier"}};
  const auto with = [&](const char* k, const char* v) {
    return tailbatch::join_labels(labels, {{k, v}});
  };

  // The families (and help texts) tailbatch's Pipeline exports; see docs/metrics.md.
  const auto outcome = [&](const char* status, const char* reason) {
    return tailbatch::join_labels(labels, {{"status", status}, {"reason", reason}});
  };
  auto& ok =
      registry.counter("tailbatch_pipeline_requests_total",
                       "Requests completed, by status and reject reason", outcome("ok", "none"));
  auto& queue_full = registry.counter("tailbatch_pipeline_requests_total",
                                      "Requests completed, by status and reject reason",
                                      outcome("rejected", "queue_full"));
  auto& by_window =
      registry.counter("tailbatch_pipeline_batches_total",
                       "Batches dispatched, by the reason they closed", with("reason", "window"));
  auto& by_size =
      registry.counter("tailbatch_pipeline_batches_total",
                       "Batches dispatched, by the reason they closed", with("reason", "size"));
  auto& batched = registry.counter("tailbatch_pipeline_batched_requests_total",
                                   "Requests executed in batches (padding excluded)", labels);
  auto& queue_wait =
      registry.histogram("tailbatch_pipeline_queue_wait_seconds",
                         "Time from submit until the request's batch was formed", labels);
  auto& model = registry.histogram("tailbatch_pipeline_model_seconds",
                                   "Time spent in the model call, per batch", labels);
  auto& end_to_end = registry.histogram("tailbatch_pipeline_end_to_end_seconds",
                                        "Time from submit until the request completed", labels);

  // Queue depth and in-flight are read when scraped, from state the loop owns. A real
  // server's callbacks read its queue's size_approx(); here two atomics stand in.
  std::atomic<int> queued{0};
  std::atomic<int> in_flight{0};
  const auto depth_gauge =
      registry.gauge_callback("tailbatch_pipeline_queue_depth", "Requests waiting in the queue",
                              labels, [&] { return static_cast<double>(queued.load()); });
  const auto in_flight_gauge =
      registry.gauge_callback("tailbatch_pipeline_in_flight", "Requests in batches being executed",
                              labels, [&] { return static_cast<double>(in_flight.load()); });

  // --- the serving loop, on simulated time ---------------------------------------------
  constexpr double arrival_rate = 350.0;  // requests per second
  constexpr std::size_t max_queue = 256;
  constexpr std::size_t max_batch = 32;
  constexpr auto window = 6ms;
  constexpr auto step = 100us;
  constexpr auto duration = 20s;
  const auto model_time = [](std::size_t n) { return 18ms + 2500us * static_cast<int>(n - 1); };

  struct Stream {
    bool busy = false;
    TimePoint done{};
    std::vector<TimePoint> arrivals;
  };
  Clock clock;
  const TimePoint start = clock.now();
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> gap(arrival_rate);
  TimePoint next_arrival =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
  std::deque<TimePoint> queue;
  Stream streams[2];
  // Requests in the system (queued + executing), sampled every step: their time average
  // is the L of Little's law.
  double in_system_sum = 0.0;
  std::size_t samples = 0;

  while (clock.now() - start < duration) {
    const TimePoint now = clock.now();
    for (auto& s : streams) {  // completions
      if (s.busy && s.done <= now) {
        for (const TimePoint a : s.arrivals) end_to_end.record(now - a);
        ok.inc(s.arrivals.size());
        in_flight.fetch_sub(static_cast<int>(s.arrivals.size()));
        s.busy = false;
      }
    }
    while (next_arrival <= now) {  // arrivals: admit or fail fast
      if (queue.size() >= max_queue) {
        queue_full.inc();
      } else {
        queue.push_back(next_arrival);
      }
      next_arrival +=
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
    for (auto& s : streams) {  // a free stream takes a batch when it is full or its window expired
      if (s.busy || queue.empty()) continue;
      const bool full = queue.size() >= max_batch;
      if (!full && now - queue.front() < window) continue;
      const std::size_t n = std::min(queue.size(), max_batch);
      s.arrivals.assign(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
      queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(n));
      for (const TimePoint a : s.arrivals) queue_wait.record(now - a);
      (full ? by_size : by_window).inc();
      batched.inc(n);
      in_flight.fetch_add(static_cast<int>(n));
      model.record(model_time(n));
      s.busy = true;
      s.done = now + model_time(n);
    }
    queued.store(static_cast<int>(queue.size()));
    in_system_sum += static_cast<double>(queue.size()) + in_flight.load();
    ++samples;
    clock.advance(step);
  }

  // --- what /metrics would serve ----------------------------------------------------------
  fmt::print("{}", registry.prometheus());

  // --- the self-check -----------------------------------------------------------------------
  const double mean_in_flight = in_system_sum / static_cast<double>(samples);
  const auto e2e = tailbatch::check_littles_law(end_to_end.snapshot(), duration, mean_in_flight);
  fmt::print("\n# Little's law with end-to-end latency: {}\n", e2e.explanation);
  // The same in-flight against the model's time alone, as if the timer started after the
  // queue: this check is what catches that. (Model time per request: each request of a
  // batch spends the batch's model time.)
  const auto e2e_snapshot = end_to_end.snapshot();
  const auto wait_snapshot = queue_wait.snapshot();
  const double model_mean_s = (e2e_snapshot.sum_seconds() - wait_snapshot.sum_seconds()) /
                              static_cast<double>(e2e_snapshot.count());
  const auto timer_after_queue = tailbatch::check_littles_law(
      static_cast<double>(e2e_snapshot.count()) / std::chrono::duration<double>(duration).count(),
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(model_mean_s)),
      mean_in_flight);
  fmt::print("# Little's law with the timer started after the queue: {}\n",
             timer_after_queue.explanation);
  return e2e.hidden_queue_suspected || !timer_after_queue.hidden_queue_suspected ? 1 : 0;
}
