// Metrics: counters, gauges, latency summaries and computed gauges, all with labels, in
// one registry that writes the Prometheus text exposition format (0.0.4) and a JSON
// snapshot. (The Little's-law self-check that reads these metrics is in
// <tailbatch/littles_law.hpp>.)
//
// Components take an optional `MetricsRegistry*` in their config (nullptr: no metrics, no
// cost), register their metrics once at construction and keep the returned references.
// After that, recording is a relaxed atomic add on a cache line that few threads share:
// no lock, no allocation. Reading (prometheus(), json()) takes a shared lock, so scrapes
// never stop recording and registration never races a scrape.
//
// The registry owns no thread and touches no global state; it is as thread-safe as its
// documentation below says, member by member. See docs/metrics.md for the names tailbatch's
// components export.
//
// Why this file is longer than the core's usual 700 lines: the registry owns the storage
// and the exposition of every metric it hands out, so the metric types (Counter, Gauge,
// WindowedHistogram, CallbackRegistration), the families they live in and MetricsRegistry
// are one unit (about 460 lines of it the registry; about 170 documentation); the text
// formatting stands alone (detail/metrics/text.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
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
  [[nodiscard]] virtual std::uint64_t total_count() const noexcept = 0;
  [[nodiscard]] virtual double total_sum_seconds() const noexcept = 0;

 protected:
  WindowedSource() = default;
};

// One address per clock type, so that a second registration with another clock is caught
// without RTTI.
template <class C>
inline constexpr char windowed_clock_tag = 0;

}  // namespace detail

// A latency histogram whose quantiles cover only the recent past, as the summaries of
// Prometheus' own client libraries do (their default window is 10 minutes), while its
// count and sum keep growing for ever, as a summary's `_count` and `_sum` must (rate()
// over them gives the throughput and mean latency). The quantiles of a plain
// LatencyHistogram cover everything since start-up: after a day of traffic a bad minute
// barely moves them, which is wrong for dashboards, alerts and autoscaling.
//
// record() is RollingHistogram::record() (lock-free except once per slot rotation) plus a
// relaxed add to a count and a sum on a per-thread-hashed stripe. Not copyable or movable.
// Exception guarantee: only the constructor and snapshot() throw. Thread-safe.
template <Clock C = SteadyClock>
class WindowedHistogram final : public detail::WindowedSource {
 public:
  // Quantiles over the last `window`, kept in `slots` rotating LatencyHistograms (see
  // RollingHistogram, whose arguments these are). Allocates every slot. Throws
  // std::invalid_argument naming the bad field.
  explicit WindowedHistogram(std::chrono::nanoseconds window, int slots = 10,
                             LatencyHistogramConfig options = {}, C clock = C{})
      : rolling_(window, slots, options, std::move(clock)), requested_window_(window) {}

  // Records one value into the window and the totals (a negative or NaN duration counts
  // as 0 in the sum, as an underflow in the histogram). Never fails. Thread-safe.
  template <class Rep, class Period>
  void record(std::chrono::duration<Rep, Period> value) noexcept {
    rolling_.record(value);
    Stripe& s = totals_[detail::counter_stripe_index()];
    s.count.fetch_add(1, std::memory_order_relaxed);
    // A double sum: an integer nanosecond sum of a busy server would wrap within months.
    s.sum_seconds.fetch_add(static_cast<double>(detail::histogram_to_ns(value)) / 1e9,
                            std::memory_order_relaxed);
  }

  // The samples of the last window (see RollingHistogram::snapshot()). Allocates; throws
  // std::bad_alloc. Thread-safe.
  [[nodiscard]] HistogramSnapshot snapshot() const { return rolling_.snapshot(); }

  // Values recorded since construction. Never blocks. Thread-safe.
  [[nodiscard]] std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (const auto& s : totals_) n += s.count.load(std::memory_order_relaxed);
    return n;
  }

  // The sum of every value recorded since construction, in seconds. Thread-safe.
  [[nodiscard]] double sum_seconds() const noexcept {
    double sum = 0.0;
    for (const auto& s : totals_) sum += s.sum_seconds.load(std::memory_order_relaxed);
    return sum;
  }

  // The window as requested at construction. Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds window() const noexcept { return requested_window_; }
  // Number of slots. Thread-safe.
  [[nodiscard]] int slots() const noexcept { return rolling_.slots(); }
  // The options of every slot. Thread-safe.
  [[nodiscard]] const LatencyHistogramConfig& config() const noexcept { return rolling_.config(); }

 private:
  HistogramSnapshot window_snapshot() const override { return snapshot(); }
  std::uint64_t total_count() const noexcept override { return count(); }
  double total_sum_seconds() const noexcept override { return sum_seconds(); }

  struct alignas(detail::metrics_cache_line) Stripe {
    std::atomic<std::uint64_t> count{0};
    std::atomic<double> sum_seconds{0.0};
  };

  RollingHistogram<C> rolling_;
  std::chrono::nanoseconds requested_window_;
  std::array<Stripe, detail::counter_stripes> totals_{};
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

enum class MetricKind : std::uint8_t { counter, gauge, summary };

[[nodiscard]] inline const char* metric_kind_name(MetricKind k) noexcept {
  switch (k) {
    case MetricKind::counter:
      return "counter";
    case MetricKind::gauge:
      return "gauge";
    case MetricKind::summary:
      return "summary";
  }
  return "untyped";
}

// One labelled series of a family. Exactly one of the five sources is set.
struct MetricSeries {
  Labels labels;  // sorted by name
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<LatencyHistogram> histogram;
  std::unique_ptr<WindowedSource> windowed;
  const void* windowed_clock = nullptr;  // &windowed_clock_tag<C>
  std::function<double()> callback;
  std::uint64_t callback_id = 0;
};

// What a summary series shows: quantiles from `quantiles`, count and sum as given.
struct SummaryReading {
  HistogramSnapshot quantiles;
  std::uint64_t count = 0;
  double sum_seconds = 0.0;
};

[[nodiscard]] inline SummaryReading read_summary(const MetricSeries& s) {
  SummaryReading r;
  if (s.histogram) {
    r.quantiles = s.histogram->snapshot();
    r.count = r.quantiles.count();
    r.sum_seconds = r.quantiles.sum_seconds();
  } else {
    r.quantiles = s.windowed->window_snapshot();
    r.count = s.windowed->total_count();
    r.sum_seconds = s.windowed->total_sum_seconds();
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
// Validation (each failure throws std::invalid_argument naming the metric and the rule):
// metric names follow [a-zA-Z_][a-zA-Z0-9_]* (no colons: Prometheus reserves them for
// recording rules); counters end in `_total`, other kinds do not; no name ends in `_sum`,
// `_count` or `_bucket` (the suffixes of summary and histogram samples); label names
// follow the same pattern, do not start with `__`, appear once per set, and a histogram
// may not use `quantile`; help text is non-empty; help and label values are valid UTF-8.
// The same (name, labels) returns the same metric; the same name with another kind
// throws. A rejected registration changes nothing (strong guarantee).
//
// Thread-safe. Not copyable or movable (components hold pointers to it).
class MetricsRegistry {
 public:
  // The quantiles every histogram is exposed with.
  static constexpr std::array<double, 5> summary_quantiles{0.5, 0.9, 0.95, 0.99, 0.999};

  // Allocates the (empty) shared state. Throws std::bad_alloc. Thread-safe.
  MetricsRegistry() : state_(std::make_shared<detail::MetricsState>()) {}

  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  MetricsRegistry(MetricsRegistry&&) = delete;
  MetricsRegistry& operator=(MetricsRegistry&&) = delete;
  ~MetricsRegistry() = default;

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

  // The latency histogram (name, labels), exposed as a Prometheus summary in seconds
  // (quantiles 0.5 0.9 0.95 0.99 0.999, `_sum`, `_count`; NaN quantiles while empty).
  // Record into it as into any LatencyHistogram. Its quantiles cover everything since
  // construction (or its last reset()); windowed_histogram() gives recent quantiles.
  // Throws std::invalid_argument also when (name, labels) exists with other options or
  // as a windowed histogram, or when options are invalid (from LatencyHistogram).
  // Otherwise as counter(). Thread-safe.
  LatencyHistogram& histogram(std::string_view name, std::string_view help, Labels labels = {},
                              LatencyHistogramConfig options = {}) {
    auto prepared = prepare(detail::MetricKind::summary, name, help, std::move(labels));
    {
      std::unique_lock lock(state_->mutex);
      if (auto* s = find_series(detail::MetricKind::summary, name, prepared.key)) {
        return existing_histogram(*s, name, prepared.key, options);
      }
    }
    // Built outside the lock: constructing a histogram allocates its shards.
    detail::MetricSeries series;
    series.histogram = std::make_unique<LatencyHistogram>(options);
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::summary, name, prepared.key)) {
      return existing_histogram(*s, name, prepared.key, options);  // registered meanwhile
    }
    return *insert_series(detail::MetricKind::summary, name, help, std::move(prepared),
                          std::move(series))
                .histogram;
  }

  // A latency histogram exposed as a summary whose quantiles cover only the last `window`
  // (see WindowedHistogram; `_count` and `_sum` stay cumulative). Prefer it to histogram()
  // for anything a dashboard, alert or autoscaler reads; 1 to 10 minutes is typical.
  // The same (name, labels) returns the same object if window, slots, options and the
  // clock type match, and throws std::invalid_argument otherwise, or if the series is a
  // histogram() one; the clock of the first registration is kept. Otherwise as
  // histogram(). Thread-safe.
  template <Clock C = SteadyClock>
  WindowedHistogram<C>& windowed_histogram(std::string_view name, std::string_view help,
                                           Labels labels, std::chrono::nanoseconds window,
                                           int slots = 10, LatencyHistogramConfig options = {},
                                           C clock = C{}) {
    auto prepared = prepare(detail::MetricKind::summary, name, help, std::move(labels));
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
      if (auto* s = find_series(detail::MetricKind::summary, name, prepared.key))
        return existing(*s);
    }
    detail::MetricSeries series;  // built outside the lock: it allocates every slot
    auto owned = std::make_unique<WindowedHistogram<C>>(window, slots, options, std::move(clock));
    WindowedHistogram<C>& result = *owned;
    series.windowed = std::move(owned);
    series.windowed_clock = &detail::windowed_clock_tag<C>;
    std::unique_lock lock(state_->mutex);
    if (auto* s = find_series(detail::MetricKind::summary, name, prepared.key)) return existing(*s);
    insert_series(detail::MetricKind::summary, name, help, std::move(prepared), std::move(series));
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
  // with no series left (callback gauges all unregistered) are omitted. Serve it with
  // Content-Type `text/plain; version=0.0.4; charset=utf-8`. Calls the gauge callbacks
  // and snapshots every histogram. Blocks registrations (not updates) while it runs;
  // allocates; throws std::bad_alloc. Thread-safe.
  [[nodiscard]] std::string prometheus() const {
    std::string out;
    std::array<std::chrono::nanoseconds, summary_quantiles.size()> q{};
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
      out += detail::metric_kind_name(family.kind);
      out += '\n';
      for (const auto& [key, series] : family.series) {
        switch (family.kind) {
          case detail::MetricKind::counter:
            append_sample_start(out, name, {}, key, {});
            detail::append_uint(out, series.counter->value());
            out += '\n';
            break;
          case detail::MetricKind::gauge:
            append_sample_start(out, name, {}, key, {});
            detail::append_prometheus_double(out, gauge_value(series));
            out += '\n';
            break;
          case detail::MetricKind::summary: {
            const detail::SummaryReading reading = detail::read_summary(series);
            const bool empty = reading.quantiles.count() == 0;
            if (!empty) reading.quantiles.percentiles(summary_percentiles(), q);
            for (std::size_t i = 0; i < q.size(); ++i) {
              append_sample_start(out, name, {}, key, quantile_text(i));
              detail::append_prometheus_double(
                  out, empty ? std::numeric_limits<double>::quiet_NaN() : seconds(q[i]));
              out += '\n';
            }
            append_sample_start(out, name, "_sum", key, {});
            detail::append_prometheus_double(out, reading.sum_seconds);
            out += '\n';
            append_sample_start(out, name, "_count", key, {});
            detail::append_uint(out, reading.count);
            out += '\n';
            break;
          }
        }
      }
    }
    return out;
  }

  // The same content as prometheus(), as one JSON object:
  //   {"families":[{"name":..,"type":"counter"|"gauge"|"summary","help":..,"samples":[
  //     {"labels":{..},"value":v}                                  (counter, gauge)
  //     {"labels":{..},"count":n,"sum":s,"quantiles":{"0.5":v,..}}  (summary, seconds)
  //   ]}]}
  // NaN and infinities (JSON has none) are written as null. Blocks, allocates and throws
  // like prometheus(). Thread-safe.
  [[nodiscard]] std::string json() const {
    std::string out = "{\"families\":[";
    std::array<std::chrono::nanoseconds, summary_quantiles.size()> q{};
    std::shared_lock lock(state_->mutex);
    bool first_family = true;
    for (const auto& [name, family] : state_->families) {
      if (family.series.empty()) continue;
      if (!first_family) out += ',';
      first_family = false;
      out += "{\"name\":";
      detail::append_json_string(out, name);
      out += ",\"type\":\"";
      out += detail::metric_kind_name(family.kind);
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
          case detail::MetricKind::summary: {
            const detail::SummaryReading reading = detail::read_summary(series);
            out += ",\"count\":";
            detail::append_uint(out, reading.count);
            out += ",\"sum\":";
            detail::append_json_double(out, reading.sum_seconds);
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
      if (kind == detail::MetricKind::summary && label == "quantile") {
        fail(name, {}, "is a histogram: its label name \"quantile\" is reserved for the quantiles");
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
           std::string("is already registered as a ") + detail::metric_kind_name(fam->second.kind) +
               "; it cannot also be a " + detail::metric_kind_name(kind));
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

  // name + suffix + {key[,quantile="q"]} + ' '
  static void append_sample_start(std::string& out, std::string_view name, std::string_view suffix,
                                  std::string_view key, std::string_view quantile) {
    out += name;
    out += suffix;
    if (!key.empty() || !quantile.empty()) {
      out += '{';
      out += key;
      if (!quantile.empty()) {
        if (!key.empty()) out += ',';
        out += "quantile=\"";
        out += quantile;
        out += '"';
      }
      out += '}';
    }
    out += ' ';
  }

  std::shared_ptr<detail::MetricsState> state_;
};

}  // namespace tailbatch
