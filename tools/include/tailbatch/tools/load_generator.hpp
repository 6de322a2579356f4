// Load generator: open-loop load against any callable or Pipeline, with latency measured
// from when each request should have been sent.
//
// Open loop means that requests are sent on a schedule (LoadProfile: Poisson or evenly
// spaced, steady, stepped or spiking) whatever the target is doing, as real users do. A
// closed-loop tester that waits for each answer before sending the next request sends
// fewer requests exactly when the target is slow, and so never records the latency those
// requests would have seen: coordinated omission. Here every latency is taken from the
// request's intended send time, so a target that stalls for 500 ms charges that stall to
// every request that should have been sent during it, even if the generator itself could
// only send them late (a synchronous target called inline).
//
// What runs where: run_load() sends from the calling thread and blocks until the run has
// ended (the profile played out and the outstanding requests completed or timed out).
// Asynchronous targets complete on their own threads through a LoadCompletion;
// synchronous targets are called inline on the sending thread (workers == 0) or on
// `workers` threads that run_load() starts and joins before it returns. No thread outlives
// the call.
//
// Results: counts by outcome, the latency histogram of successful requests, percentiles, the
// achieved throughput, and a timeline (percentiles per interval, for "p95 over time");
// run_sweep() steps the offered rate up and finds the saturation point: the highest offered
// rate whose p95 stays within the SLO with an error rate under 1 %. The report helpers at
// the end format tables and build SVG plots (svg_plot.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <tailbatch/clock.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/tools/load_profile.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/tools/svg_plot.hpp>

namespace tailbatch {

// A snapshot of a run in progress, handed to LoadConfig::progress.
struct LoadProgress {
  std::string_view label;                  // LoadConfig::label (a sweep names its step)
  std::chrono::nanoseconds elapsed{0};     // since the run started
  std::chrono::nanoseconds planned{0};     // the profile's length
  bool draining = false;                   // all sent; waiting for the last completions
  double offered_rps = 0.0;                // the profile's rate now
  std::uint64_t sent = 0;                  // requests handed to the target so far
  std::uint64_t completed = 0;             // requests completed so far (any status)
  std::uint64_t errors = 0;                // completed with a status other than ok
  std::uint64_t outstanding = 0;           // sent, not completed
  std::chrono::nanoseconds recent_p95{0};  // p95 of the ok completions since the last report
};

using LoadProgressCallback = std::function<void(const LoadProgress&)>;

// A callback that prints one line per report to `out`, for example
//   "[load 400 rps] 12.0/30.0 s  offered 400 rps  sent 4800  done 4790  in flight 10  p95 12.3 ms"
// `out` must outlive the runs that use the callback. Allocates. The callback is called
// from the sending thread only. Thread-safe to create.
[[nodiscard]] inline LoadProgressCallback progress_to(std::ostream& out) {
  return [&out](const LoadProgress& p) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "[%.*s] %5.1f/%.1f s  offered %.0f rps  sent %llu  done %llu  errors %llu  in flight %llu  "
                  "p95 %.1f ms%s\n",
                  static_cast<int>(p.label.size()), p.label.data(),
                  std::chrono::duration<double>(p.elapsed).count(),
                  std::chrono::duration<double>(p.planned).count(), p.offered_rps,
                  static_cast<unsigned long long>(p.sent), static_cast<unsigned long long>(p.completed),
                  static_cast<unsigned long long>(p.errors), static_cast<unsigned long long>(p.outstanding),
                  std::chrono::duration<double, std::milli>(p.recent_p95).count(), p.draining ? "  (draining)" : "");
    out << buf << std::flush;
  };
}

// How a run is driven. A plain aggregate; run_load() validates it and throws
// std::invalid_argument naming the field.
struct LoadConfig {
  LoadProfile profile = LoadProfile::poisson(100.0, std::chrono::seconds(10));
  // Requests intended before this offset are sent but not counted: caches, allocators and
  // adaptive limits settle first. Must be shorter than the profile.
  std::chrono::nanoseconds warmup{0};
  // At most this many requests are sent (warm-up included); the rest of the profile is
  // skipped. Bounds a run in count as the profile bounds it in time.
  std::uint64_t max_requests = 10'000'000;
  // After the last send, wait this long for outstanding requests; those still open are
  // counted as timed out (errors). The whole run takes at most profile + drain_timeout,
  // plus however long a synchronous target's last call takes to return.
  std::chrono::nanoseconds drain_timeout = std::chrono::seconds(5);
  std::uint64_t seed = 42;
  // Synchronous targets only: the number of threads calling the target (which must then be
  // thread-safe). 0 calls it inline on the sending thread (deterministic on a ManualClock;
  // a slow call then delays the following sends, and their latency still counts from their
  // intended times).
  std::size_t workers = 0;
  // At most this many requests in flight (or queued for workers); a request due while the
  // limit is reached is not sent and counts as dropped (an error). Bounds memory under
  // overload.
  std::size_t max_outstanding = 100'000;
  // The width of one timeline bucket (raised so that a run has at most 600 buckets).
  std::chrono::nanoseconds timeline_interval = std::chrono::seconds(1);
  // Called from the sending thread every progress_interval; empty: no progress reports.
  LoadProgressCallback progress{};
  std::chrono::nanoseconds progress_interval = std::chrono::seconds(1);
  std::string label = "load";
  LatencyHistogramConfig histogram{};
};

// One timeline bucket: the requests whose intended send time falls in it.
struct LoadTimelinePoint {
  double start_s = 0.0;      // bucket start, seconds from the start of the run
  double offered_rps = 0.0;  // requests due in the bucket / its width
  double ok_rps = 0.0;       // of those, completed ok / width
  std::uint64_t errors = 0;  // of those, completed with another status (timeouts not included)
  std::chrono::nanoseconds p50{0}, p95{0}, p99{0};  // of the ok ones; 0 if none
  bool warmup = false;       // the bucket starts inside the warm-up
};

// What a run measured. Counts and latencies cover the requests intended after the warm-up.
struct LoadResult {
  double offered_rps = 0.0;     // measured requests due / measured part of the profile
  double throughput_rps = 0.0;  // ok completions / (from warm-up end to the later of the profile end and the last completion)
  std::uint64_t due = 0;        // measured requests the profile scheduled
  std::uint64_t sent = 0;       // of those, handed to the target
  std::uint64_t ok = 0;
  std::uint64_t failed = 0;     // completed with a status other than ok (see by_status)
  std::uint64_t timed_out = 0;  // still open drain_timeout after the last send
  std::uint64_t dropped = 0;    // never sent: max_outstanding was reached
  std::uint64_t by_status[5] = {0, 0, 0, 0, 0};  // completions by Status (index = enum value)
  std::uint64_t warmup_requests = 0;
  bool stopped_at_max_requests = false;
  HistogramSnapshot latency;    // ok requests: intended send time to completion
  std::chrono::nanoseconds p50{0}, p95{0}, p99{0}, p999{0}, max{0}, mean{0};
  // How late the generator itself sent, at worst (scheduling; or a synchronous target
  // called inline holding up the sends): a check on the generator, not on the target.
  std::chrono::nanoseconds max_send_lag{0};
  std::chrono::nanoseconds measured_window{0};  // the denominator of throughput_rps
  std::vector<LoadTimelinePoint> timeline;

  // (failed + timed_out + dropped) / due; 0 when nothing was due. Thread-safe.
  [[nodiscard]] double error_rate() const noexcept {
    return due == 0 ? 0.0 : static_cast<double>(failed + timed_out + dropped) / static_cast<double>(due);
  }
};

namespace tools::detail {

// The part of a run that completions touch; kept alive by every LoadCompletion, so a
// completion that arrives after run_load() has returned is harmless (it is ignored).
class LoadRunStateBase {
 public:
  virtual ~LoadRunStateBase() = default;
  virtual void complete(std::chrono::steady_clock::time_point intended, std::uint32_t bucket, bool measured,
                        Status status) noexcept = 0;
};

}  // namespace tools::detail

// Completes one request of a load run: call it exactly once, from any thread, with the
// request's final status (or true/false for ok/failed). Latency is read from the run's
// clock at the call. A copyable handle; a call after the run has ended is ignored.
// Never throws; takes the run's mutex briefly. Thread-safe.
class LoadCompletion {
 public:
  void operator()(Status status) const noexcept { state_->complete(intended_, bucket_, measured_, status); }
  void operator()(bool ok) const noexcept { (*this)(ok ? Status::ok : Status::failed); }

  // When the request should have been sent, on the run's clock. Thread-safe.
  [[nodiscard]] std::chrono::steady_clock::time_point intended() const noexcept { return intended_; }
  // Whether the request counts (intended after the warm-up). Thread-safe.
  [[nodiscard]] bool measured() const noexcept { return measured_; }

 private:
  template <class C>
  friend class LoadRunner;
  LoadCompletion(std::shared_ptr<tools::detail::LoadRunStateBase> s, std::chrono::steady_clock::time_point intended,
                 std::uint32_t bucket, bool measured) noexcept
      : state_(std::move(s)), intended_(intended), bucket_(bucket), measured_(measured) {}

  std::shared_ptr<tools::detail::LoadRunStateBase> state_;
  std::chrono::steady_clock::time_point intended_;
  std::uint32_t bucket_;
  bool measured_;
};

// An asynchronous target: target(index, done) starts request `index` and returns at once;
// done(status) is called exactly once when it completes, on any thread.
template <class F>
concept AsyncLoadTarget = std::invocable<F&, std::uint64_t, LoadCompletion>;

// A synchronous target: target(index) runs request `index` to the end and returns its
// status (Status, bool ok, Outcome<T>, or void). An exception counts as Status::failed.
template <class F>
concept SyncLoadTarget = !AsyncLoadTarget<F> && std::invocable<F&, std::uint64_t>;

template <class F>
concept LoadTarget = AsyncLoadTarget<F> || SyncLoadTarget<F>;

namespace tools::detail {

template <class R>
Status status_of_result(R&& r) noexcept {
  using T = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<T, Status>) {
    return r;
  } else if constexpr (std::is_same_v<T, bool>) {
    return r ? Status::ok : Status::failed;
  } else if constexpr (requires { { r.status() } -> std::convertible_to<Status>; }) {
    return r.status();
  } else {
    static_assert(sizeof(T) == 0, "a synchronous load target returns Status, bool, Outcome<T> or void");
  }
}

template <class F>
Status call_sync_target(F& f, std::uint64_t index) noexcept {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, std::uint64_t>>) {
      f(index);
      return Status::ok;
    } else {
      return status_of_result(f(index));
    }
  } catch (...) {
    return Status::failed;
  }
}

template <class C>
concept VirtualTimeClock = Clock<C> && requires(C& c, typename C::time_point t) { c.advance_to(t); };

}  // namespace tools::detail

// Runs one load test (see the top of the file). Normally used through run_load().
// Not thread-safe: one run at a time per runner; the runner is cheap and single-use.
template <class C>
class LoadRunner {
  using time_point = std::chrono::steady_clock::time_point;
  static_assert(std::is_same_v<typename C::time_point, time_point>,
                "the load generator's clock must use std::chrono::steady_clock time points");

  struct Bucket {
    explicit Bucket(const LatencyHistogramConfig& o) : hist(o) {}
    LatencyHistogram hist;
    std::uint64_t due = 0, ok = 0, errors = 0;
  };

  class State final : public tools::detail::LoadRunStateBase {
   public:
    State(C clock, const LatencyHistogramConfig& o) : clock_(std::move(clock)), latency(o), recent(o) {}

    void complete(time_point intended, std::uint32_t bucket, bool measured, Status status) noexcept override {
      const time_point now = clock_.now();
      const auto lat = std::chrono::duration_cast<std::chrono::nanoseconds>(now - intended);
      std::lock_guard lock(mu);
      if (closed) return;
      ++completed;
      --outstanding;
      const bool ok = status == Status::ok;
      if (!ok) ++errors;
      if (measured) {
        ++by_status[static_cast<std::size_t>(status)];
        if (ok) {
          latency.record(lat);
          last_completion = std::max(last_completion, now);
        }
      }
      if (ok) recent.record(lat);
      if (bucket < buckets.size()) {
        auto& b = *buckets[bucket];
        if (ok) {
          ++b.ok;
          b.hist.record(lat);
        } else {
          ++b.errors;
        }
      }
      if (outstanding == 0) drained.notify_all();
    }

    C clock_;
    std::mutex mu;
    std::condition_variable drained;
    bool closed = false;
    std::uint64_t completed = 0, errors = 0, outstanding = 0;
    std::uint64_t by_status[5] = {0, 0, 0, 0, 0};
    LatencyHistogram latency;
    LatencyHistogram recent;
    time_point last_completion{};
    std::vector<std::unique_ptr<Bucket>> buckets;
  };

  struct Job {
    std::uint64_t index;
    LoadCompletion done;
  };

 public:
  LoadRunner(const LoadConfig& options, C clock) : options_(options), clock_(std::move(clock)) { validate(); }

  template <LoadTarget F>
  [[nodiscard]] LoadResult run(F& target) {
    auto state = std::make_shared<State>(clock_, options_.histogram);
    const auto planned = options_.profile.duration();
    auto interval = std::max(options_.timeline_interval, std::chrono::nanoseconds(1));
    while (planned / interval > 600) interval *= 2;
    const auto bucket_count = static_cast<std::size_t>((planned + interval - std::chrono::nanoseconds(1)) / interval);
    state->buckets.reserve(bucket_count);
    for (std::size_t i = 0; i < bucket_count; ++i)
      state->buckets.push_back(std::make_unique<Bucket>(options_.histogram));

    // Workers for synchronous targets.
    std::mutex qmu;
    std::condition_variable qcv;
    std::deque<Job> queue;
    bool stop = false;
    std::vector<std::thread> workers;
    constexpr bool is_async = AsyncLoadTarget<F>;
    const bool pooled = !is_async && options_.workers > 0;
    auto join_workers = [&] {
      {
        std::lock_guard lock(qmu);
        stop = true;
      }
      qcv.notify_all();
      for (auto& w : workers) w.join();
      workers.clear();
    };
    if constexpr (!is_async) {
      if (pooled) {
        try {
          for (std::size_t i = 0; i < options_.workers; ++i)
            workers.emplace_back([&] {
              std::unique_lock lock(qmu);
              for (;;) {
                qcv.wait(lock, [&] { return stop || !queue.empty(); });
                if (stop) return;
                Job job = std::move(queue.front());
                queue.pop_front();
                lock.unlock();
                job.done(tools::detail::call_sync_target(target, job.index));
                lock.lock();
              }
            });
        } catch (...) {
          join_workers();
          throw;
        }
      }
    }

    const time_point start = clock_.now();
    const time_point warm_end = start + options_.warmup;
    time_point next_progress = start + options_.progress_interval;
    std::uint64_t issued = 0, due_measured = 0, sent_measured = 0, dropped = 0, warm = 0;
    std::chrono::nanoseconds max_lag{0};
    bool stopped_at_max = false;
    time_point last_due = start;
    ArrivalSchedule schedule(options_.profile, options_.seed);

    auto report = [&](time_point now, bool draining) {
      if (!options_.progress) return;
      LoadProgress p;
      p.label = options_.label;
      p.elapsed = now - start;
      p.planned = planned;
      p.draining = draining;
      p.offered_rps = options_.profile.rate_at(p.elapsed);
      {
        std::lock_guard lock(state->mu);
        p.sent = issued;
        p.completed = state->completed;
        p.errors = state->errors;
        p.outstanding = state->outstanding;
        p.recent_p95 = state->recent.snapshot().percentile(95.0);
        state->recent.reset();
      }
      options_.progress(p);
    };

    for (;;) {
      auto offset = schedule.next();
      if (!offset) break;
      const time_point intended = start + *offset;
      if (issued >= options_.max_requests) {
        stopped_at_max = true;
        break;
      }
      // Wait for the intended time, reporting progress on the way.
      for (;;) {
        time_point now = clock_.now();
        if (options_.progress && now >= next_progress) {
          report(now, false);
          next_progress += options_.progress_interval;
          if (next_progress <= now) next_progress = now + options_.progress_interval;
          continue;
        }
        if (now >= intended) break;
        const time_point wake = options_.progress ? std::min(intended, next_progress) : intended;
        if constexpr (tools::detail::VirtualTimeClock<C>) {
          clock_.advance_to(wake);
        } else {
          std::this_thread::sleep_until(wake);
        }
      }
      const bool measured = intended >= warm_end;
      const auto bucket = static_cast<std::uint32_t>(*offset / interval);
      last_due = intended;
      if (measured) {
        ++due_measured;
        max_lag = std::max(max_lag, std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.now() - intended));
      } else {
        ++warm;
      }
      {
        std::lock_guard lock(state->mu);
        if (bucket < state->buckets.size()) ++state->buckets[bucket]->due;
        if (state->outstanding >= options_.max_outstanding) {
          if (measured) ++dropped;
          ++issued;
          continue;
        }
        ++state->outstanding;
      }
      ++issued;
      if (measured) ++sent_measured;
      LoadCompletion done(state, intended, bucket, measured);
      if constexpr (is_async) {
        try {
          target(issued - 1, done);
        } catch (...) {
          // A target that throws has not started the request (it must not also complete
          // it): the request failed.
          done(Status::failed);
        }
      } else if (pooled) {
        {
          std::lock_guard lock(qmu);
          queue.push_back(Job{issued - 1, std::move(done)});
        }
        qcv.notify_one();
      } else {
        done(tools::detail::call_sync_target(target, issued - 1));
      }
    }

    // Drain: wait (in real time) for the outstanding requests, bounded.
    const auto drain_deadline = std::chrono::steady_clock::now() + options_.drain_timeout;
    {
      std::unique_lock lock(state->mu);
      while (state->outstanding > 0) {
        const auto real_now = std::chrono::steady_clock::now();
        if (real_now >= drain_deadline) break;
        auto step = std::chrono::duration_cast<std::chrono::nanoseconds>(drain_deadline - real_now);
        if (options_.progress) step = std::min(step, options_.progress_interval);
        state->drained.wait_for(lock, step);
        if (options_.progress && state->outstanding > 0) {
          lock.unlock();
          report(clock_.now(), true);
          lock.lock();
        }
      }
    }
    if (pooled) join_workers();

    // Close the run: later completions are ignored; what is open now timed out.
    LoadResult r;
    std::lock_guard lock(state->mu);
    state->closed = true;
    r.due = due_measured;
    r.sent = sent_measured;
    r.dropped = dropped;
    r.warmup_requests = warm;
    r.stopped_at_max_requests = stopped_at_max;
    for (std::size_t i = 0; i < 5; ++i) r.by_status[i] = state->by_status[i];
    r.ok = r.by_status[static_cast<std::size_t>(Status::ok)];
    for (std::size_t i = 0; i < 5; ++i)
      if (i != static_cast<std::size_t>(Status::ok)) r.failed += r.by_status[i];
    r.timed_out = r.sent - r.ok - r.failed;
    r.latency = state->latency.snapshot();
    const double ps[] = {50.0, 95.0, 99.0, 99.9};
    std::chrono::nanoseconds out[4];
    r.latency.percentiles(ps, out);
    r.p50 = out[0];
    r.p95 = out[1];
    r.p99 = out[2];
    r.p999 = out[3];
    r.max = r.latency.max();
    r.mean = r.latency.mean();
    r.max_send_lag = max_lag;

    const time_point profile_end = stopped_at_max ? last_due : start + planned;
    const auto offered_window = profile_end > warm_end ? profile_end - warm_end : std::chrono::nanoseconds(0);
    r.offered_rps = offered_window.count() > 0
                        ? static_cast<double>(r.due) / std::chrono::duration<double>(offered_window).count()
                        : 0.0;
    const time_point window_end = std::max(profile_end, state->last_completion);
    r.measured_window = std::chrono::duration_cast<std::chrono::nanoseconds>(
        window_end > warm_end ? window_end - warm_end : std::chrono::nanoseconds(0));
    r.throughput_rps = r.measured_window.count() > 0
                           ? static_cast<double>(r.ok) / std::chrono::duration<double>(r.measured_window).count()
                           : 0.0;
    const double width_s = std::chrono::duration<double>(interval).count();
    for (std::size_t i = 0; i < state->buckets.size(); ++i) {
      const auto& b = *state->buckets[i];
      LoadTimelinePoint p;
      p.start_s = width_s * static_cast<double>(i);
      p.offered_rps = static_cast<double>(b.due) / width_s;
      p.ok_rps = static_cast<double>(b.ok) / width_s;
      p.errors = b.errors;
      p.warmup = std::chrono::nanoseconds(interval * static_cast<std::int64_t>(i)) < options_.warmup;
      auto snap = b.hist.snapshot();
      snap.percentiles(std::span<const double>(ps, 3), std::span<std::chrono::nanoseconds>(out, 3));
      p.p50 = out[0];
      p.p95 = out[1];
      p.p99 = out[2];
      r.timeline.push_back(p);
    }
    return r;
  }

 private:
  void validate() const {
    if (options_.warmup < std::chrono::nanoseconds::zero() || options_.warmup >= options_.profile.duration())
      tailbatch::detail::throw_invalid_argument("LoadConfig: warmup must be >= 0 and shorter than the profile");
    if (options_.max_requests < 1) tailbatch::detail::throw_invalid_argument("LoadConfig: max_requests must be >= 1");
    if (options_.drain_timeout < std::chrono::nanoseconds::zero())
      tailbatch::detail::throw_invalid_argument("LoadConfig: drain_timeout must be >= 0");
    if (options_.workers > 1024) tailbatch::detail::throw_invalid_argument("LoadConfig: workers must be <= 1024");
    if (options_.max_outstanding < 1) tailbatch::detail::throw_invalid_argument("LoadConfig: max_outstanding must be >= 1");
    if (options_.timeline_interval <= std::chrono::nanoseconds::zero())
      tailbatch::detail::throw_invalid_argument("LoadConfig: timeline_interval must be > 0");
    if (options_.progress && options_.progress_interval <= std::chrono::nanoseconds::zero())
      tailbatch::detail::throw_invalid_argument("LoadConfig: progress_interval must be > 0");
  }

  LoadConfig options_;
  C clock_;
};

// Runs one open-loop load test of `target` (an AsyncLoadTarget or SyncLoadTarget) and
// returns what it measured. Blocks for the profile's length plus the drain (see LoadConfig).
// On a ManualClock (any clock with advance_to) time is virtual: the generator advances the
// clock to each send time instead of sleeping, so a test runs in microseconds and exactly
// reproducibly (use an inline synchronous target, or an async one that completes inline).
// Allocates. Throws std::invalid_argument naming a bad option, and what starting worker
// threads throws; exceptions from the target count as failed requests. Thread-safe if the
// target is (several runs may share a target).
template <LoadTarget F, Clock C = SteadyClock>
[[nodiscard]] LoadResult run_load(const LoadConfig& options, F&& target, C clock = C{}) {
  LoadRunner<C> runner(options, std::move(clock));
  return runner.run(target);
}

// An AsyncLoadTarget that submits make_request(index) to `pipeline` (a Pipeline, or
// anything with submit(Req, callback(Outcome<Resp>&&))) and completes with the outcome's
// status. The pipeline must outlive the runs that use the target. Allocates nothing per
// request beyond what submit() does. Thread-safe if make_request is.
template <class P, class MakeRequest>
[[nodiscard]] auto pipeline_target(P& pipeline, MakeRequest make_request) {
  return [&pipeline, make_request = std::move(make_request)](std::uint64_t index, LoadCompletion done) mutable {
    pipeline.submit(make_request(index), [done](auto&& outcome) noexcept { done(outcome.status()); });
  };
}

// ---- sweeps ---------------------------------------------------------------------------

// Offered rates from `from` to `to` in `count` evenly spaced steps. Allocates.
// Throws std::invalid_argument if count < 1 or the rates are not > 0. Thread-safe.
[[nodiscard]] inline std::vector<double> linear_rates(double from, double to, int count) {
  if (count < 1) tailbatch::detail::throw_invalid_argument("linear_rates: count must be >= 1");
  if (!(from > 0.0) || !(to >= from)) tailbatch::detail::throw_invalid_argument("linear_rates: need 0 < from <= to");
  std::vector<double> r;
  for (int i = 0; i < count; ++i)
    r.push_back(count == 1 ? from : from + (to - from) * static_cast<double>(i) / static_cast<double>(count - 1));
  return r;
}

// How a sweep runs: each rate in turn, each for step_duration (warm-up included).
struct SweepConfig {
  std::vector<double> rates;  // offered rates, requests per second; run in ascending order
  ArrivalProcess process = ArrivalProcess::poisson;
  std::chrono::nanoseconds step_duration = std::chrono::seconds(5);
  std::chrono::nanoseconds warmup = std::chrono::seconds(1);
  double slo_p95_ms = 100.0;
  double max_error_rate = 0.01;  // "error rate under 1 %"
  // Stop after this many failing rates in a row: past saturation, more load only queues.
  int stop_after_failures = 1;
  // Idle time between rates, so that one rate's backlog does not spill into the next.
  std::chrono::nanoseconds pause{0};
  // Everything else (drain, workers, seed, progress, histogram). Its profile, warmup and
  // label are replaced per rate; the seed is offset by the step's index.
  LoadConfig base{};
};

struct SweepPoint {
  double offered_rps = 0.0;  // the rate asked for
  LoadResult result;
  bool meets_slo = false;    // p95 <= SLO and error rate < max_error_rate
  std::string verdict;       // "ok", "p95 212.0 ms > SLO 100.0 ms", "errors 3.1 % >= 1 %"
};

struct SweepResult {
  std::vector<SweepPoint> points;
  // The saturation point: the highest offered rate such that it and every lower rate met
  // the SLO. Unset when even the lowest rate failed.
  std::optional<std::size_t> saturation;
  double slo_p95_ms = 0.0;
  double max_error_rate = 0.01;

  [[nodiscard]] const SweepPoint* saturation_point() const noexcept {
    return saturation ? &points[*saturation] : nullptr;
  }
};

namespace tools::detail {
inline std::string sweep_verdict(const LoadResult& r, double slo_ms, double max_err, bool& meets) {
  char buf[128];
  const double p95 = std::chrono::duration<double, std::milli>(r.p95).count();
  if (r.error_rate() >= max_err) {
    std::snprintf(buf, sizeof buf, "errors %.1f %% >= %.1f %%", r.error_rate() * 100.0, max_err * 100.0);
    meets = false;
  } else if (r.ok == 0) {
    std::snprintf(buf, sizeof buf, "no request completed");
    meets = false;
  } else if (p95 > slo_ms) {
    std::snprintf(buf, sizeof buf, "p95 %.1f ms > SLO %.1f ms", p95, slo_ms);
    meets = false;
  } else {
    std::snprintf(buf, sizeof buf, "ok");
    meets = true;
  }
  return buf;
}
}  // namespace tools::detail

// Runs a QPS sweep: run_load() at each rate of options.rates (ascending), judging each
// against the SLO, and finds the saturation point. Blocks for the whole sweep. Allocates.
// Throws std::invalid_argument naming a bad option. Thread-safe if the target is.
template <LoadTarget F, Clock C = SteadyClock>
[[nodiscard]] SweepResult run_sweep(const SweepConfig& options, F&& target, C clock = C{}) {
  if (options.rates.empty()) tailbatch::detail::throw_invalid_argument("SweepConfig: rates must not be empty");
  for (double r : options.rates)
    if (!(r > 0.0) || !std::isfinite(r)) tailbatch::detail::throw_invalid_argument("SweepConfig: rates must be > 0");
  if (!(options.slo_p95_ms > 0.0)) tailbatch::detail::throw_invalid_argument("SweepConfig: slo_p95_ms must be > 0");
  if (!(options.max_error_rate > 0.0 && options.max_error_rate <= 1.0))
    tailbatch::detail::throw_invalid_argument("SweepConfig: max_error_rate must be in (0, 1]");
  if (options.stop_after_failures < 1) tailbatch::detail::throw_invalid_argument("SweepConfig: stop_after_failures must be >= 1");
  if (options.step_duration <= options.warmup)
    tailbatch::detail::throw_invalid_argument("SweepConfig: step_duration must be longer than warmup");
  std::vector<double> rates = options.rates;
  std::sort(rates.begin(), rates.end());

  SweepResult out;
  out.slo_p95_ms = options.slo_p95_ms;
  out.max_error_rate = options.max_error_rate;
  int failures_in_a_row = 0;
  bool all_ok_so_far = true;
  for (std::size_t i = 0; i < rates.size(); ++i) {
    LoadConfig o = options.base;
    o.profile = LoadProfile::steady(options.process, rates[i], options.step_duration);
    o.warmup = options.warmup;
    o.seed = options.base.seed + i;
    char label[64];
    std::snprintf(label, sizeof label, "%s %.0f rps %zu/%zu", options.base.label.c_str(), rates[i], i + 1,
                  rates.size());
    o.label = label;
    SweepPoint p;
    p.offered_rps = rates[i];
    p.result = run_load(o, target, clock);
    p.verdict = tools::detail::sweep_verdict(p.result, options.slo_p95_ms, options.max_error_rate, p.meets_slo);
    out.points.push_back(std::move(p));
    if (out.points.back().meets_slo) {
      failures_in_a_row = 0;
      if (all_ok_so_far) out.saturation = i;
    } else {
      all_ok_so_far = false;
      if (++failures_in_a_row >= options.stop_after_failures) break;
    }
    if (options.pause > std::chrono::nanoseconds::zero() && i + 1 < rates.size()) {
      if constexpr (tools::detail::VirtualTimeClock<C>) {
        clock.advance_to(clock.now() + options.pause);
      } else {
        std::this_thread::sleep_for(options.pause);
      }
    }
  }
  return out;
}

// ---- reports --------------------------------------------------------------------------

namespace tools::detail {
inline double ms(std::chrono::nanoseconds d) noexcept { return std::chrono::duration<double, std::milli>(d).count(); }
}  // namespace tools::detail

// One run as a few readable lines. Allocates. Thread-safe.
[[nodiscard]] inline std::string format_load_result(const LoadResult& r) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "offered %.1f rps, throughput %.1f rps (ok)\n"
                "latency from intended send: p50 %.2f ms  p95 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms\n"
                "requests: %llu due, %llu ok, %llu failed, %llu timed out, %llu dropped; error rate %.2f %%; "
                "%llu warm-up requests not counted\n",
                r.offered_rps, r.throughput_rps, tools::detail::ms(r.p50), tools::detail::ms(r.p95), tools::detail::ms(r.p99),
                tools::detail::ms(r.p999), tools::detail::ms(r.max), static_cast<unsigned long long>(r.due),
                static_cast<unsigned long long>(r.ok), static_cast<unsigned long long>(r.failed),
                static_cast<unsigned long long>(r.timed_out), static_cast<unsigned long long>(r.dropped),
                r.error_rate() * 100.0, static_cast<unsigned long long>(r.warmup_requests));
  return buf;
}

// A sweep as a table: one row per rate, the saturation point marked "<- saturation".
// Allocates. Thread-safe.
[[nodiscard]] inline std::string format_sweep_table(const SweepResult& s) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%10s %10s %9s %9s %9s %9s %8s  %s\n", "offered", "achieved", "p50", "p95", "p99",
                "max", "errors", "verdict");
  out += buf;
  std::snprintf(buf, sizeof buf, "%10s %10s %9s %9s %9s %9s %8s\n", "rps", "rps", "ms", "ms", "ms", "ms", "%");
  out += buf;
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    const auto& p = s.points[i];
    const auto& r = p.result;
    std::snprintf(buf, sizeof buf, "%10.0f %10.1f %9.2f %9.2f %9.2f %9.2f %8.2f  %s%s\n", p.offered_rps,
                  r.throughput_rps, tools::detail::ms(r.p50), tools::detail::ms(r.p95), tools::detail::ms(r.p99), tools::detail::ms(r.max),
                  r.error_rate() * 100.0, p.verdict.c_str(),
                  s.saturation && *s.saturation == i ? "   <- saturation" : "");
    out += buf;
  }
  if (const auto* sat = s.saturation_point()) {
    std::snprintf(buf, sizeof buf,
                  "saturation point: %.0f rps offered (%.1f rps achieved) is the highest rate with p95 <= %.1f ms "
                  "and errors < %.1f %%\n",
                  sat->offered_rps, sat->result.throughput_rps, s.slo_p95_ms, s.max_error_rate * 100.0);
  } else {
    std::snprintf(buf, sizeof buf, "saturation point: none; even the lowest rate missed the SLO (p95 <= %.1f ms)\n",
                  s.slo_p95_ms);
  }
  out += buf;
  return out;
}

// Adds p50/p95/p99 (or a subset) of a sweep to a latency-vs-load plot, named
// "<prefix> p95" and so on; p95 solid, the others dashed, all in `color`. Allocates.
// Thread-safe.
inline void add_sweep_latency_series(LinePlot& plot, const SweepResult& s, const std::string& prefix,
                                     const std::string& color, bool with_p50 = true, bool with_p99 = true) {
  auto series = [&](const char* name, auto pick, bool dashed) {
    PlotSeries ps;
    ps.name = prefix.empty() ? std::string(name) : prefix + " " + name;
    ps.color = color;
    ps.dashed = dashed;
    for (const auto& p : s.points) ps.points.push_back({p.offered_rps, tools::detail::ms(pick(p.result))});
    plot.series.push_back(std::move(ps));
  };
  if (with_p50) series("p50", [](const LoadResult& r) { return r.p50; }, true);
  series("p95", [](const LoadResult& r) { return r.p95; }, false);
  if (with_p99) series("p99", [](const LoadResult& r) { return r.p99; }, true);
}

// Latency percentiles against offered load for one sweep, with the SLO and the saturation
// point drawn in. Log y axis: past saturation latency grows by orders of magnitude.
// Allocates. Thread-safe.
[[nodiscard]] inline LinePlot latency_vs_load_plot(const SweepResult& s, std::string title, std::string subtitle = {}) {
  LinePlot plot;
  plot.title = std::move(title);
  plot.subtitle = std::move(subtitle);
  plot.x_label = "offered load (requests/s)";
  plot.y_label = "latency from intended send (ms)";
  plot.y_scale = AxisScale::log;
  plot.x_min = 0.0;
  PlotSeries p50{"p50", {}, tools::detail::plot_palette[0], false, true};
  PlotSeries p95{"p95", {}, tools::detail::plot_palette[1], false, true};
  PlotSeries p99{"p99", {}, tools::detail::plot_palette[3], false, true};
  for (const auto& p : s.points) {
    p50.points.push_back({p.offered_rps, tools::detail::ms(p.result.p50)});
    p95.points.push_back({p.offered_rps, tools::detail::ms(p.result.p95)});
    p99.points.push_back({p.offered_rps, tools::detail::ms(p.result.p99)});
  }
  plot.series = {p50, p95, p99};
  char buf[96];
  std::snprintf(buf, sizeof buf, "SLO p95 %.0f ms", s.slo_p95_ms);
  plot.horizontal.push_back({s.slo_p95_ms, buf, "#b22222"});
  if (const auto* sat = s.saturation_point()) {
    std::snprintf(buf, sizeof buf, "saturation %.0f rps", sat->offered_rps);
    plot.vertical.push_back({sat->offered_rps, buf, "#555555"});
  }
  return plot;
}

// Achieved throughput against offered load (with the ideal y = x), for one or more sweeps
// (names[i] labels sweeps[i]). Allocates. Thread-safe.
[[nodiscard]] inline LinePlot throughput_vs_load_plot(const std::vector<const SweepResult*>& sweeps,
                                                      const std::vector<std::string>& names, std::string title,
                                                      std::string subtitle = {}) {
  LinePlot plot;
  plot.title = std::move(title);
  plot.subtitle = std::move(subtitle);
  plot.x_label = "offered load (requests/s)";
  plot.y_label = "achieved throughput (requests/s)";
  plot.x_min = 0.0;
  plot.y_min = 0.0;
  double hi = 0.0;
  for (std::size_t i = 0; i < sweeps.size(); ++i) {
    PlotSeries ps;
    ps.name = i < names.size() ? names[i] : "sweep " + std::to_string(i + 1);
    for (const auto& p : sweeps[i]->points) {
      ps.points.push_back({p.offered_rps, p.result.throughput_rps});
      hi = std::max(hi, p.offered_rps);
    }
    plot.series.push_back(std::move(ps));
  }
  plot.series.push_back(PlotSeries{"offered (ideal)", {{0.0, 0.0}, {hi, hi}}, "#999999", true, false});
  return plot;
}

// p50/p95/p99 over time for one run (by intended send time), with the SLO (if > 0) and the
// end of the warm-up drawn in. Allocates. Thread-safe.
[[nodiscard]] inline LinePlot latency_over_time_plot(const LoadResult& r, double slo_p95_ms, std::string title,
                                                     std::string subtitle = {}) {
  LinePlot plot;
  plot.title = std::move(title);
  plot.subtitle = std::move(subtitle);
  plot.x_label = "time since start, by intended send time (s)";
  plot.y_label = "latency (ms)";
  plot.x_min = 0.0;
  PlotSeries p50{"p50", {}, tools::detail::plot_palette[0], true, true};
  PlotSeries p95{"p95", {}, tools::detail::plot_palette[1], false, true};
  PlotSeries p99{"p99", {}, tools::detail::plot_palette[3], true, true};
  double warm_end = -1.0, width = 0.0;
  for (std::size_t i = 0; i < r.timeline.size(); ++i) {
    const auto& t = r.timeline[i];
    if (i + 1 < r.timeline.size()) width = r.timeline[i + 1].start_s - t.start_s;
    const double mid = t.start_s + width / 2.0;
    if (t.warmup) warm_end = t.start_s + width;
    if (t.ok_rps <= 0.0) continue;
    p50.points.push_back({mid, tools::detail::ms(t.p50)});
    p95.points.push_back({mid, tools::detail::ms(t.p95)});
    p99.points.push_back({mid, tools::detail::ms(t.p99)});
  }
  plot.series = {p50, p95, p99};
  if (!r.timeline.empty()) plot.x_max = r.timeline.back().start_s + width;
  if (slo_p95_ms > 0.0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "SLO p95 %.0f ms", slo_p95_ms);
    plot.horizontal.push_back({slo_p95_ms, buf, "#b22222"});
  }
  if (warm_end > 0.0) plot.vertical.push_back({warm_end, "warm-up ends", "#555555"});
  return plot;
}

}  // namespace tailbatch
