// Prints the Prometheus exposition of the components a tailbatch server runs, all on one
// MetricsRegistry as tailbatch-serve has them: a Pipeline behind a ConcurrencyLimiter (a
// learning one, so that every limiter family exists) and an Autoscaler, after a little
// traffic and one evaluation. tests/deploy.cmake checks that every metric name the
// Kubernetes manifests under deploy/kubernetes/ reference is one of these.
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
  const tailbatch::Labels labels{{"model", "classifier"}};

  tailbatch::LimiterConfig lo;
  lo.metrics = &registry;
  lo.metric_labels = labels;
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
  tailbatch::ReplicaSignals s;
  s.arrival_rps = 300.0;
  s.queue_depth = 4.0;
  s.in_flight = 12.0;
  s.p95 = 60ms;
  s.mean_latency = 50ms;
  (void)autoscaler.evaluate(std::chrono::steady_clock::now(), 1, std::span(&s, 1));

  std::fputs(registry.prometheus().c_str(), stdout);
  pipeline.shutdown();
  return 0;
}
