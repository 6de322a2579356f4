// The AdaptiveWindow's configuration and what it reports: AdaptiveWindowConfig,
// AdaptiveCloseReason (the label of tailbatch_adaptive_closes_total), AdaptiveCostModel and
// AdaptivePlan. <tailbatch/adaptive_window.hpp> includes this header; include that one. The
// types are apart so that the policy's learned state (detail/adaptive/state.hpp) can use
// them. Plain values: no member allocates or throws, except copying a config's labels.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/metrics.hpp>

namespace tailbatch {

// Why AdaptiveWindow closed a batch; the label of tailbatch_adaptive_closes_total.
enum class AdaptiveCloseReason : std::uint8_t {
  max_batch,    // the queue held the hard cap
  target_size,  // the queue held the size the current load calls for
  window,       // the oldest request waited as long as the target takes to fill
  slo_guard,    // waiting longer would break the SLO for the oldest request
  backlog,      // more was queued than the target drains within the SLO (on one lane: than
                // the target, as the lane freed): a larger batch went
  flush,        // the Pipeline drains
  lookahead,    // playing the next moments out showed fewer late requests if all queued go now
};
inline constexpr std::size_t adaptive_close_reason_count = 7;

// A short, stable, lower-case name ("slo_guard"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(AdaptiveCloseReason r) noexcept {
  return detail::enum_name<adaptive_close_reason_count>(
      r, {"max_batch", "target_size", "window", "slo_guard", "backlog", "flush", "lookahead"});
}

// What AdaptiveWindow is told. The constructor throws std::invalid_argument naming a bad
// field.
struct AdaptiveWindowConfig {
  // The p95 end-to-end target the policy works under. Required, > 0.
  std::chrono::nanoseconds slo_p95{0};
  // An optional p99 target (0: none); when set it must be >= slo_p95.
  std::chrono::nanoseconds slo_p99{0};
  // The hard cap on a batch (the model's memory limit), in [1, max_batch_limit].
  std::size_t max_batch = 64;
  // Optional: where the policy explains itself (see the header comment). Registering
  // allocates and may throw what MetricsRegistry throws.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// The learned model of batch cost: L(b) = intercept + slope x b over the sizes seen
// (the piecewise refinement is used inside decide(); estimate() gives it too).
struct AdaptiveCostModel {
  double intercept_s = 0.0;      // seconds
  double slope_s = 0.0;          // seconds per request
  std::uint64_t samples = 0;     // executed batches learned from
  std::size_t sizes_seen = 0;    // distinct batch sizes among them
};

// The (window, batch size) in force, and what the policy predicted for it.
struct AdaptivePlan {
  std::size_t batch = 1;                 // close when this many are queued
  BatchDuration window{};                // or when the oldest has waited this long
  double rate_rps = 0.0;                 // the arrival rate it was planned for
  double predicted_p95_s = 0.0;          // in queue and on the lane, seconds
  double predicted_p99_s = 0.0;
};

}  // namespace tailbatch
