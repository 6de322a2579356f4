// What a Pipeline counts and exports: its outcome counters, and its
// tailbatch_pipeline_* metrics.
//
// None of it depends on the Pipeline's request, response, policy, lane or clock types, so it
// lives here as plain (non-template) code, compiled once per translation unit however many
// Pipeline types it instantiates. The metrics registration is further reached only through
// a function pointer that PipelineConfig::metrics takes when a registry is assigned to it
// (PipelineMetricsTarget): a program that never gives a Pipeline a registry never compiles
// the registering code, the gauges' callbacks or the registry's insertion paths at all.
// The counters are read by Pipeline::stats() and the gauges; they are written from the
// submit path and by the batch leader and workers (relaxed atomics: each is exact alone,
// a snapshot of several may disagree by requests in transit).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tailbatch/batch_policy.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/tenant_series.hpp>
#include <tailbatch/detail/outcome_ledger.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/tenants.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tailbatch::detail {

// The number of outcome series: ok, one per reject reason but none, and the three other statuses.
inline constexpr std::size_t pipeline_outcome_count = 1 + (reject_reason_count - 1) + 3;

// The index of a (status, reason) pair among the outcome series.
[[nodiscard]] constexpr std::size_t pipeline_outcome_index(Status s, RejectReason r) noexcept {
  constexpr std::size_t reasons = reject_reason_count - 1;
  switch (s) {
    case Status::ok:
      return 0;
    case Status::rejected:
      return std::clamp<std::size_t>(static_cast<std::size_t>(r), 1, reasons);
    case Status::deadline_exceeded:
      return reasons + 1;
    case Status::cancelled:
      return reasons + 2;
    case Status::failed:
      return reasons + 3;
  }
  return reasons + 3;
}

// Consecutive batches that looked limited by callers blocked on futures: the one-time
// warning is given after `warn_after` of them in a row. The leader's.
struct SubmitterStreak {
  static constexpr std::size_t warn_after = 16;
  std::size_t streak = 0;
  bool warned = false;
  // Notes one batch; true when the warning is due now (once).
  bool note(bool limited) noexcept {
    streak = limited ? streak + 1 : 0;
    if (streak < warn_after || warned) return false;
    warned = true;
    return true;
  }
};

// The Pipeline's registered metrics (owned by the Pipeline; the series by the registry).
struct PipelineMetrics {
  enum Hist : std::size_t { queue_wait = 0, formation = 1, model_time = 2, end_to_end = 3 };
  std::array<LatencyHistogram*, 4> hist{};  // queue wait, formation, model, end to end
  std::array<Counter*, dispatch_reason_count> dispatch{};
  std::vector<Counter*> by_size;  // index: bit_width(size - 1)
  Counter* batched = nullptr;
  std::array<Counter*, pipeline_outcome_count> outcomes{};
  Counter* callback_exceptions = nullptr;
  Counter* submitter_limited = nullptr;
  std::vector<CallbackRegistration> gauges;
  std::unique_ptr<TenantSeries> tenants;  // with TenantsConfig::enabled() and metric_tenants > 0
};

// Counts since construction. Relaxed atomics; see the file comment.
struct PipelineCounters {
  std::atomic<double> drain_rate{0.0};  // requests served per second (detail/service_rate.hpp)
  std::atomic<std::size_t> in_flight{0};
  std::atomic<std::uint64_t> inline_submitted{0};
  std::array<std::atomic<std::uint64_t>, dispatch_reason_count> dispatched{};
  std::atomic<std::uint64_t> batched_requests{0};
  std::atomic<std::uint64_t> callback_exceptions{0};
  std::atomic<std::uint64_t> dropped_at_start{0};
  std::atomic<std::uint64_t> submitter_limited{0};
  std::atomic<std::size_t> running_batches{0};  // this Pipeline's batches holding a lane slot
  // Future-returning submits not yet completed; its own cache line, away from what every
  // callback submit touches.
  alignas(64) std::atomic<std::int64_t> future_waiters{0};

  [[nodiscard]] std::size_t blocked_submitters() const noexcept {
    return static_cast<std::size_t>(
        std::max<std::int64_t>(0, future_waiters.load(std::memory_order_relaxed)));
  }

  // n outcomes, on the metric series (the counts themselves are the OutcomeLedger's).
  void count(Status s, RejectReason r, std::uint64_t n, const PipelineMetrics* m) noexcept {
    if (n == 0) return;
    if (m != nullptr) {
      if (Counter* c = m->outcomes[pipeline_outcome_index(s, r)]) c->inc(n);
    }
  }

  void callback_threw(const PipelineMetrics* m) noexcept {
    callback_exceptions.fetch_add(1, std::memory_order_relaxed);
    if (m != nullptr && m->callback_exceptions != nullptr) m->callback_exceptions->inc();
  }

  // A batch of n requests ran (closed for `reason`, model time `model`).
  void batch_ran(DispatchReason reason, std::size_t n, std::chrono::nanoseconds model,
                 const PipelineMetrics* m) noexcept {
    dispatched[static_cast<std::size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
    batched_requests.fetch_add(n, std::memory_order_relaxed);
    if (m == nullptr) return;
    m->dispatch[static_cast<std::size_t>(reason)]->inc();
    m->batched->inc(n);
    const auto bucket = static_cast<std::size_t>(std::bit_width(n - 1));
    if (bucket < m->by_size.size()) m->by_size[bucket]->inc();
    m->hist[PipelineMetrics::model_time]->record(model);
  }

  // Mean batch size over max_batch since start.
  [[nodiscard]] double fill_ratio(std::size_t max_batch) const noexcept {
    std::uint64_t batches = 0;
    for (const auto& d : dispatched) batches += d.load(std::memory_order_relaxed);
    if (batches == 0) return 0.0;
    return static_cast<double>(batched_requests.load(std::memory_order_relaxed)) /
           (static_cast<double>(batches) * static_cast<double>(max_batch));
  }
};

// What the gauges read: the counters, and the queue depth through a pointer call (the
// queue's type depends on the Pipeline's).
struct PipelineGaugeSources {
  const PipelineCounters* counters = nullptr;
  const OutcomeLedger* ledger = nullptr;
  std::size_t max_batch = 1;
  const void* owner = nullptr;
  std::size_t (*queued)(const void* owner) noexcept = nullptr;
  const TenantsConfig* tenants = nullptr;
};

// Registers the tailbatch_pipeline_* series with `base` labels added to each. Throws what
// the registry throws (std::invalid_argument for a clashing series, std::bad_alloc).
[[gnu::cold]] inline std::unique_ptr<PipelineMetrics> register_pipeline_metrics(
    MetricsRegistry& r, const Labels& base, const PipelineGaugeSources& src) {
  auto m = std::make_unique<PipelineMetrics>();
  m->hist[PipelineMetrics::queue_wait] =
      &r.histogram("tailbatch_pipeline_queue_wait_seconds",
                   "Time from submit until the request's batch was formed", base);
  m->hist[PipelineMetrics::formation] =
      &r.histogram("tailbatch_pipeline_batch_formation_seconds",
                   "Time from a batch's first request until the batch closed", base);
  m->hist[PipelineMetrics::model_time] = &r.histogram(
      "tailbatch_pipeline_model_seconds", "Time spent in the model call, per batch", base);
  m->hist[PipelineMetrics::end_to_end] =
      &r.histogram("tailbatch_pipeline_end_to_end_seconds",
                   "Time from submit until the request completed", base);
  for (std::size_t i = 0; i < dispatch_reason_count; ++i) {
    m->dispatch[i] = &r.counter(
        "tailbatch_pipeline_batches_total", "Batches dispatched, by the reason they closed",
        join_labels(base, {{"reason", std::string(to_string(static_cast<DispatchReason>(i)))}}));
  }
  m->batched = &r.counter("tailbatch_pipeline_batched_requests_total",
                          "Requests executed in batches (padding excluded)", base);
  // Size classes 1, 2, 3-4, 5-8, ...: index bit_width(size - 1).
  const auto classes = static_cast<std::size_t>(std::bit_width(src.max_batch - 1)) + 1;
  for (std::size_t i = 0; i < classes; ++i) {
    const std::size_t hi = std::size_t{1} << i;
    const std::size_t lo = i == 0 ? 1 : (std::size_t{1} << (i - 1)) + 1;
    const std::string label =
        lo == hi ? std::to_string(hi) : std::to_string(lo) + "-" + std::to_string(hi);
    m->by_size.push_back(&r.counter("tailbatch_pipeline_batch_size_total",
                                    "Batches dispatched, by size class",
                                    join_labels(base, {{"size", label}})));
  }
  static constexpr std::array<std::pair<Status, RejectReason>, pipeline_outcome_count> outcomes{{
      {Status::ok, RejectReason::none},
      {Status::rejected, RejectReason::queue_full},
      {Status::rejected, RejectReason::overloaded},
      {Status::rejected, RejectReason::shutting_down},
      {Status::rejected, RejectReason::too_large},
      {Status::rejected, RejectReason::quota_exceeded},
      {Status::rejected, RejectReason::shed},
      {Status::deadline_exceeded, RejectReason::none},
      {Status::cancelled, RejectReason::none},
      {Status::failed, RejectReason::none},
  }};
  for (const auto& [s, rr] : outcomes) {
    m->outcomes[pipeline_outcome_index(s, rr)] = &r.counter(
        "tailbatch_pipeline_requests_total", "Requests completed, by status and reject reason",
        join_labels(
            base, {{"status", std::string(to_string(s))}, {"reason", std::string(to_string(rr))}}));
  }
  if (src.tenants != nullptr && src.tenants->enabled() && src.tenants->metric_tenants > 0) {
    m->tenants =
        std::make_unique<TenantSeries>(r, base, "tailbatch_pipeline", "requests",
                                       src.tenants->metric_tenants, src.tenants->tenant_name);
  }
  m->callback_exceptions = &r.counter("tailbatch_pipeline_callback_exceptions_total",
                                      "Completion callbacks that threw (caught and dropped)", base);
  const PipelineCounters* c = src.counters;
  m->gauges.push_back(
      r.gauge_callback("tailbatch_pipeline_queue_depth", "Requests waiting in the queue", base,
                       [src] { return static_cast<double>(src.queued(src.owner)); }));
  m->gauges.push_back(r.gauge_callback(
      "tailbatch_pipeline_in_flight", "Requests in batches being executed", base,
      [c] { return static_cast<double>(c->in_flight.load(std::memory_order_relaxed)); }));
  m->gauges.push_back(r.gauge_callback(
      "tailbatch_pipeline_batch_fill_ratio", "Mean batch size over max_batch since start", base,
      [c, max_batch = src.max_batch] { return c->fill_ratio(max_batch); }));
  m->gauges.push_back(
      r.gauge_callback("tailbatch_pipeline_drain_rate", "Requests taken off the queue per second",
                       base, [c] { return c->drain_rate.load(std::memory_order_relaxed); }));
  m->submitter_limited = &r.counter("tailbatch_pipeline_submitter_limited_batches_total",
                                    "Batches closed by their window short of max_batch with "
                                    "nothing else queued, while fewer callers waited on "
                                    "futures than max_batch x lane slots",
                                    base);
  m->gauges.push_back(
      r.gauge_callback("tailbatch_pipeline_blocked_submitters",
                       "Future-returning submits whose outcome is not yet set", base,
                       [c] { return static_cast<double>(c->blocked_submitters()); }));
  m->gauges.push_back(r.gauge_callback(
      "tailbatch_pipeline_littles_law_deviation",
      "Relative deviation of the time-averaged requests in the pipeline from throughput x mean "
      "latency, at the "
      "last check_littles_law()",
      base, [l = src.ledger] { return l != nullptr ? l->littles_deviation() : 0.0; }));
  m->gauges.push_back(r.gauge_callback(
      "tailbatch_pipeline_hidden_queue_suspected",
      "1 when the last check_littles_law() deviated by more than its threshold, else 0", base,
      [l = src.ledger] { return l != nullptr && l->hidden_queue_suspected() ? 1.0 : 0.0; }));
  return m;
}

// The one-time warning that callers blocked on futures limit the batch size.
[[gnu::cold]] inline std::string submitter_limit_message(std::size_t blocked, std::size_t cap) {
  return "tailbatch: batch size looks limited by blocked submitters: " + std::to_string(blocked) +
         " callers wait on futures, fewer than max_batch x lane slots = " + std::to_string(cap) +
         ", and batches close by their window with nothing else queued. If the callers are a fixed "
         "pool of "
         "threads (a thread per request), submit with a callback instead, or let at least " +
         std::to_string(cap) + " callers wait at once.";
}

}  // namespace tailbatch::detail
