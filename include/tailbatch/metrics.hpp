// Metrics: counters, gauges, latency histograms and computed gauges, all with labels, in
// one registry that writes the Prometheus text exposition format (0.0.4) and a JSON
// snapshot. Latency histograms are exported as Prometheus histograms (`_bucket{le}`,
// `_sum`, `_count`) whose buckets come from the LatencyHistogram's log-linear layout, so
// that a fleet's quantiles can be computed from the replicas' summed buckets; summaries
// (in-process quantiles) are the alternative a registry can be configured with. (The
// Little's-law self-check that reads these metrics is in <tailbatch/littles_law.hpp>.)
//
// Components take an optional `MetricsRegistry*` in their config (nullptr: no metrics, no
// cost), register their metrics once at construction and keep the returned references.
// After that, recording is a relaxed atomic add on a cache line that few threads share:
// no lock, no allocation. Reading (prometheus(), json()) takes a shared lock, so scrapes
// never stop recording and registration never races a scrape.
//
// The registry owns no thread and touches no global state; it is as thread-safe as its
// documentation below says, member by member. See docs/metrics.md for the names tailbatch's
// components export and docs/observability.md for what a fleet does with them.
//
// Why this file is longer than the core's usual 700 lines: the registry owns the storage
// and the exposition of every metric it hands out, so the metric types (Counter, Gauge,
// WindowedHistogram, CallbackRegistration), the families they live in and MetricsRegistry
// are one unit (about 590 lines of it the registry; about 240 documentation); the text
// formatting and the choice of buckets stand alone (detail/metrics/).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <tailbatch/clock.hpp>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/metrics/buckets.hpp>
#include <tailbatch/detail/metrics/text.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <thread>
#include <utility>
#include <vector>

namespace tailbatch {

// A label set: {{"pipeline", "classifier"}, {"reason", "queue_full"}}. Order does not
// matter: the registry sorts labels by name, so {a, b} and {b, a} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// base followed by extra: how a component adds its own labels ({"reason", ...}) to the
// label set its user configured ({"pipeline", "classifier"}). Allocates; throws
// std::bad_alloc. A name present in both is left for the registry to reject. Thread-safe.
[[nodiscard]] inline Labels join_labels(Labels base, const Labels& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

// How a registry writes its latency histograms (histogram(), windowed_histogram()) in the
// text format.
enum class LatencyExport : std::uint8_t {
  // Prometheus `histogram`: cumulative `_bucket{le="..."}` counts, `_sum` and `_count`.
  // Buckets add up across replicas, so `histogram_quantile(0.99, sum by (le) (rate(
  // x_bucket[1m])))` is the fleet's p99, within the buckets' error (exported_buckets()).
  // The default.
  histogram,
  // Prometheus `summary`: the quantiles 0.5, 0.9, 0.95, 0.99 and 0.999 computed in the
  // process (over the window, for a windowed histogram), `_sum` and `_count`. Within 1 %
  // for one replica, but quantiles do not add up: no fleet quantile can be computed.
  summary,
};

// The `le` bounds a registry exports its latency histograms with. Either the histogram's
// own log-linear layout coarsened to `buckets_per_octave` buckets per power of two (the
// bounds 2^e * (1 + j/k) ns, j < k, from `lowest` to `highest`), or, when
// `boundaries_seconds` is not empty, exactly that list; `extra_boundaries_seconds` (an SLO
// target, so that "requests within the target" is one bucket) is added to either.
//
// A histogram can count exactly below its own bucket boundaries only: the coarsened bounds
// are such boundaries (for buckets_per_octave <= 2^bits: 64 at significant_digits = 2); a
// listed bound that is not one is counted at the nearest one, at most 1/(2M) of it away.
// Bounds at or below a histogram's `lowest`, or within its last bucket, are left out for
// that histogram (it cannot tell values apart there). Error: a quantile Prometheus
// interpolates within a bucket (a, b] is off by at most (b - a) / a of the true one:
// 1/buckets_per_octave for the coarsened layout (25 % at the default 4; 12.5 % at 8), for
// quantiles between the first and the last bound. exported_buckets() says what a
// histogram gets and its error. More buckets per octave cost more time series: the
// default gives 93 bounds from 10 us to 100 s. A plain aggregate.
struct HistogramBucketsConfig {
  std::vector<double> boundaries_seconds;  // non-empty: these bounds instead of the layout's
  int buckets_per_octave = 4;              // a power of two in [1, 1024]
  std::chrono::nanoseconds lowest{std::chrono::microseconds(10)};  // the coarsened bounds'
  std::chrono::nanoseconds highest{std::chrono::seconds(100)};     // range (inclusive)
  std::vector<double> extra_boundaries_seconds;  // added bounds, e.g. SLO targets
};

// A MetricsRegistry's configuration. A plain aggregate.
struct MetricsRegistryConfig {
  LatencyExport latency_export = LatencyExport::histogram;
  HistogramBucketsConfig buckets{};  // used when latency_export is histogram (and in json())
};

// The buckets a latency histogram is exported with (MetricsRegistry::exported_buckets()).
struct ExportedBuckets {
  std::vector<double> upper_bounds_seconds;  // the `le` values, ascending; `+Inf` follows
  // The largest relative error of a quantile interpolated within one of these buckets
  // (Prometheus' histogram_quantile) against the true quantile, for quantiles between the
  // first and the last bound.
  double max_relative_error = 0.0;
};

namespace detail {

// A counter spreads its count over this many cache lines; a thread adds to the line its
// id hashes to and a reader sums them all. Sixteen lines (1 KiB a counter) keep a few
// dozen busy threads mostly apart while keeping the read cheap.
inline constexpr std::size_t counter_stripes = 16;
inline constexpr std::size_t metrics_cache_line = 64;

// Which stripe the calling thread adds to. Hashing the thread id needs no thread_local
// (whose access costs a call inside a shared library) and no global state; two threads
// may share a stripe, which costs speed, never correctness.
[[nodiscard]] inline std::size_t counter_stripe_index() noexcept {
  const auto h =
      static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  // Fibonacci hashing: the top bits of h * 2^64/phi depend on every bit of h.
  return static_cast<std::size_t>((h * 0x9E3779B97F4A7C15ull) >> 60);
}
static_assert(counter_stripes == 16, "counter_stripe_index() yields 4 bits");

struct MetricsState;

}  // namespace detail

// A monotonically increasing count (requests, rejections, tokens). Exposed with the
// Prometheus type `counter`; its name must end in `_total`.
//
// inc() is a relaxed atomic add to one of 16 cache-line stripes chosen by the calling
// thread's id, so threads on different cores rarely touch the same line. value() sums the
// stripes: exact once writers have stopped, and never smaller than an earlier reading by
// the same thread while they run. Neither allocates, blocks or throws. Thread-safe.
class Counter {
 public:
  Counter() noexcept = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds n. Lock-free, never blocks, never allocates. Wraps around after 2^64. Thread-safe.
  void inc(std::uint64_t n = 1) noexcept {
    stripes_[detail::counter_stripe_index()].count.fetch_add(n, std::memory_order_relaxed);
  }

  // The total so far (see the class comment for what a reading during writes means).
  // Never blocks. Thread-safe.
  [[nodiscard]] std::uint64_t value() const noexcept {
    std::uint64_t total = 0;
    for (const auto& s : stripes_) total += s.count.load(std::memory_order_relaxed);
    return total;
  }

 private:
  struct alignas(detail::metrics_cache_line) Stripe {
    std::atomic<std::uint64_t> count{0};
  };
  std::array<Stripe, detail::counter_stripes> stripes_{};
};

// A value that goes up and down (queue depth, in-flight, tokens per second). Exposed with
// the Prometheus type `gauge`. One relaxed atomic double on its own cache line: set() is a
// store, add() a compare-and-swap loop. Nothing allocates, blocks or throws. Thread-safe.
class alignas(detail::metrics_cache_line) Gauge {
 public:
  Gauge() noexcept = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  // Replaces the value. Lock-free, never blocks. Thread-safe.
  void set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }

  // Adds d (negative to subtract), atomically with respect to other add() and set() calls.
  // Lock-free, never blocks. Thread-safe.
  void add(double d) noexcept { value_.fetch_add(d, std::memory_order_relaxed); }

  // The current value. Never blocks. Thread-safe.
  [[nodiscard]] double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

namespace detail {

// What the registry reads from a WindowedHistogram, whatever its clock type.
class WindowedSource {
 public:
  WindowedSource(const WindowedSource&) = delete;
  WindowedSource& operator=(const WindowedSource&) = delete;
  virtual ~WindowedSource() = default;
  [[nodiscard]] virtual HistogramSnapshot window_snapshot() const = 0;
  [[nodiscard]] virtual HistogramSnapshot total_snapshot() const = 0;

 protected:
  WindowedSource() = default;
};

// One address per clock type, so that a second registration with another clock is caught
// without RTTI.
template <class C>
inline constexpr char windowed_clock_tag = 0;

}  // namespace detail

// A latency histogram that keeps two views of what it records: everything since
// construction (the cumulative buckets, `_count` and `_sum` a Prometheus histogram must
// export, and whose rate() gives throughput, mean and quantiles over any range), and the
// recent past (snapshot(): the samples of the last `window`, for in-process readers such
// as controllers, autoscalers and summaries, as the summaries of Prometheus' own client
// libraries keep 10 minutes). The quantiles of a plain LatencyHistogram cover everything
// since start-up: after a day of traffic a bad minute barely moves them.
//
// record() is RollingHistogram::record() (lock-free except once per slot rotation) plus
// LatencyHistogram::record() into the cumulative histogram. Not copyable or movable.
// Exception guarantee: only the constructor and the readers that return or build a
// snapshot throw (std::bad_alloc). Thread-safe.
template <Clock C = SteadyClock>
class WindowedHistogram final : public detail::WindowedSource {
 public:
  // Quantiles over the last `window`, kept in `slots` rotating LatencyHistograms (see
  // RollingHistogram, whose arguments these are). Allocates every slot. Throws
  // std::invalid_argument naming the bad field.
  explicit WindowedHistogram(std::chrono::nanoseconds window, int slots = 10,
                             LatencyHistogramConfig options = {}, C clock = C{})
      : rolling_(window, slots, options, std::move(clock)), total_(options), requested_window_(window) {}

  // Records one value into the window and the totals (a negative or NaN duration counts
  // as an underflow, as in LatencyHistogram). Never fails. Thread-safe.
  template <class Rep, class Period>
  void record(std::chrono::duration<Rep, Period> value) noexcept {
    rolling_.record(value);
    total_.record(value);
  }

  // The samples of the last window (see RollingHistogram::snapshot()). Allocates; throws
  // std::bad_alloc. Thread-safe.
  [[nodiscard]] HistogramSnapshot snapshot() const { return rolling_.snapshot(); }

  // Every sample since construction. Allocates; throws std::bad_alloc. Thread-safe.
  [[nodiscard]] HistogramSnapshot total() const { return total_.snapshot(); }

  // Values recorded since construction. Allocates (a snapshot of the totals); throws
  // std::bad_alloc. Thread-safe.
  [[nodiscard]] std::uint64_t count() const { return total().count(); }

  // The sum of every value recorded since construction, in seconds (clamped to the
  // histogram's range, as LatencyHistogram sums). Allocates; throws std::bad_alloc.
  // Thread-safe.
  [[nodiscard]] double sum_seconds() const { return total().sum_seconds(); }

  // The window as requested at construction. Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds window() const noexcept { return requested_window_; }
  // Number of slots. Thread-safe.
  [[nodiscard]] int slots() const noexcept { return rolling_.slots(); }
  // The options of every slot and of the totals. Thread-safe.
  [[nodiscard]] const LatencyHistogramConfig& config() const noexcept { return rolling_.config(); }

 private:
  HistogramSnapshot window_snapshot() const override { return snapshot(); }
  HistogramSnapshot total_snapshot() const override { return total(); }

  RollingHistogram<C> rolling_;
  LatencyHistogram total_;
  std::chrono::nanoseconds requested_window_;
};

// The handle gauge_callback() returns. While it lives, the registry calls the callback at
// every exposition; destroying it (or reset()) removes the series, and once that returns
// the callback is never called again, so a component can register a callback that reads
// its own state and unregister in its destructor. The handle may outlive the registry
// (it then does nothing). Move-only. Thread-safe as a value: distinct handles may be
// destroyed concurrently; one handle is not to be used from two threads at once.
class CallbackRegistration {
 public:
  // An empty handle that unregisters nothing. Thread-safe.
  CallbackRegistration() noexcept = default;

  CallbackRegistration(CallbackRegistration&& other) noexcept
      : state_(std::move(other.state_)), id_(std::exchange(other.id_, 0)) {}

  // Unregisters what this handle held, then takes over other's registration. May block
  // like reset(). Not thread-safe: one handle, one thread.
  CallbackRegistration& operator=(CallbackRegistration&& other) noexcept {
    if (this != &other) {
      reset();
      state_ = std::move(other.state_);
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }

  CallbackRegistration(const CallbackRegistration&) = delete;
  CallbackRegistration& operator=(const CallbackRegistration&) = delete;

  ~CallbackRegistration() { reset(); }

  // Removes the series now (no-op if empty or if the registry is gone). Blocks while an
  // exposition is running, since that may be calling the callback; must therefore not be
  // called from inside the callback. The callback object is destroyed after the
  // registry's lock is released. Never throws. Not thread-safe: one handle, one thread.
  void reset() noexcept;

  // Whether this handle holds a registration (it still does after its registry is gone).
  // Thread-safe.
  [[nodiscard]] explicit operator bool() const noexcept { return id_ != 0; }

 private:
  friend class MetricsRegistry;
  CallbackRegistration(std::weak_ptr<detail::MetricsState> state, std::uint64_t id) noexcept
      : state_(std::move(state)), id_(id) {}

  std::weak_ptr<detail::MetricsState> state_;
  std::uint64_t id_ = 0;
};

namespace detail {

// `latency`: histogram() and windowed_histogram() series, written as the registry's
// LatencyExport says.
enum class MetricKind : std::uint8_t { counter, gauge, latency };

// The kind's name in error messages and (but for latency) in `# TYPE` lines.
[[nodiscard]] constexpr std::string_view metric_kind_name(MetricKind k) noexcept {
  return enum_name(k, {"counter", "gauge", "histogram"}, "untyped");
}

// One labelled series of a family. Exactly one of the five sources is set.
struct MetricSeries {
  Labels labels;  // sorted by name
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<LatencyHistogram> histogram;
  std::unique_ptr<WindowedSource> windowed;
  const void* windowed_clock = nullptr;  // &windowed_clock_tag<C>
  ExportBuckets buckets;                 // histogram and windowed: the `le` bounds
  std::function<double()> callback;
  std::uint64_t callback_id = 0;
};

// What a latency series shows: the cumulative totals (buckets, count, sum) and, where
// asked for, the samples its quantiles come from (the window's, for a windowed series).
struct LatencyReading {
  HistogramSnapshot total;
  HistogramSnapshot quantiles;
};

[[nodiscard]] inline LatencyReading read_latency(const MetricSeries& s, bool with_quantiles) {
  LatencyReading r;
  if (s.histogram) {
    r.total = s.histogram->snapshot();
    if (with_quantiles) r.quantiles = r.total;
  } else {
    r.total = s.windowed->total_snapshot();
    if (with_quantiles) r.quantiles = s.windowed->window_snapshot();
  }
  return r;
}

// All series of one metric name: one HELP, one TYPE.
struct MetricFamily {
  std::string help;
  MetricKind kind = MetricKind::gauge;
  std::map<std::string, MetricSeries> series;  // keyed by the rendered label set
};

// The registry's state, shared with CallbackRegistration handles (weakly) so that a
// handle outliving its registry is harmless.
struct MetricsState {
  mutable std::shared_mutex mutex;
  std::map<std::string, MetricFamily, std::less<>> families;               // sorted: stable output
  std::map<std::uint64_t, std::pair<std::string, std::string>> callbacks;  // id -> family, key
  std::uint64_t next_callback_id = 1;

  void unregister(std::uint64_t id) noexcept {
    // The callback (and whatever it captured) is destroyed after the lock is released, so
    // that its destructor may use the registry.
    std::map<std::string, MetricSeries>::node_type removed;
    {
      std::unique_lock lock(mutex);
      const auto cb = callbacks.find(id);
      if (cb == callbacks.end()) return;
      const auto fam = families.find(cb->second.first);
      if (fam != families.end()) {
        const auto s = fam->second.series.find(cb->second.second);
        if (s != fam->second.series.end()) removed = fam->second.series.extract(s);
        if (fam->second.series.empty()) families.erase(fam);
      }
      callbacks.erase(cb);
    }
  }
};

// Calls a gauge callback at exposition time. A callback that throws yields NaN for its
// sample: one broken reading must not take the whole scrape down.
[[nodiscard]] inline double call_gauge_callback(const std::function<double()>& fn) noexcept {
#if TAILBATCH_HAS_EXCEPTIONS
  try {
    return fn();
  } catch (...) {
    return std::numeric_limits<double>::quiet_NaN();
  }
#else
  return fn();
#endif
}

[[nodiscard]] inline bool same_histogram_options(const LatencyHistogramConfig& a,
                                                 const LatencyHistogramConfig& b) noexcept {
  return a.lowest == b.lowest && a.highest == b.highest &&
         a.significant_digits == b.significant_digits;
}

}  // namespace detail

inline void CallbackRegistration::reset() noexcept {
  if (id_ == 0) return;
  if (const auto state = state_.lock()) state->unregister(id_);
  state_.reset();
  id_ = 0;
}

// The registry: where components register their metrics and where the server's /metrics
// handler reads them.
//
// Registering (counter(), gauge(), histogram(), windowed_histogram(), gauge_callback())
// takes an exclusive lock and allocates; do it at construction, not per request. Updating a
// returned metric takes no lock. Exposition takes a shared lock: scrapes run concurrently with each
// other and with updates. Returned references stay valid for the registry's lifetime.
//
// Latency histograms are written as the configuration's LatencyExport says: Prometheus
// histograms by default, with the buckets of its HistogramBucketsConfig.
//
// Validation (each failure throws std::invalid_argument naming the metric and the rule):
// metric names follow [a-zA-Z_][a-zA-Z0-9_]* (no colons: Prometheus reserves them for
// recording rules); counters end in `_total`, other kinds do not; no name ends in `_sum`,
// `_count` or `_bucket` (the suffixes of summary and histogram samples); label names
// follow the same pattern, do not start with `__`, appear once per set, and a histogram
// may not use `le` or `quantile`; help text is non-empty; help and label values are valid
// UTF-8. The same (name, labels) returns the same metric; the same name with another kind
// throws. A rejected registration changes nothing (strong guarantee).
//
// Thread-safe. Not copyable or movable (components hold pointers to it).
class MetricsRegistry {
 public:
  // The quantiles a histogram is exposed with as a summary (LatencyExport::summary), and
  // in json().
  static constexpr std::array<double, 5> summary_quantiles{0.5, 0.9, 0.95, 0.99, 0.999};

  // A registry that exports Prometheus histograms with the default buckets. Allocates the
  // (empty) shared state. Throws std::bad_alloc. Thread-safe.
  MetricsRegistry() : MetricsRegistry(MetricsRegistryConfig{}) {}

  // A registry configured by `config`. Throws std::invalid_argument naming the bad field
  // (buckets_per_octave not a power of two in [1, 1024]; lowest < 1 ns; highest below
  // 2 * lowest or above 2^62 ns; a bound that is not finite and positive; a
  // boundaries_seconds list that is not strictly increasing), or std::bad_alloc.
  // Thread-safe.
  explicit MetricsRegistry(MetricsRegistryConfig config)
      : config_(validate(std::move(config))), state_(std::make_shared<detail::MetricsState>()) {}

  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  MetricsRegistry(MetricsRegistry&&) = delete;
  MetricsRegistry& operator=(MetricsRegistry&&) = delete;
  ~MetricsRegistry() = default;

  // The configuration given at construction. Thread-safe.
  [[nodiscard]] const MetricsRegistryConfig& config() const noexcept { return config_; }

  // The buckets a latency histogram with these options is exported with, and their error
  // (see HistogramBucketsConfig). Allocates; throws std::invalid_argument for invalid
  // options, or std::bad_alloc. Thread-safe.
  [[nodiscard]] ExportedBuckets exported_buckets(const LatencyHistogramConfig& options = {}) const {
    detail::ExportBuckets b = buckets_for(options);
    return ExportedBuckets{std::move(b.le_seconds), b.max_relative_error};
  }

  // The counter (name, labels), created at zero on first use; `help` is kept from the
  // first registration of the name. Blocks on the registry's lock; allocates on first
  // use. Throws std::invalid_argument (see the class comment) or std::bad_alloc.
  // Thread-safe.
  Counter& counter(std::string_view name, std::string_view help, Labels labels = {}) {
    auto prepared = prepare(detail::MetricKind::counter, name, help, std::move(labels));
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::counter, name, prepared.key)) return *s->counter;
    detail::MetricSeries series;
    series.counter = std::make_unique<Counter>();
    return *insert_series(detail::MetricKind::counter, name, help, std::move(prepared),
                          std::move(series))
                .counter;
  }

  // The gauge (name, labels), created at zero on first use. Throws std::invalid_argument
  // also when (name, labels) is a callback gauge. Otherwise as counter(). Thread-safe.
  Gauge& gauge(std::string_view name, std::string_view help, Labels labels = {}) {
    auto prepared = prepare(detail::MetricKind::gauge, name, help, std::move(labels));
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::gauge, name, prepared.key)) {
      if (!s->gauge) fail(name, prepared.key, "is already registered as a callback gauge");
      return *s->gauge;
    }
    detail::MetricSeries series;
    series.gauge = std::make_unique<Gauge>();
    return *insert_series(detail::MetricKind::gauge, name, help, std::move(prepared),
                          std::move(series))
                .gauge;
  }

  // The latency histogram (name, labels), in seconds: a Prometheus histogram
  // (`_bucket{le}` counts since construction or the last reset(), which Prometheus reads
  // as a counter reset; `_sum`; `_count`), or with LatencyExport::summary a summary
  // (quantiles 0.5 0.9 0.95 0.99 0.999 over the same samples, NaN while empty; `_sum`;
  // `_count`). Record into it as into any LatencyHistogram. Throws std::invalid_argument
  // also when (name, labels) exists with other options or as a windowed histogram, or
  // when options are invalid (from LatencyHistogram). Otherwise as counter(). Thread-safe.
  LatencyHistogram& histogram(std::string_view name, std::string_view help, Labels labels = {},
                              LatencyHistogramConfig options = {}) {
    auto prepared = prepare(detail::MetricKind::latency, name, help, std::move(labels));
    {
      std::unique_lock lock(state_->mutex);
      if (auto* s = find_series(detail::MetricKind::latency, name, prepared.key)) {
        return existing_histogram(*s, name, prepared.key, options);
      }
    }
    // Built outside the lock: constructing a histogram allocates its shards.
    detail::MetricSeries series;
    series.histogram = std::make_unique<LatencyHistogram>(options);
    series.buckets = buckets_for(options);
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::latency, name, prepared.key)) {
      return existing_histogram(*s, name, prepared.key, options);  // registered meanwhile
    }
    return *insert_series(detail::MetricKind::latency, name, help, std::move(prepared),
                          std::move(series))
                .histogram;
  }

  // A latency histogram whose snapshot() covers only the last `window` (see
  // WindowedHistogram). Exported as histogram() is, from its totals since construction;
  // as a summary (LatencyExport::summary) its quantiles cover the window while `_count`
  // and `_sum` stay cumulative. Prefer it to histogram() where the process itself reads
  // recent quantiles (a controller, an autoscaler, a stats page); 1 to 10 minutes is
  // typical. The same (name, labels) returns the same object if window, slots, options
  // and the clock type match, and throws std::invalid_argument otherwise, or if the
  // series is a histogram() one; the clock of the first registration is kept. Otherwise
  // as histogram(). Thread-safe.
  template <Clock C = SteadyClock>
  WindowedHistogram<C>& windowed_histogram(std::string_view name, std::string_view help,
                                           Labels labels, std::chrono::nanoseconds window,
                                           int slots = 10, LatencyHistogramConfig options = {},
                                           C clock = C{}) {
    auto prepared = prepare(detail::MetricKind::latency, name, help, std::move(labels));
    const auto existing = [&](detail::MetricSeries& s) -> WindowedHistogram<C>& {
      if (!s.windowed)
        fail(name, prepared.key, "is already registered by histogram(), without a window");
      if (s.windowed_clock != &detail::windowed_clock_tag<C>) {
        fail(name, prepared.key,
             "is already registered as a windowed histogram with another clock type");
      }
      auto& w = static_cast<WindowedHistogram<C>&>(*s.windowed);
      if (w.window() != window || w.slots() != slots ||
          !detail::same_histogram_options(w.config(), options)) {
        fail(name, prepared.key,
             "is already registered with a different window, slot count or LatencyHistogramConfig");
      }
      return w;
    };
    {
      std::unique_lock lock(state_->mutex);
      if (auto* s = find_series(detail::MetricKind::latency, name, prepared.key))
        return existing(*s);
    }
    detail::MetricSeries series;  // built outside the lock: it allocates every slot
    auto owned = std::make_unique<WindowedHistogram<C>>(window, slots, options, std::move(clock));
    WindowedHistogram<C>& result = *owned;
    series.windowed = std::move(owned);
    series.windowed_clock = &detail::windowed_clock_tag<C>;
    series.buckets = buckets_for(options);
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::latency, name, prepared.key)) return existing(*s);
    insert_series(detail::MetricKind::latency, name, help, std::move(prepared), std::move(series));
    return result;
  }

  // A gauge computed when read (queue depth, in-flight): fn is called at every
  // exposition, possibly from several scraping threads at once, with the registry's
  // shared lock held, so it must be thread-safe, fast, and must not call into this
  // registry or take a lock held by whoever destroys the handle. If fn throws, the
  // sample reads NaN. The returned handle removes the series on destruction (see
  // CallbackRegistration). Throws std::invalid_argument if fn is empty, if (name, labels)
  // is already registered (as a callback or a plain gauge), or as gauge(). Blocks on the
  // registry's lock; allocates. Thread-safe.
  [[nodiscard]] CallbackRegistration gauge_callback(std::string_view name, std::string_view help,
                                                    Labels labels, std::function<double()> fn) {
    if (!fn) fail(name, {}, "gauge_callback: fn is empty");
    auto prepared = prepare(detail::MetricKind::gauge, name, help, std::move(labels));
    std::string key = prepared.key;
    // Declared before the lock: if registration fails, fn (and what it captured) is
    // destroyed after the lock is released.
    detail::MetricSeries series;
    series.callback = std::move(fn);
    std::unique_lock lock(state_->mutex);
    if (find_series(detail::MetricKind::gauge, name, prepared.key)) {
      fail(name, prepared.key, "is already registered; a callback gauge needs a series of its own");
    }
    const std::uint64_t id = state_->next_callback_id;
    series.callback_id = id;
    // The id map entry first: if inserting the series fails, it is erased again.
    auto cb =
        state_->callbacks.emplace(id, std::make_pair(std::string(name), std::move(key))).first;
    CallbackMapGuard guard{state_->callbacks, cb};
    insert_series(detail::MetricKind::gauge, name, help, std::move(prepared), std::move(series));
    guard.dismissed = true;
    ++state_->next_callback_id;
    return CallbackRegistration(state_, id);
  }

  // The Prometheus text exposition format 0.0.4: families sorted by name, each with one
  // `# HELP` and one `# TYPE` line followed by its series sorted by label set; families
  // with no series left (callback gauges all unregistered) are omitted. A histogram's
  // series are its `_bucket` lines (`le` ascending, `+Inf` last), `_sum` and `_count`;
  // a summary's its quantiles, `_sum` and `_count`. Serve it with Content-Type
  // `text/plain; version=0.0.4; charset=utf-8`. Calls the gauge callbacks and snapshots
  // every histogram. Blocks registrations (not updates) while it runs; allocates; throws
  // std::bad_alloc. Thread-safe.
  [[nodiscard]] std::string prometheus() const {
    std::string out;
    std::array<std::chrono::nanoseconds, summary_quantiles.size()> q{};
    std::vector<std::uint64_t> below;
    const bool summaries = config_.latency_export == LatencyExport::summary;
    std::shared_lock lock(state_->mutex);
    for (const auto& [name, family] : state_->families) {
      if (family.series.empty()) continue;
      out += "# HELP ";
      out += name;
      out += ' ';
      detail::append_help_escaped(out, family.help);
      out += "\n# TYPE ";
      out += name;
      out += ' ';
      out += type_name(family.kind);
      out += '\n';
      for (const auto& [key, series] : family.series) {
        switch (family.kind) {
          case detail::MetricKind::counter:
            append_sample_start(out, name, {}, key, {}, {});
            detail::append_uint(out, series.counter->value());
            out += '\n';
            break;
          case detail::MetricKind::gauge:
            append_sample_start(out, name, {}, key, {}, {});
            detail::append_prometheus_double(out, gauge_value(series));
            out += '\n';
            break;
          case detail::MetricKind::latency: {
            const detail::LatencyReading reading = detail::read_latency(series, summaries);
            if (summaries) {
              const bool empty = reading.quantiles.count() == 0;
              if (!empty) reading.quantiles.percentiles(summary_percentiles(), q);
              for (std::size_t i = 0; i < q.size(); ++i) {
                append_sample_start(out, name, {}, key, "quantile", quantile_text(i));
                detail::append_prometheus_double(
                    out, empty ? std::numeric_limits<double>::quiet_NaN() : seconds(q[i]));
                out += '\n';
              }
            } else {
              const detail::ExportBuckets& b = series.buckets;
              below.assign(b.count_at.size(), 0);
              reading.total.count_below(b.count_at, below);
              for (std::size_t i = 0; i < below.size(); ++i) {
                append_sample_start(out, name, "_bucket", key, "le", b.le_text[i]);
                detail::append_uint(out, below[i]);
                out += '\n';
              }
              append_sample_start(out, name, "_bucket", key, "le", "+Inf");
              detail::append_uint(out, reading.total.count());
              out += '\n';
            }
            append_sample_start(out, name, "_sum", key, {}, {});
            detail::append_prometheus_double(out, reading.total.sum_seconds());
            out += '\n';
            append_sample_start(out, name, "_count", key, {}, {});
            detail::append_uint(out, reading.total.count());
            out += '\n';
            break;
          }
        }
      }
    }
    return out;
  }

  // The same content as prometheus(), as one JSON object:
  //   {"families":[{"name":..,"type":"counter"|"gauge"|"histogram"|"summary","help":..,
  //    "samples":[
  //     {"labels":{..},"value":v}                                  (counter, gauge)
  //     {"labels":{..},"count":n,"sum":s,"buckets":{"0.001":n,..,"+Inf":n},
  //      "quantiles":{"0.5":v,..}}                                  (histogram, seconds)
  //     {"labels":{..},"count":n,"sum":s,"quantiles":{"0.5":v,..}}  (summary, seconds)
  //   ]}]}
  // A histogram's samples carry the quantiles too (over the window, for a windowed
  // histogram): the process's own reading, for readers that are not Prometheus. NaN and
  // infinities (JSON has none) are written as null. Blocks, allocates and throws like
  // prometheus(). Thread-safe.
  [[nodiscard]] std::string json() const {
    std::string out = "{\"families\":[";
    std::array<std::chrono::nanoseconds, summary_quantiles.size()> q{};
    std::vector<std::uint64_t> below;
    const bool summaries = config_.latency_export == LatencyExport::summary;
    std::shared_lock lock(state_->mutex);
    bool first_family = true;
    for (const auto& [name, family] : state_->families) {
      if (family.series.empty()) continue;
      if (!first_family) out += ',';
      first_family = false;
      out += "{\"name\":";
      detail::append_json_string(out, name);
      out += ",\"type\":\"";
      out += type_name(family.kind);
      out += "\",\"help\":";
      detail::append_json_string(out, family.help);
      out += ",\"samples\":[";
      bool first_sample = true;
      for (const auto& entry : family.series) {
        const detail::MetricSeries& series = entry.second;
        if (!first_sample) out += ',';
        first_sample = false;
        out += "{\"labels\":{";
        for (std::size_t i = 0; i < series.labels.size(); ++i) {
          if (i > 0) out += ',';
          detail::append_json_string(out, series.labels[i].first);
          out += ':';
          detail::append_json_string(out, series.labels[i].second);
        }
        out += '}';
        switch (family.kind) {
          case detail::MetricKind::counter:
            out += ",\"value\":";
            detail::append_uint(out, series.counter->value());
            break;
          case detail::MetricKind::gauge:
            out += ",\"value\":";
            detail::append_json_double(out, gauge_value(series));
            break;
          case detail::MetricKind::latency: {
            const detail::LatencyReading reading = detail::read_latency(series, true);
            out += ",\"count\":";
            detail::append_uint(out, reading.total.count());
            out += ",\"sum\":";
            detail::append_json_double(out, reading.total.sum_seconds());
            if (!summaries) {
              const detail::ExportBuckets& b = series.buckets;
              below.assign(b.count_at.size(), 0);
              reading.total.count_below(b.count_at, below);
              out += ",\"buckets\":{";
              for (std::size_t i = 0; i < below.size(); ++i) {
                detail::append_json_string(out, b.le_text[i]);
                out += ':';
                detail::append_uint(out, below[i]);
                out += ',';
              }
              out += "\"+Inf\":";
              detail::append_uint(out, reading.total.count());
              out += '}';
            }
            out += ",\"quantiles\":{";
            const bool empty = reading.quantiles.count() == 0;
            if (!empty) reading.quantiles.percentiles(summary_percentiles(), q);
            for (std::size_t i = 0; i < q.size(); ++i) {
              if (i > 0) out += ',';
              out += '"';
              out += quantile_text(i);
              out += "\":";
              detail::append_json_double(
                  out, empty ? std::numeric_limits<double>::quiet_NaN() : seconds(q[i]));
            }
            out += '}';
            break;
          }
        }
        out += '}';
      }
      out += "]}";
    }
    out += "]}";
    return out;
  }

 private:
  struct Prepared {
    Labels labels;    // sorted by name
    std::string key;  // rendered: a="x",b="y" (escaped; empty without labels)
  };

  // Removes a callback id again if inserting its series throws.
  struct CallbackMapGuard {
    std::map<std::uint64_t, std::pair<std::string, std::string>>& map;
    std::map<std::uint64_t, std::pair<std::string, std::string>>::iterator it;
    bool dismissed = false;
    ~CallbackMapGuard() {
      if (!dismissed) map.erase(it);
    }
  };

  [[noreturn]] static void fail(std::string_view name, std::string_view key,
                                std::string_view what) {
    std::string msg = "MetricsRegistry: \"";
    msg += name;
    if (!key.empty()) {
      msg += '{';
      msg += key;
      msg += '}';
    }
    msg += "\" ";
    msg += what;
    detail::throw_invalid_argument(msg.c_str());
  }

  // Checks everything that does not need the lock, sorts the labels and renders the key.
  static Prepared prepare(detail::MetricKind kind, std::string_view name, std::string_view help,
                          Labels labels) {
    using detail::ends_with;
    if (!detail::is_metric_name(name)) {
      fail(name, {},
           "is not a valid metric name: use [a-zA-Z_][a-zA-Z0-9_]* (colons are reserved for "
           "recording rules)");
    }
    if (kind == detail::MetricKind::counter && !ends_with(name, "_total")) {
      fail(name, {}, "is a counter: its name must end in _total");
    }
    if (kind != detail::MetricKind::counter && ends_with(name, "_total")) {
      fail(name, {}, "must not end in _total: the suffix is reserved for counters");
    }
    if (ends_with(name, "_sum") || ends_with(name, "_count") || ends_with(name, "_bucket")) {
      fail(name, {},
           "must not end in _sum, _count or _bucket: those name summary and histogram samples");
    }
    if (help.empty()) fail(name, {}, "needs a non-empty help text");
    if (!detail::is_valid_utf8(help)) fail(name, {}, "has a help text that is not valid UTF-8");

    std::stable_sort(labels.begin(), labels.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    Prepared p;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const auto& [label, value] = labels[i];
      if (!detail::is_label_name(label)) {
        fail(name, {},
             "has label name \"" + label + "\", which is not valid: use [a-zA-Z_][a-zA-Z0-9_]*");
      }
      if (label.size() >= 2 && label[0] == '_' && label[1] == '_') {
        fail(name, {}, "has label name \"" + label + "\": names starting with __ are reserved");
      }
      if (kind == detail::MetricKind::latency && (label == "le" || label == "quantile")) {
        fail(name, {},
             "is a histogram: its label name \"" + label +
                 "\" is reserved for the buckets (le) and quantiles (quantile)");
      }
      if (i > 0 && labels[i - 1].first == label) {
        fail(name, {}, "has label name \"" + label + "\" twice");
      }
      if (!detail::is_valid_utf8(value)) {
        fail(name, {}, "has a value for label \"" + label + "\" that is not valid UTF-8");
      }
      if (i > 0) p.key += ',';
      p.key += label;
      p.key += "=\"";
      detail::append_label_value_escaped(p.key, value);
      p.key += '"';
    }
    p.labels = std::move(labels);
    return p;
  }

  // The existing series, or nullptr; throws if the name has another kind. Lock held.
  detail::MetricSeries* find_series(detail::MetricKind kind, std::string_view name,
                                    const std::string& key) {
    const auto fam = state_->families.find(name);
    if (fam == state_->families.end()) return nullptr;
    if (fam->second.kind != kind) {
      fail(name, {},
           std::string("is already registered as a ")
               .append(detail::metric_kind_name(fam->second.kind))
               .append("; it cannot also be a ")
               .append(detail::metric_kind_name(kind)));
    }
    const auto s = fam->second.series.find(key);
    return s == fam->second.series.end() ? nullptr : &s->second;
  }

  // Inserts a new series (find_series() said there is none); on failure nothing changes.
  // Lock held.
  detail::MetricSeries& insert_series(detail::MetricKind kind, std::string_view name,
                                      std::string_view help, Prepared prepared,
                                      detail::MetricSeries series) {
    auto& families = state_->families;
    auto fam = families.find(name);
    struct FamilyGuard {
      decltype(families)& map;
      decltype(fam) it;
      bool armed;
      ~FamilyGuard() {
        if (armed) map.erase(it);
      }
    };
    bool created = false;
    if (fam == families.end()) {
      detail::MetricFamily family;
      family.help = std::string(help);
      family.kind = kind;
      fam = families.emplace(std::string(name), std::move(family)).first;
      created = true;
    }
    FamilyGuard guard{families, fam, created};
    series.labels = std::move(prepared.labels);
    auto& inserted =
        fam->second.series.emplace(std::move(prepared.key), std::move(series)).first->second;
    guard.armed = false;
    return inserted;
  }

  static LatencyHistogram& existing_histogram(detail::MetricSeries& s, std::string_view name,
                                              const std::string& key,
                                              const LatencyHistogramConfig& options) {
    if (!s.histogram) fail(name, key, "is already registered as a windowed histogram");
    if (!detail::same_histogram_options(s.histogram->config(), options)) {
      fail(name, key, "is already registered with different LatencyHistogramConfig");
    }
    return *s.histogram;
  }

  static double gauge_value(const detail::MetricSeries& s) noexcept {
    return s.gauge ? s.gauge->value() : detail::call_gauge_callback(s.callback);
  }

  static double seconds(std::chrono::nanoseconds d) noexcept {
    return std::chrono::duration<double>(d).count();
  }

  // summary_quantiles as LatencyHistogram percentiles (0..100).
  static std::span<const double> summary_percentiles() noexcept {
    static constexpr std::array<double, 5> ps{50.0, 90.0, 95.0, 99.0, 99.9};
    static_assert(ps.size() == summary_quantiles.size());
    return ps;
  }

  static std::string_view quantile_text(std::size_t i) noexcept {
    static constexpr std::array<std::string_view, 5> text{"0.5", "0.9", "0.95", "0.99", "0.999"};
    return text[i];
  }

  // The `# TYPE` of a kind: latency histograms are written as the configuration says.
  [[nodiscard]] std::string_view type_name(detail::MetricKind kind) const noexcept {
    if (kind == detail::MetricKind::latency && config_.latency_export == LatencyExport::summary) {
      return "summary";
    }
    return detail::metric_kind_name(kind);
  }

  // name + suffix + {key[,label="value"]} + ' '
  static void append_sample_start(std::string& out, std::string_view name, std::string_view suffix,
                                  std::string_view key, std::string_view label,
                                  std::string_view value) {
    out += name;
    out += suffix;
    if (!key.empty() || !label.empty()) {
      out += '{';
      out += key;
      if (!label.empty()) {
        if (!key.empty()) out += ',';
        out += label;
        out += "=\"";
        out += value;
        out += '"';
      }
      out += '}';
    }
    out += ' ';
  }

  [[noreturn]] static void fail_config(const char* what) {
    detail::throw_invalid_argument((std::string("MetricsRegistry: config.") + what).c_str());
  }

  static MetricsRegistryConfig validate(MetricsRegistryConfig c) {
    const HistogramBucketsConfig& b = c.buckets;
    if (b.buckets_per_octave < 1 || b.buckets_per_octave > 1024 ||
        !std::has_single_bit(static_cast<unsigned>(b.buckets_per_octave))) {
      fail_config("buckets.buckets_per_octave must be a power of two in [1, 1024]");
    }
    if (b.lowest.count() < 1) fail_config("buckets.lowest must be >= 1ns");
    if (b.highest.count() / 2 < b.lowest.count()) fail_config("buckets.highest must be >= 2 * buckets.lowest");
    if (static_cast<std::uint64_t>(b.highest.count()) > detail::HistogramLayout::max_highest_ns) {
      fail_config("buckets.highest must be <= 2^62 ns (about 146 years)");
    }
    // Bounds up to 2^62 ns, as a histogram's range.
    const auto in_range = [](double s) { return s > 0.0 && s <= 4.6e9; };
    for (std::size_t i = 0; i < b.boundaries_seconds.size(); ++i) {
      if (!in_range(b.boundaries_seconds[i])) {
        fail_config("buckets.boundaries_seconds must hold finite bounds in (0, 4.6e9] seconds");
      }
      if (i > 0 && !(b.boundaries_seconds[i] > b.boundaries_seconds[i - 1])) {
        fail_config("buckets.boundaries_seconds must be strictly increasing");
      }
    }
    for (const double s : b.extra_boundaries_seconds) {
      if (!in_range(s)) fail_config("buckets.extra_boundaries_seconds must hold finite bounds in (0, 4.6e9] seconds");
    }
    return c;
  }

  // The `le` bounds for a histogram with these options. Throws std::invalid_argument for
  // invalid options.
  [[nodiscard]] detail::ExportBuckets buckets_for(const LatencyHistogramConfig& options) const {
    const detail::HistogramLayout layout = detail::histogram_layout_for(options, "MetricsRegistry");
    const HistogramBucketsConfig& b = config_.buckets;
    std::vector<detail::WantedBound> wanted;
    if (b.boundaries_seconds.empty()) {
      for (const std::uint64_t ns : detail::coarsened_bounds(b.buckets_per_octave,
                                                             static_cast<std::uint64_t>(b.lowest.count()),
                                                             static_cast<std::uint64_t>(b.highest.count()))) {
        wanted.push_back({static_cast<double>(ns) / 1e9, ns});
      }
    } else {
      for (const double s : b.boundaries_seconds) wanted.push_back({s, detail::seconds_to_ns(s)});
    }
    for (const double s : b.extra_boundaries_seconds) wanted.push_back({s, detail::seconds_to_ns(s)});
    return detail::export_buckets(std::move(wanted), layout);
  }

  const MetricsRegistryConfig config_;
  std::shared_ptr<detail::MetricsState> state_;
};

}  // namespace tailbatch
