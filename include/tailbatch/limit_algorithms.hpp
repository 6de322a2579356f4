// Limit algorithms: how a ConcurrencyLimiter decides how much work may be in flight.
//
// A limit algorithm is a small, single-threaded decision object. The limiter collects the
// round-trip times (RTTs) of completed work into sample windows and, once per window, hands
// the closed window to the algorithm, which returns the new limit. The algorithm never sees
// the hot path: acquiring and releasing a permit only touch atomics in the limiter.
//
// Three algorithms ship:
//   StaticLimit    a fixed cap (size it with Little's law: in flight = throughput x latency);
//   AimdLimit      additive increase while the limit is used and latency is fine,
//                  multiplicative decrease on drops, timeouts and latency over a target
//                  (Netflix concurrency-limits' AIMDLimit, made window-based);
//   GradientLimit  the limit follows the ratio of a measured minimum RTT to the current RTT,
//                  plus a queue allowance, smoothed, with periodic, jittered min-RTT probes
//                  (Netflix Gradient2Limit and Envoy's adaptive concurrency gradient
//                  controller).
// docs/concurrency-limiter.md compares every parameter's default with Netflix's and Envoy's.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <tailbatch/detail/limiter/window.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/throw.hpp>
#include <type_traits>

namespace tailbatch {

namespace detail {
struct LimitWindowAccess;
}

// The largest limit any algorithm may set (in-flight counts are packed into 32 bits).
inline constexpr std::uint32_t kMaxConcurrencyLimit = std::uint32_t{1} << 30;

// One closed sample window: the completed work the limiter observed between start() and
// end(), summarised. A value type (about 1 KiB); not thread-safe. Tests build windows by hand
// with add(); the limiter builds them from its shards.
class LimitWindow {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // An empty window. Never allocates.
  LimitWindow() noexcept = default;
  // An empty window spanning [start, end] while `limit` was in force. Never allocates.
  LimitWindow(time_point start, time_point end, std::uint32_t limit) noexcept
      : start_(start), end_(end), limit_(limit) {}

  // Adds one sample: the work's RTT, the in-flight count when it was admitted (itself
  // included), and whether it was dropped (timed out, shed, deadline exceeded). Negative RTTs
  // count as zero. Never allocates. Not thread-safe.
  void add(std::chrono::nanoseconds rtt, std::uint32_t in_flight = 0,
           bool dropped = false) noexcept {
    const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(rtt.count(), 0));
    ++buckets_[detail::rtt_bucket(ns)];
    ++count_;
    sum_ns_ += ns;
    if (dropped) ++drops_;
    max_in_flight_ = std::max(max_in_flight_, in_flight);
    min_ns_ = std::min(min_ns_, ns);
    max_ns_ = std::max(max_ns_, ns);
  }

  // Samples in the window, dropped ones included.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }
  // Samples that reported a drop.
  [[nodiscard]] std::uint64_t drops() const noexcept { return drops_; }
  // The highest in-flight count at which a sample of this window was admitted: how much of
  // the limit was actually used.
  [[nodiscard]] std::uint32_t max_in_flight() const noexcept { return max_in_flight_; }
  // Exact smallest, largest and mean RTT; zero when empty.
  [[nodiscard]] std::chrono::nanoseconds min_rtt() const noexcept {
    return count_ == 0 ? std::chrono::nanoseconds{0} : ns(min_ns_);
  }
  [[nodiscard]] std::chrono::nanoseconds max_rtt() const noexcept { return ns(max_ns_); }
  [[nodiscard]] std::chrono::nanoseconds mean_rtt() const noexcept {
    return count_ == 0 ? std::chrono::nanoseconds{0} : ns(sum_ns_ / count_);
  }
  // The p-th percentile RTT (p in [0, 100]), within 6.25 % and clamped to [min, max], so
  // that a window of equal samples reports that value exactly. Zero when empty. O(buckets).
  [[nodiscard]] std::chrono::nanoseconds percentile(double p) const noexcept {
    if (count_ == 0) return std::chrono::nanoseconds{0};
    p = std::clamp(p, 0.0, 100.0);
    auto rank = static_cast<std::uint64_t>(detail::ceil(p / 100.0 * static_cast<double>(count_)));
    rank = std::clamp<std::uint64_t>(rank, 1, count_);
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      seen += buckets_[b];
      if (seen >= rank) return ns(std::clamp(detail::rtt_bucket_value(b), min_ns_, max_ns_));
    }
    return ns(max_ns_);
  }

  [[nodiscard]] time_point start() const noexcept { return start_; }
  [[nodiscard]] time_point end() const noexcept { return end_; }
  [[nodiscard]] std::chrono::nanoseconds duration() const noexcept { return end_ - start_; }
  // The limit that was in force while the window was open.
  [[nodiscard]] std::uint32_t limit() const noexcept { return limit_; }

 private:
  friend struct detail::LimitWindowAccess;

  static std::chrono::nanoseconds ns(std::uint64_t v) noexcept {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(v, std::numeric_limits<std::int64_t>::max())));
  }

  // Folds one shard in and clears it (exchange, so that a sample racing the close is kept
  // for a later window rather than lost).
  void drain(detail::WindowShard& s) noexcept {
    const auto n = s.count.exchange(0, std::memory_order_acquire);
    if (n == 0) return;
    count_ += n;
    drops_ += s.drops.exchange(0, std::memory_order_relaxed);
    sum_ns_ += s.sum_ns.exchange(0, std::memory_order_relaxed);
    max_in_flight_ =
        std::max(max_in_flight_, s.max_in_flight.exchange(0, std::memory_order_relaxed));
    min_ns_ = std::min(min_ns_, s.min_ns.exchange(std::numeric_limits<std::uint64_t>::max(),
                                                  std::memory_order_relaxed));
    max_ns_ = std::max(max_ns_, s.max_ns.exchange(0, std::memory_order_relaxed));
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (s.buckets[b].load(std::memory_order_relaxed) != 0)
        buckets_[b] += s.buckets[b].exchange(0, std::memory_order_relaxed);
    }
  }

  time_point start_{};
  time_point end_{};
  std::uint32_t limit_ = 0;
  std::uint32_t max_in_flight_ = 0;
  std::uint64_t count_ = 0;
  std::uint64_t drops_ = 0;
  std::uint64_t sum_ns_ = 0;
  std::uint64_t min_ns_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t max_ns_ = 0;
  std::array<std::uint32_t, detail::kRttBuckets> buckets_{};
};

// What the next sample window must hold before the limiter closes it and consults the
// algorithm: at least min_duration of time AND at least min_samples samples. With
// fresh_only, only work admitted after the window opened is counted (a min-RTT probe must
// not learn from requests admitted under the previous, larger limit).
struct WindowSpec {
  std::chrono::nanoseconds min_duration{0};
  std::uint32_t min_samples = 1;
  bool fresh_only = false;
};

// What a ConcurrencyLimiter needs of its limit algorithm.
//   A::learns            constexpr bool; false: the limiter never times work or opens
//                        windows (StaticLimit), so its hot path is a bare atomic counter.
//   limit()              the current limit, >= 1 (0 only where the algorithm pins it so).
//   max_limit()          the largest limit it can ever return (for capacity checks).
//   next_window()        the shape of the next sample window.
//   on_window(window)    called once per closed window, by one thread at a time (the
//                        limiter serialises calls); returns the new limit, in
//                        [0, kMaxConcurrencyLimit]. Must not throw.
// The algorithm is owned by the limiter and needs no synchronisation of its own.
template <class A>
concept LimitAlgorithm = std::move_constructible<A> &&
    requires(A& a, const A& ca, const LimitWindow& w) {
  typename std::bool_constant<A::learns>;
  { ca.limit() }
  noexcept->std::same_as<std::uint32_t>;
  { ca.max_limit() }
  noexcept->std::same_as<std::uint32_t>;
  { ca.next_window() }
  noexcept->std::same_as<WindowSpec>;
  { a.on_window(w) }
  noexcept->std::same_as<std::uint32_t>;
};

// ---------------------------------------------------------------------------------------
// StaticLimit

// A fixed limit. The limiter does not time work under it: permits cost one atomic
// compare-exchange to acquire and one atomic decrement to release. Copyable; not
// thread-safe (owned by one limiter).
class StaticLimit {
 public:
  static constexpr bool learns = false;

  // Throws std::invalid_argument unless 1 <= limit <= kMaxConcurrencyLimit.
  explicit StaticLimit(std::uint32_t limit) : limit_(limit) {
    if (limit < 1) detail::throw_invalid_argument("StaticLimit: limit must be >= 1");
    if (limit > kMaxConcurrencyLimit)
      detail::throw_invalid_argument("StaticLimit: limit must be <= kMaxConcurrencyLimit (2^30)");
  }

  [[nodiscard]] std::uint32_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return limit_; }
  [[nodiscard]] WindowSpec next_window() const noexcept { return {}; }
  std::uint32_t on_window(const LimitWindow&) noexcept { return limit_; }

 private:
  std::uint32_t limit_;
};

// ---------------------------------------------------------------------------------------
// AimdLimit

// AIMD parameters. Defaults in brackets are Netflix concurrency-limits' AIMDLimit (which has
// no latency target and updates on every sample unless wrapped in a WindowedLimit).
struct AimdLimitConfig {
  std::uint32_t initial_limit = 20;  // [20]
  std::uint32_t min_limit = 1;       // [20]
  std::uint32_t max_limit = 200;     // [200]
  // Multiplicative decrease: limit = max(min_limit, min(limit - 1, floor(limit * ratio))).
  double backoff_ratio = 0.9;  // [0.9; must be in [0.5, 1)]
  // Additive increase per window in which the limit was used and latency was fine.
  std::uint32_t increase = 1;  // [+1 per sample]
  // A window holding a sample slower than this counts as a drop. Zero: no timeout.
  std::chrono::nanoseconds timeout = std::chrono::seconds(5);  // [5 s]
  // A window whose target_percentile RTT exceeds this decreases the limit. Zero: no target
  // (drops and timeouts alone decrease it, as in Netflix's AIMDLimit).
  std::chrono::nanoseconds latency_target{0};  // [none]
  double target_percentile = 95.0;             // [none]
  // The limit only grows when some sample of the window was admitted with at least
  // utilization * limit in flight: an idle service must not inflate its limit.
  double utilization = 0.5;  // [0.5: inflight * 2 >= limit]
  // Sample windows [WindowedLimit: 1 s, at least 10 samples].
  std::chrono::nanoseconds window = std::chrono::milliseconds(250);
  std::uint32_t min_window_samples = 10;
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using AimdConfig [[deprecated("renamed AimdLimitConfig")]] = AimdLimitConfig;

// Additive increase, multiplicative decrease, once per window: the classic TCP saw-tooth.
// Copyable; not thread-safe (owned by one limiter).
class AimdLimit {
 public:
  static constexpr bool learns = true;

  // Throws std::invalid_argument naming the first bad field.
  explicit AimdLimit(AimdLimitConfig config = {}) : config_(config), limit_(config.initial_limit) {
    const auto& c = config_;
    if (c.min_limit < 1) detail::throw_invalid_argument("AimdLimit: min_limit must be >= 1");
    if (c.max_limit > kMaxConcurrencyLimit)
      detail::throw_invalid_argument("AimdLimit: max_limit must be <= kMaxConcurrencyLimit (2^30)");
    if (c.max_limit < c.min_limit)
      detail::throw_invalid_argument("AimdLimit: max_limit must be >= min_limit");
    if (c.initial_limit < c.min_limit || c.initial_limit > c.max_limit)
      detail::throw_invalid_argument("AimdLimit: initial_limit must be in [min_limit, max_limit]");
    if (!(c.backoff_ratio >= 0.5 && c.backoff_ratio < 1.0))
      detail::throw_invalid_argument("AimdLimit: backoff_ratio must be in [0.5, 1)");
    if (c.increase < 1) detail::throw_invalid_argument("AimdLimit: increase must be >= 1");
    if (c.timeout.count() < 0) detail::throw_invalid_argument("AimdLimit: timeout must be >= 0");
    if (c.latency_target.count() < 0)
      detail::throw_invalid_argument("AimdLimit: latency_target must be >= 0");
    if (!(c.target_percentile > 0.0 && c.target_percentile <= 100.0))
      detail::throw_invalid_argument("AimdLimit: target_percentile must be in (0, 100]");
    if (!(c.utilization >= 0.0 && c.utilization <= 1.0))
      detail::throw_invalid_argument("AimdLimit: utilization must be in [0, 1]");
    if (c.window.count() <= 0) detail::throw_invalid_argument("AimdLimit: window must be > 0");
    if (c.min_window_samples < 1)
      detail::throw_invalid_argument("AimdLimit: min_window_samples must be >= 1");
  }

  [[nodiscard]] std::uint32_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return config_.max_limit; }
  [[nodiscard]] const AimdLimitConfig& config() const noexcept { return config_; }
  [[nodiscard]] WindowSpec next_window() const noexcept {
    return {config_.window, config_.min_window_samples, false};
  }

  // Decreases on a drop, a timeout or latency over target; else increases when the limit
  // was used; else keeps it. An empty window changes nothing.
  std::uint32_t on_window(const LimitWindow& w) noexcept {
    if (w.count() == 0) return limit_;
    const bool timed_out = config_.timeout.count() > 0 && w.max_rtt() > config_.timeout;
    const bool slow = config_.latency_target.count() > 0 &&
                      w.percentile(config_.target_percentile) > config_.latency_target;
    if (w.drops() > 0 || timed_out || slow) {
      const auto backed_off =
          static_cast<std::uint32_t>(detail::floor(limit_ * config_.backoff_ratio));
      limit_ = std::max(config_.min_limit, std::min(limit_ - 1, backed_off));
    } else if (static_cast<double>(w.max_in_flight()) >= config_.utilization * limit_) {
      limit_ = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(config_.max_limit, std::uint64_t{limit_} + config_.increase));
    }
    return limit_;
  }

 private:
  AimdLimitConfig config_;
  std::uint32_t limit_;
};

// ---------------------------------------------------------------------------------------
// GradientLimit

// Gradient parameters. In brackets: Netflix Gradient2Limit's default; Envoy adaptive
// concurrency gradient controller's default.
struct GradientLimitConfig {
  std::uint32_t initial_limit = 20;  // [20; Envoy starts at min_concurrency = 3]
  std::uint32_t min_limit = 3;       // [20; 3 (min_concurrency / min_concurrency_limit)]
  std::uint32_t max_limit = 1000;    // [200; 1000 (max_concurrency_limit)]
  // new = limit * (1 - smoothing) + (limit * gradient + allowance) * smoothing.
  double smoothing = 0.2;  // [0.2; none, i.e. 1.0]
  // Latency up to min_rtt * (1 + min_rtt_buffer) is no sign of queueing.
  double min_rtt_buffer = 0.25;  // [rttTolerance 1.5, i.e. 0.5; buffer 25 %]
  // gradient = clamp(min_rtt * (1 + buffer) / sample_rtt, min_gradient, max_gradient).
  double min_gradient = 0.5;  // [0.5; 0.5]
  double max_gradient = 2.0;  // [1.0; 2.0]
  // Queue allowance added each window: fixed + sqrt_scale * sqrt(limit).
  double queue_allowance_sqrt_scale = 1.0;  // [0; 1.0: sqrt(limit)]
  double queue_allowance_fixed = 0.0;       // [4; 0]
  // The window's RTT is this percentile of its samples.
  double sample_percentile = 50.0;  // [mean; 50 (sample_aggregate_percentile)]
  // Sample windows [1 s and >= 10 samples; concurrency_update_interval, required].
  std::chrono::nanoseconds window = std::chrono::milliseconds(250);
  std::uint32_t min_window_samples = 10;
  // No growth while every sample of the window was admitted below this fraction of the limit
  // (the service is not using its limit; growing it would only let a later burst through).
  double app_limited_fraction = 0.5;  // [0.5 (and no decrease either); none]
  // Minimum-RTT probes: every probe_interval plus a random delay in
  // [0, probe_jitter * probe_interval), the limit is pinned to probe_concurrency until
  // probe_samples fresh samples are in; their sample_percentile becomes the min RTT and the
  // previous limit is restored. Netflix Gradient2 does not probe: it compares against a
  // long-term average instead.
  std::chrono::nanoseconds probe_interval = std::chrono::seconds(60);  // [-; interval, required]
  double probe_jitter = 0.15;                                          // [-; 15 %]
  std::uint32_t probe_samples = 50;                                    // [-; request_count 50]
  // Zero: do not pin the limit while probing, measure live traffic (Envoy's behaviour when
  // min_concurrency_limit is configured separately).
  std::uint32_t probe_concurrency = 3;  // [-; min_concurrency 3]
  // Probe at once when the limit sat at min_limit for this many consecutive windows (the
  // min RTT is probably stale). Zero: never.
  std::uint32_t reprobe_after_windows_at_min = 5;  // [-; 5, fixed]
  // Seed of the jitter generator; unset: seeded from the steady and system clocks' readings
  // at construction and the limit's own address (mixed, so nanoseconds apart or a different
  // address give unrelated schedules), so that replicas do not probe in step. Set it in
  // tests for a deterministic schedule.
  std::optional<std::uint64_t> seed;
};
// The old name compiles, with a deprecation warning, until the next minor version (CHANGELOG.md).
using GradientConfig [[deprecated("renamed GradientLimitConfig")]] = GradientLimitConfig;

// A latency-gradient limit: grows while the RTT stays near the measured minimum, shrinks as
// queueing inflates it. Copyable; not thread-safe (owned by one limiter).
class GradientLimit {
 public:
  static constexpr bool learns = true;
  using time_point = std::chrono::steady_clock::time_point;

  // Starts with a min-RTT probe (nothing is known yet). Throws std::invalid_argument naming
  // the first bad field.
  explicit GradientLimit(GradientLimitConfig config = {}) : config_(config) {
    const auto& c = config_;
    auto bad = [](const char* what) { detail::throw_invalid_argument(what); };
    if (c.min_limit < 1) bad("GradientLimit: min_limit must be >= 1");
    if (c.max_limit > kMaxConcurrencyLimit)
      bad("GradientLimit: max_limit must be <= kMaxConcurrencyLimit (2^30)");
    if (c.max_limit < c.min_limit) bad("GradientLimit: max_limit must be >= min_limit");
    if (c.initial_limit < c.min_limit || c.initial_limit > c.max_limit)
      bad("GradientLimit: initial_limit must be in [min_limit, max_limit]");
    if (!(c.smoothing > 0.0 && c.smoothing <= 1.0))
      bad("GradientLimit: smoothing must be in (0, 1]");
    if (!(c.min_rtt_buffer >= 0.0 && detail::is_finite(c.min_rtt_buffer)))
      bad("GradientLimit: min_rtt_buffer must be >= 0");
    if (!(c.min_gradient > 0.0 && c.min_gradient <= 1.0))
      bad("GradientLimit: min_gradient must be in (0, 1]");
    if (!(c.max_gradient >= 1.0 && detail::is_finite(c.max_gradient)))
      bad("GradientLimit: max_gradient must be >= 1");
    if (!(c.queue_allowance_sqrt_scale >= 0.0 && detail::is_finite(c.queue_allowance_sqrt_scale)))
      bad("GradientLimit: queue_allowance_sqrt_scale must be >= 0");
    if (!(c.queue_allowance_fixed >= 0.0 && detail::is_finite(c.queue_allowance_fixed)))
      bad("GradientLimit: queue_allowance_fixed must be >= 0");
    if (!(c.sample_percentile > 0.0 && c.sample_percentile <= 100.0))
      bad("GradientLimit: sample_percentile must be in (0, 100]");
    if (c.window.count() <= 0) bad("GradientLimit: window must be > 0");
    if (c.min_window_samples < 1) bad("GradientLimit: min_window_samples must be >= 1");
    if (!(c.app_limited_fraction >= 0.0 && c.app_limited_fraction <= 1.0))
      bad("GradientLimit: app_limited_fraction must be in [0, 1]");
    if (c.probe_interval.count() <= 0) bad("GradientLimit: probe_interval must be > 0");
    if (!(c.probe_jitter >= 0.0 && c.probe_jitter <= 1.0))
      bad("GradientLimit: probe_jitter must be in [0, 1]");
    if (c.probe_samples < 1) bad("GradientLimit: probe_samples must be >= 1");
    if (c.probe_concurrency > c.max_limit)
      bad("GradientLimit: probe_concurrency must be <= max_limit");
    rng_state_ = c.seed ? *c.seed : unseeded_state();
    estimate_ = c.initial_limit;
    enter_probe();
  }

  [[nodiscard]] std::uint32_t limit() const noexcept {
    return static_cast<std::uint32_t>(estimate_);
  }
  [[nodiscard]] std::uint32_t max_limit() const noexcept { return config_.max_limit; }
  [[nodiscard]] const GradientLimitConfig& config() const noexcept { return config_; }
  [[nodiscard]] WindowSpec next_window() const noexcept {
    if (probing_) return {std::chrono::nanoseconds{0}, config_.probe_samples, true};
    return {config_.window, config_.min_window_samples, false};
  }

  // True while a min-RTT probe is collecting samples.
  [[nodiscard]] bool probing() const noexcept { return probing_; }
  // The min RTT measured by the last completed probe; zero before the first.
  [[nodiscard]] std::chrono::nanoseconds min_rtt() const noexcept { return min_rtt_; }
  // The RTT of the last regular window (its sample_percentile).
  [[nodiscard]] std::chrono::nanoseconds sample_rtt() const noexcept { return sample_rtt_; }
  // The gradient used by the last regular window; 1 before any.
  [[nodiscard]] double gradient() const noexcept { return gradient_; }
  // When the next probe is due (it starts at the first window that closes at or after
  // this time). time_point::max() while probing.
  [[nodiscard]] time_point next_probe_at() const noexcept { return next_probe_at_; }
  // Probes completed so far.
  [[nodiscard]] std::uint64_t probes_completed() const noexcept { return probes_completed_; }

  std::uint32_t on_window(const LimitWindow& w) noexcept {
    if (probing_) {
      if (w.count() >= config_.probe_samples) finish_probe(w);
      return limit();
    }
    if (w.end() >= next_probe_at_) {
      // Probe now; this window's samples were taken under the limit the probe saves.
      enter_probe();
      return limit();
    }
    if (w.count() == 0) return limit();

    sample_rtt_ = w.percentile(config_.sample_percentile);
    const double target = static_cast<double>(min_rtt_.count()) * (1.0 + config_.min_rtt_buffer);
    const double sample = std::max(1.0, static_cast<double>(sample_rtt_.count()));
    gradient_ = std::clamp(target / sample, config_.min_gradient, config_.max_gradient);

    const double allowance =
        config_.queue_allowance_fixed + config_.queue_allowance_sqrt_scale * detail::sqrt(estimate_);
    const double proposed = estimate_ * gradient_ + allowance;
    double next = estimate_ * (1.0 - config_.smoothing) + proposed * config_.smoothing;
    const bool app_limited =
        static_cast<double>(w.max_in_flight()) < config_.app_limited_fraction * estimate_;
    if (app_limited) next = std::min(next, estimate_);
    estimate_ = std::clamp(next, static_cast<double>(config_.min_limit),
                           static_cast<double>(config_.max_limit));

    windows_at_min_ = limit() == config_.min_limit ? windows_at_min_ + 1 : 0;
    const bool stale = config_.reprobe_after_windows_at_min > 0 &&
                       windows_at_min_ >= config_.reprobe_after_windows_at_min;
    if (stale) enter_probe();
    return limit();
  }

 private:
  void enter_probe() noexcept {
    probing_ = true;
    saved_estimate_ = estimate_;
    if (config_.probe_concurrency > 0) estimate_ = config_.probe_concurrency;
    windows_at_min_ = 0;
    next_probe_at_ = time_point::max();
  }

  void finish_probe(const LimitWindow& w) noexcept {
    min_rtt_ = std::max(std::chrono::nanoseconds{1}, w.percentile(config_.sample_percentile));
    probing_ = false;
    estimate_ = saved_estimate_;
    ++probes_completed_;
    const auto interval = config_.probe_interval;
    const auto jitter_span = static_cast<double>(interval.count()) * config_.probe_jitter;
    const auto jitter =
        std::chrono::nanoseconds(static_cast<std::int64_t>(next_unit() * jitter_span));
    next_probe_at_ = w.end() + std::chrono::duration_cast<time_point::duration>(interval + jitter);
  }

  // splitmix64: a tiny, seedable generator; a uniform double in [0, 1).
  double next_unit() noexcept {
    std::uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  GradientLimitConfig config_;
  double estimate_ = 1.0;
  double saved_estimate_ = 1.0;
  double gradient_ = 1.0;
  std::chrono::nanoseconds min_rtt_{0};
  std::chrono::nanoseconds sample_rtt_{0};
  time_point next_probe_at_ = time_point::max();
  // A seed without <random> (std::random_device would add ~9k preprocessed lines to every
  // file that includes the core): two clock readings and this object's address, each mixed.
  [[nodiscard]] std::uint64_t unseeded_state() const noexcept {
    auto mix = [](std::uint64_t z) {
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      return z ^ (z >> 31);
    };
    const auto steady = static_cast<std::uint64_t>(
        std::chrono::steady_clock::now().time_since_epoch().count());
    const auto wall = static_cast<std::uint64_t>(
        std::chrono::system_clock::now().time_since_epoch().count());
    return mix(steady) ^ mix(wall + 0x9E3779B97F4A7C15ULL) ^
           mix(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(this)));
  }
  std::uint64_t rng_state_ = 0;
  std::uint64_t probes_completed_ = 0;
  std::uint32_t windows_at_min_ = 0;
  bool probing_ = false;
};

namespace detail {
// How the limiter folds its shards into a window without making drain() public.
struct LimitWindowAccess {
  static void drain(LimitWindow& w, WindowShard& s) noexcept { w.drain(s); }
};
}  // namespace detail

static_assert(LimitAlgorithm<StaticLimit>);
static_assert(LimitAlgorithm<AimdLimit>);
static_assert(LimitAlgorithm<GradientLimit>);

}  // namespace tailbatch
