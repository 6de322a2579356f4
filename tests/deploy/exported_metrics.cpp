// Prints the Prometheus exposition of the components a tailbatch server runs, all on one
// MetricsRegistry with tailbatch-serve's labels: a Pipeline ({pipeline="classify"}) behind
// a ConcurrencyLimiter ({route="classify"}; a learning one, so that every limiter family
// exists) and an Autoscaler ({pipeline="classify"}), after a little traffic and one
// evaluation. tests/deploy/check_manifests.py reads tailbatch-serve's live /metrics; this
// program stands in only where the server cannot be built (no Boost, nlohmann-json or
// CLI11).
#include <tailbatch/autoscaler.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/limit_algorithms.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/pipeline.hpp>

#include <chrono>
#include <cstdio>
#include <future>
#include <span>
#include <vector>

int main() {
  using namespace std::chrono_literals;
  tailbatch::MetricsRegistry registry;
  const tailbatch::Labels labels{{"pipeline", "classify"}};

  tailbatch::ConcurrencyLimiterConfig lo;
  lo.metrics = &registry;
  lo.metric_labels = {{"route", "classify"}};
  using Limiter = tailbatch::ConcurrencyLimiter<tailbatch::GradientLimit>;
  Limiter limiter(tailbatch::GradientLimit{}, lo);

  tailbatch::HostLanes lanes;
  tailbatch::PipelineConfig<int> pc;
  pc.metrics = &registry;
  pc.metric_labels = labels;
  tailbatch::Pipeline<int, int, tailbatch::FixedWindow, tailbatch::HostLanes, Limiter> pipeline(
      [](std::span<const int> in, std::span<int> out, tailbatch::HostLanes::Lane&) {
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = 2 * in[i];
      },
      tailbatch::FixedWindow(8, 1ms), std::move(pc), lanes, limiter);

  std::vector<std::future<tailbatch::Outcome<int>>> futures;
  for (int i = 0; i < 64; ++i) futures.push_back(pipeline.submit(i));
  for (auto& f : futures) (void)f.get();

  tailbatch::AutoscalerConfig ac;
  ac.capacity_rps = 410.0;
  ac.slo_p95 = 150ms;
  ac.metrics = &registry;
  ac.metric_labels = labels;
  tailbatch::Autoscaler autoscaler(ac);
  tailbatch::ReplicaSignals s{.arrival_rps = 300.0,
                              .queue_depth = 4.0,
                              .in_flight = 12.0,
                              .p95 = 60ms,
                              .mean_latency = 50ms};
  (void)autoscaler.evaluate(std::chrono::steady_clock::now(), 1, std::span(&s, 1));

  std::fputs(registry.prometheus().c_str(), stdout);
  pipeline.shutdown();
  return 0;
}
