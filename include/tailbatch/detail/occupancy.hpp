// Time integrals of how many requests a front door (Pipeline, ContinuousBatcher) holds, for
// a Little's-law check on live data (detail/outcome_ledger.hpp keeps one): the number of
// requests inside (queued or executing) and of those
// executing, integrated over time, with the completions and their latencies summed. Two
// readings give the time-averaged counts, the throughput and the mean latency over the
// same window.
//
// Updated at state changes, once per batch or per leader turn (never per submit): the
// requests a leader takes from the submit queues enter with the sum of their ages, so
// their time before the leader saw them is counted too; a batch's time executing is
// added when it completes; events that arrive out of time order (another thread read the
// clock a little earlier) correct the integral for the stretch since their time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>

#include <tailbatch/submit_options.hpp>

namespace tailbatch::detail {

// One reading: integrals in request-seconds since the meter started.
struct OccupancyReading {
  BatchTime at{};
  double in_pipeline_s = 0.0;  // integral of requests queued or executing
  double executing_s = 0.0;    // integral of requests in batches
  std::uint64_t completed = 0;  // requests that left (completed in any status)
  double latency_s = 0.0;       // their end-to-end latencies, summed
};

// Thread-safe (one short lock per update). Never allocates, never throws.
class OccupancyMeter {
 public:
  explicit OccupancyMeter(BatchTime start = BatchTime{}) noexcept : in_pipeline_{start}, executing_{start} {}

  // n requests entered; at time t their ages (t minus each one's entry) add up to age_sum.
  void enter(BatchTime t, std::uint64_t n, BatchDuration age_sum) noexcept {
    if (n == 0) return;
    std::lock_guard lock(mu_);
    in_pipeline_.add(t, static_cast<std::int64_t>(n), age_sum);
  }

  // n requests completed at t with latencies summing to latency_sum; `executing` of them
  // had been in a batch since `formed` (counted as executing from then, once they leave:
  // one update per batch).
  void leave(BatchTime t, std::uint64_t n, std::uint64_t executing, BatchTime formed,
             BatchDuration latency_sum) noexcept {
    if (n == 0) return;
    std::lock_guard lock(mu_);
    in_pipeline_.add(t, -static_cast<std::int64_t>(n), BatchDuration::zero());
    if (executing > 0) {
      const auto k = static_cast<std::int64_t>(executing);
      executing_.add(t, k, t > formed ? (t - formed) * k : BatchDuration::zero());
      executing_.add(t, -k, BatchDuration::zero());
    }
    completed_ += n;
    latency_s_ += std::chrono::duration<double>(latency_sum).count();
  }

  // The integrals up to t (or up to the latest event, if that is later).
  [[nodiscard]] OccupancyReading read(BatchTime t) const noexcept {
    std::lock_guard lock(mu_);
    OccupancyReading r;
    r.at = std::max({t, in_pipeline_.last, executing_.last});
    r.in_pipeline_s = in_pipeline_.integral_at(r.at);
    r.executing_s = executing_.integral_at(r.at);
    r.completed = completed_;
    r.latency_s = latency_s_;
    return r;
  }

 private:
  // A count over time and its integral up to `last`.
  struct Level {
    BatchTime last{};
    std::int64_t count = 0;
    double integral_ns = 0.0;

    // delta requests (negative: leaving) at time t; `back` is the time that those
    // entering already spent before t.
    void add(BatchTime t, std::int64_t delta, BatchDuration back) noexcept {
      if (t > last) {
        integral_ns += static_cast<double>(count) * static_cast<double>((t - last).count());
        last = t;
      }
      // An event dated before `last`: the stretch since its time was counted without it.
      integral_ns += static_cast<double>(delta) * static_cast<double>((last - t).count()) +
                     static_cast<double>(back.count());
      count += delta;
    }

    [[nodiscard]] double integral_at(BatchTime t) const noexcept {
      const double ns = integral_ns + (t > last ? static_cast<double>(count) * static_cast<double>((t - last).count()) : 0.0);
      return ns * 1e-9;
    }
  };

  mutable std::mutex mu_;
  Level in_pipeline_;
  Level executing_;
  std::uint64_t completed_ = 0;
  double latency_s_ = 0.0;
};

}  // namespace tailbatch::detail
