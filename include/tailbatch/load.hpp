// The load of a front door (Pipeline, ContinuousBatcher), in one shape for both: the time
// integrals of the requests it holds, read at one moment (load()), and the averages over
// the window between two readings (load_between()): the L, lambda and W of Little's law
// (check_littles_law, littles_law.hpp), which both front doors also run on themselves
// (check_littles_law() on each).
//
//   const LoadReading a = pipeline.load();
//   ... 10-60 s later ...
//   const LoadWindow w = load_between(a, pipeline.load());
//   w.mean_in_system;    // L: time-averaged requests queued or executing
//   w.throughput_per_s;  // lambda: completions per second
//   w.mean_latency;      // W: their mean time in the front door
//
// Plain values and a pure function: thread-safe, never allocate, never throw.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/submit_options.hpp>

namespace tailbatch {

// Time integrals of what a front door holds, cumulative since it was constructed.
struct LoadReading {
  BatchTime at{};            // when it was read (the front door's clock)
  double in_system_s = 0.0;  // integral over time of requests queued or executing, request-seconds
  double executing_s =
      0.0;  // integral over time of requests executing (in a batch, in the active set)
  std::uint64_t completed = 0;  // requests that were queued and have left, in any status
  double latency_s = 0.0;       // their latencies summed, seconds (see each front door's load())
};

// Averages over the window between two readings.
struct LoadWindow {
  std::chrono::nanoseconds window{0};
  double mean_in_system = 0.0;               // time-averaged requests queued or executing (L)
  double mean_queued = 0.0;                  // time-averaged requests queued
  double mean_executing = 0.0;               // time-averaged requests executing
  double throughput_per_s = 0.0;             // completions per second (lambda)
  std::chrono::nanoseconds mean_latency{0};  // mean latency of those completions (W)
};

// The averages between `from` and a later reading `to` of the same front door; all zero
// when `to` is not later. Never throws. Thread-safe (a pure function).
[[nodiscard]] inline LoadWindow load_between(const LoadReading& from,
                                             const LoadReading& to) noexcept {
  LoadWindow w;
  if (!(to.at > from.at)) return w;
  w.window = std::chrono::duration_cast<std::chrono::nanoseconds>(to.at - from.at);
  const double seconds = std::chrono::duration<double>(to.at - from.at).count();
  w.mean_in_system = std::max(0.0, (to.in_system_s - from.in_system_s) / seconds);
  w.mean_executing = std::max(0.0, (to.executing_s - from.executing_s) / seconds);
  w.mean_queued = std::max(0.0, w.mean_in_system - w.mean_executing);
  const std::uint64_t done = to.completed >= from.completed ? to.completed - from.completed : 0;
  w.throughput_per_s = static_cast<double>(done) / seconds;
  if (done > 0) {
    const double mean = std::max(0.0, (to.latency_s - from.latency_s) / static_cast<double>(done));
    w.mean_latency = std::chrono::nanoseconds(detail::llround(mean * 1e9));
  }
  return w;
}

// The Pipeline's earlier names for the same shapes (PipelineOccupancy's in_pipeline_s is
// now in_system_s, OccupancyWindow's mean_in_pipeline mean_in_system).
using PipelineOccupancy = LoadReading;
using OccupancyWindow = LoadWindow;
[[nodiscard]] inline OccupancyWindow occupancy_between(const PipelineOccupancy& from,
                                                       const PipelineOccupancy& to) noexcept {
  return load_between(from, to);
}

}  // namespace tailbatch
