// The Little's-law self-check (docs/latency-field-guide.md, "Metrics"): from a window's
// completion rate and mean latency, how many requests should have been in flight, and
// whether the measured in-flight count disagrees enough to suspect a hidden queue. Core:
// the Pipeline runs it on its own live numbers (Pipeline::check_littles_law) and the
// Autoscaler on its inputs; a server can run it on anything it measures.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>

namespace tailbatch {

// The latency field guide's self-check ("Ensure Little's Law holds approximately with your measurements;
// big deviations suggest hidden queues"): L = lambda * W. From the measured completion
// rate (lambda) and mean latency (W), the mean number of requests in flight should be
// their product; a measured mean in flight that deviates by more than `threshold`
// (relative) means some waiting is counted by one measurement and not the other.
struct LittlesLawCheck {
  double throughput_per_s = 0.0;             // input: completions per second (lambda)
  std::chrono::nanoseconds mean_latency{0};  // input: mean latency (W)
  double measured_in_flight = 0.0;           // input: time-averaged requests in flight (L)
  double threshold = 0.2;                    // input: tolerated |relative_deviation|
  double predicted_in_flight = 0.0;          // lambda * W
  // (measured - predicted) / predicted; 0 when both are 0, +inf when only predicted is.
  double relative_deviation = 0.0;
  bool hidden_queue_suspected = false;  // |relative_deviation| > threshold
  std::string explanation;              // one line, for logs and reports
};

// Compares measured in-flight with throughput * mean latency. The three inputs must come
// from the same time window; measured_in_flight must be a time average (e.g. the in-flight
// gauge sampled at regular intervals), not one reading. Allocates the explanation. Throws
// std::invalid_argument naming the field if an input is negative or not finite, or if
// threshold is not > 0. Thread-safe (a pure function).
[[nodiscard]] inline LittlesLawCheck check_littles_law(double throughput_per_s,
                                                       std::chrono::nanoseconds mean_latency,
                                                       double mean_in_flight,
                                                       double threshold = 0.2) {
  if (!(detail::is_finite(throughput_per_s) && throughput_per_s >= 0.0)) {
    detail::throw_invalid_argument("check_littles_law: throughput_per_s must be finite and >= 0");
  }
  if (mean_latency < std::chrono::nanoseconds::zero()) {
    detail::throw_invalid_argument("check_littles_law: mean_latency must be >= 0");
  }
  if (!(detail::is_finite(mean_in_flight) && mean_in_flight >= 0.0)) {
    detail::throw_invalid_argument("check_littles_law: mean_in_flight must be finite and >= 0");
  }
  if (!(detail::is_finite(threshold) && threshold > 0.0)) {
    detail::throw_invalid_argument("check_littles_law: threshold must be finite and > 0");
  }
  LittlesLawCheck c;
  c.throughput_per_s = throughput_per_s;
  c.mean_latency = mean_latency;
  c.measured_in_flight = mean_in_flight;
  c.threshold = threshold;
  const double w = std::chrono::duration<double>(mean_latency).count();
  c.predicted_in_flight = throughput_per_s * w;
  if (c.predicted_in_flight > 0.0) {
    c.relative_deviation = (mean_in_flight - c.predicted_in_flight) / c.predicted_in_flight;
  } else {
    c.relative_deviation = mean_in_flight > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
  }
  c.hidden_queue_suspected = detail::fabs(c.relative_deviation) > threshold;

  char buf[512];
  double pct = 100.0 * c.relative_deviation;
  if (detail::fabs(pct) < 0.05) pct = 0.0;  // "+0.0 %", never "-0.0 %"
  const double thr = 100.0 * threshold;
  if (c.predicted_in_flight == 0.0 && mean_in_flight == 0.0) {
    std::snprintf(buf, sizeof buf,
                  "consistent: nothing completed or in flight (%.4g/s x %.4g s = 0 predicted, 0 "
                  "measured)",
                  throughput_per_s, w);
  } else if (c.predicted_in_flight == 0.0) {
    std::snprintf(buf, sizeof buf,
                  "hidden queue suspected: %.4g measured in flight but %.4g/s x %.4g s predicts "
                  "0: requests are held somewhere without completing",
                  mean_in_flight, throughput_per_s, w);
  } else if (!c.hidden_queue_suspected) {
    std::snprintf(buf, sizeof buf,
                  "consistent: %.4g/s x %.4g s predicts %.4g in flight, %.4g measured "
                  "(%+.1f %%, threshold %.3g %%)",
                  throughput_per_s, w, c.predicted_in_flight, mean_in_flight, pct, thr);
  } else if (c.relative_deviation > 0.0) {
    std::snprintf(buf, sizeof buf,
                  "hidden queue suspected: %.4g measured in flight vs %.4g predicted by %.4g/s x "
                  "%.4g s (%+.1f %%, threshold %.3g %%): requests spend time in the system that "
                  "the latency measurement does not cover, e.g. a queue before the timer starts",
                  mean_in_flight, c.predicted_in_flight, throughput_per_s, w, pct, thr);
  } else {
    std::snprintf(buf, sizeof buf,
                  "hidden queue suspected: %.4g measured in flight vs %.4g predicted by %.4g/s x "
                  "%.4g s (%+.1f %%, threshold %.3g %%): the latency includes waiting that the "
                  "in-flight count does not see, e.g. a queue upstream of where in-flight is "
                  "counted (client, proxy, an unmetered stage)",
                  mean_in_flight, c.predicted_in_flight, throughput_per_s, w, pct, thr);
  }
  c.explanation = buf;
  return c;
}

// The same check from a latency histogram's snapshot covering an observation window of
// length `window` (e.g. a histogram reset at the window's start, or a RollingHistogram's
// snapshot): throughput = count / window, mean latency = sum / count. Throws
// std::invalid_argument if window is not > 0, or as above. Thread-safe (a pure function).
[[nodiscard]] inline LittlesLawCheck check_littles_law(const HistogramSnapshot& latencies,
                                                       std::chrono::nanoseconds window,
                                                       double mean_in_flight,
                                                       double threshold = 0.2) {
  if (window <= std::chrono::nanoseconds::zero()) {
    detail::throw_invalid_argument("check_littles_law: window must be > 0");
  }
  const auto n = latencies.count();
  const double throughput = static_cast<double>(n) / std::chrono::duration<double>(window).count();
  const auto mean = n == 0 ? std::chrono::nanoseconds::zero()
                           : std::chrono::nanoseconds(static_cast<std::int64_t>(detail::llround(
                                 latencies.sum_seconds() * 1e9 / static_cast<double>(n))));
  return check_littles_law(throughput, mean, mean_in_flight, threshold);
}

}  // namespace tailbatch
