// The Pipeline's public types apart from the class itself: its configuration
// (PipelineConfig), the metrics target that configuration takes (PipelineMetricsTarget),
// its statistics (PipelineStats) and what one poll() did (PipelinePollResult). Included
// by pipeline.hpp; usable alone (to build a configuration, or read stats, without the
// Pipeline's machinery).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/pipeline/metrics.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/submit_options.hpp>
#include <tailbatch/tenants.hpp>

namespace tailbatch {

// PipelineConfig::metrics: the registry a Pipeline registers its metrics with, or none.
// Assigned and compared like a MetricsRegistry* (`config.metrics = &registry;`,
// `config.metrics != nullptr`). Assigning a registry also takes the address of the
// registering code, so that code is compiled only where some Pipeline is given a
// registry. Never throws. Thread-safe (a value).
class PipelineMetricsTarget {
 public:
  using Register = std::unique_ptr<detail::PipelineMetrics> (*)(
      MetricsRegistry&, const Labels&, const detail::PipelineGaugeSources&);

  constexpr PipelineMetricsTarget() noexcept = default;
  constexpr PipelineMetricsTarget(std::nullptr_t) noexcept {}  // NOLINT: as a pointer is
  PipelineMetricsTarget(MetricsRegistry* registry) noexcept    // NOLINT: as a pointer is
      : registry_(registry),
        register_(registry != nullptr ? &detail::register_pipeline_metrics : nullptr) {}

  [[nodiscard]] MetricsRegistry* get() const noexcept { return registry_; }
  operator MetricsRegistry*() const noexcept { return registry_; }  // NOLINT: as a pointer is
  MetricsRegistry* operator->() const noexcept { return registry_; }

  // Registers the Pipeline's series; nullptr when there is no registry.
  [[nodiscard]] std::unique_ptr<detail::PipelineMetrics> register_pipeline(
      const Labels& labels, const detail::PipelineGaugeSources& sources) const {
    if (registry_ == nullptr || register_ == nullptr) return nullptr;
    return register_(*registry_, labels, sources);
  }

 private:
  MetricsRegistry* registry_ = nullptr;
  Register register_ = nullptr;
};

// Pipeline configuration. Bad values make the Pipeline constructor throw
// std::invalid_argument naming the field ("Pipeline: queue_capacity must be >= 1").
template <class Req>
struct PipelineConfig {
  // The most requests waiting at once (not yet in a batch). A submit beyond it completes
  // at once with rejected/queue_full and a retry-after hint. Never exceeded. Each submit
  // shard claims places a few at a time, so with several submitting threads a submit may
  // be refused while places that other threads' shards have claimed (together less than
  // 1/16 of the capacity) are still unused; with one, the queue holds exactly this many.
  std::size_t queue_capacity = 4096;
  // Worker threads, started by the constructor. Unset: the default for the clock, one per
  // lane slot (lanes.size() x lanes.lane_capacity()) with SteadyClock, 0 with any other.
  // 0: no threads, the caller drives poll(). Workers sleep on the real clock, so a value
  // above 0 needs SteadyClock (std::invalid_argument "workers" otherwise). Same field,
  // same meaning, in ContinuousBatcherConfig.
  std::optional<std::size_t> workers{};
  // On shutdown, queued requests are still run for at most this long; what is left then
  // completes with rejected/shutting_down.
  std::chrono::nanoseconds drain_timeout = std::chrono::seconds(5);
  // A lower priority whose next request has waited this long is served before higher
  // ones, so that it is never starved.
  std::chrono::nanoseconds starvation_limit = std::chrono::milliseconds(50);
  // Worker threads only: the leader wakes this long before a window closes and spins
  // until it does, so that a batch leaves on time rather than late by the OS's timer
  // latency. Costs at most this much processor time per window that closes by time.
  // Zero: plain timed sleep.
  std::chrono::nanoseconds dispatch_spin = std::chrono::microseconds(100);
  // Submitters append to one of this many separately locked queues, which the batch
  // leader merges. A thread claims one of its own on its first submit while any is free
  // near its id's hash, else shares that one; either way it keeps to one, so its requests
  // stay in order. More of them: less contention between threads that submit at the
  // same moment. 0: automatic, 4 per hardware thread, from 16 to 64. At most 64.
  std::size_t submit_shards = 0;
  // A request's cost (its length in tokens); required by policies that read it
  // (TokenBudget), unused otherwise. Called once per submit; must be thread-safe.
  std::function<std::size_t(const Req&)> request_cost{};
  // When the admission policy reports a limit (max_limit() or limit()) below
  // max_batch x lanes, the Pipeline could never fill a batch on every lane: the
  // constructor throws unless this is false.
  bool check_admission_limit = true;
  // Metrics (tailbatch_pipeline_*), registered at construction with metric_labels added
  // to each. nullptr: none, at no cost. The registry must outlive the Pipeline.
  PipelineMetricsTarget metrics = nullptr;
  Labels metric_labels{};
  // Where the Pipeline writes the few lines it has to say: the one-time warning that
  // callers blocked on futures limit the batch size, and the Little's-law check's finding
  // of a hidden queue. One line per call, without a trailing newline. Called from a
  // worker thread (or the thread calling poll() or check_littles_law()), possibly from
  // several at once: it must be thread-safe, quick, and should not throw (what it throws
  // is dropped). Unset (the default): nothing is written anywhere.
  std::function<void(std::string_view)> log{};
  // Tenants (tenants.hpp): fair scheduling across tenants, and per-tenant quotas
  // (max_queued: requests waiting; max_in_flight: submitted and not yet completed).
  // Fair scheduling charges each request's request_cost when set, else 1.
  TenantsConfig tenants{};
  // What the queue does under overload (queue_policy.hpp): reject the newest (the
  // default), shed the oldest, adaptive LIFO or CoDel.
  QueuePolicyConfig queue{};
};

// Counts since construction: the outcome counts every front door shares (OutcomeCounts,
// outcome.hpp: submitted, by_status, rejected_by_reason, count(), completed()) and the
// Pipeline's own. Exact once shutdown() has returned; while the Pipeline runs a snapshot
// in which the counters may disagree by requests in transit.
struct PipelineStats : OutcomeCounts {
  std::array<std::uint64_t, dispatch_reason_count>
      batches_by_reason{};                // indexed by DispatchReason
  std::uint64_t batched_requests = 0;     // requests executed in batches (without padding)
  std::uint64_t callback_exceptions = 0;  // completion callbacks that threw
  // Requests that were in a formed batch but had passed their deadline (or were
  // cancelled) when the batch was handed to its lane: they were not executed.
  std::uint64_t dropped_at_start = 0;
  // Batches that looked limited by callers blocked on futures (see
  // Pipeline::blocked_submitters_approx()).
  std::uint64_t submitter_limited_batches = 0;
  std::size_t blocked_submitters = 0;  // future-returning submits not yet completed
  std::size_t queued = 0;
  std::size_t in_flight = 0;

  using OutcomeCounts::count;
  [[nodiscard]] std::uint64_t count(DispatchReason r) const noexcept {
    return batches_by_reason[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] std::uint64_t batches() const noexcept {
    std::uint64_t n = 0;
    for (auto c : batches_by_reason) n += c;
    return n;
  }
};

// What one poll() did.
struct PipelinePollResult {
  std::size_t batches = 0;                // batches formed and run by this call
  BatchTime next_due = BatchTime::max();  // when a batch may next be due without new arrivals
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using PollResult [[deprecated("renamed PipelinePollResult")]] = PipelinePollResult;

}  // namespace tailbatch
