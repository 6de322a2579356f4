// Record and replay: what a live load run did, request by request and batch by batch, and
// what the simulator predicts for the same arrivals.
//
// Recording. A TraceRecorder is told, for every request of a run, when it was meant to be
// sent (the load generator's intended time), when it reached the Pipeline, and when its
// outcome came back; RecordingPolicy<P> wraps the run's batch policy and tells it each
// executed batch (BatchFeedback: when it closed and why, its size and lane, when its model
// call started and ended). The result is a LoadTrace, written and read as text
// (write_trace / read_trace, format below).
//
// Replay. replay_trace() plays the trace's arrivals through the simulator (simulator.hpp)
// under a policy (normally the one recorded), with each batch's lane time drawn from the
// model times recorded for its size, and prints predicted against measured percentiles.
// What the simulator does not model by itself is measured from the trace and put back
// (ReplayConfig says which): the time from a batch's close to its model call (the worker's
// wake-up, holding the lane), the time from a batch's end to each of its completions
// (delivery, by position in the batch), the time from a request's intended send to its
// submit (the load generator sharing the cores), and the spread of the model's time at
// one size. trace_breakdown() splits the measured latency into these parts.
//
// The text format, one record per line, fields separated by single spaces, times in
// nanoseconds from the recorder's origin (the start of the run):
//
//   tailbatch-trace 1
//   setup KEY=VALUE ...                 how the run was made (policy, lanes, max_batch,
//                                       window_ms, slo_p95_ms, model, ...); free keys,
//                                       values without spaces
//   r INDEX INTENDED SUBMITTED COMPLETED STATUS MEASURED
//                                       one request: COMPLETED is -1 if it never came back;
//                                       STATUS ok|rejected|deadline_exceeded|cancelled|failed;
//                                       MEASURED 1 after the warm-up, 0 during it
//   b CLOSED STARTED ENDED SIZE LANE REASON
//                                       one executed batch: REASON as DispatchReason's name
//
// Requests come in index order, batches in order of closing. Lines starting with '#' and
// blank lines are ignored. read_trace() throws std::invalid_argument naming the line.
//
// Thread-safety: TraceRecorder's members may be called from any threads at once (one
// mutex); LoadTrace is a plain value; replay_trace() is single-threaded and deterministic
// for a trace, policy and seed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/outcome.hpp>
#include <tailbatch/tools/simulator.hpp>
#include <utility>
#include <vector>

namespace tailbatch {

// One request of a recorded run; times from the trace's origin.
struct TraceRequest {
  std::uint64_t index = 0;
  std::chrono::nanoseconds intended{0};    // when the load generator meant to send it
  std::chrono::nanoseconds submitted{0};   // when it was handed to the Pipeline
  std::chrono::nanoseconds completed{-1};  // when its outcome came back; -1: never
  Status status = Status::ok;
  bool measured = true;  // intended after the warm-up
};

// One executed batch of a recorded run; times from the trace's origin.
struct TraceBatch {
  std::chrono::nanoseconds closed{0};   // the policy's decision (BatchFeedback::closed)
  std::chrono::nanoseconds started{0};  // the model call began
  std::chrono::nanoseconds ended{0};    // the model call returned
  std::size_t size = 0;
  std::size_t lane = 0;
  DispatchReason reason = DispatchReason::window;
};

// A recorded run: how it was made, its requests and its batches.
struct LoadTrace {
  std::map<std::string, std::string> setup;
  std::vector<TraceRequest> requests;  // by index
  std::vector<TraceBatch> batches;     // by close time

  // setup[key] read as a number, or `fallback` when absent or not a number. Thread-safe.
  [[nodiscard]] double number(const std::string& key, double fallback) const noexcept {
    const auto it = setup.find(key);
    if (it == setup.end()) return fallback;
    try {
      std::size_t used = 0;
      const double v = std::stod(it->second, &used);
      return used == it->second.size() ? v : fallback;
    } catch (...) {
      return fallback;
    }
  }
  // setup[key], or `fallback`. Thread-safe.
  [[nodiscard]] std::string text(const std::string& key, const std::string& fallback) const {
    const auto it = setup.find(key);
    return it == setup.end() ? fallback : it->second;
  }
};

// Writes `t` in the text format (see the top of the file). Throws what the stream throws
// (if exceptions are enabled on it) and std::invalid_argument for a setup key or value
// with a space, '=' in a key, or an empty key.
inline void write_trace(std::ostream& out, const LoadTrace& t) {
  out << "tailbatch-trace 1\nsetup";
  for (const auto& [k, v] : t.setup) {
    if (k.empty() || k.find_first_of(" =\t\n") != std::string::npos ||
        v.find_first_of(" \t\n") != std::string::npos)
      detail::throw_invalid_argument(
          "write_trace: setup keys and values must have no spaces (and keys no '=')");
    out << ' ' << k << '=' << v;
  }
  out << '\n';
  for (const auto& r : t.requests) {
    out << "r " << r.index << ' ' << r.intended.count() << ' ' << r.submitted.count() << ' '
        << r.completed.count() << ' ' << to_string(r.status) << ' ' << (r.measured ? 1 : 0) << '\n';
  }
  for (const auto& b : t.batches) {
    out << "b " << b.closed.count() << ' ' << b.started.count() << ' ' << b.ended.count() << ' '
        << b.size << ' ' << b.lane << ' ' << to_string(b.reason) << '\n';
  }
}

namespace tools::detail {

[[noreturn]] inline void trace_error(std::size_t line, const std::string& what) {
  tailbatch::detail::throw_invalid_argument("read_trace: line " + std::to_string(line) + ": " +
                                            what);
}

inline Status status_named(std::string_view s, std::size_t line) {
  for (const Status v :
       {Status::ok, Status::rejected, Status::deadline_exceeded, Status::cancelled, Status::failed})
    if (to_string(v) == s) return v;
  trace_error(line, "unknown status \"" + std::string(s) + "\"");
}

inline DispatchReason reason_named(std::string_view s, std::size_t line) {
  for (std::size_t i = 0; i < dispatch_reason_count; ++i)
    if (to_string(static_cast<DispatchReason>(i)) == s) return static_cast<DispatchReason>(i);
  trace_error(line, "unknown dispatch reason \"" + std::string(s) + "\"");
}

}  // namespace tools::detail

// Reads a trace written by write_trace. Throws std::invalid_argument naming the line
// ("read_trace: line 3: ...") for a missing or unknown header, a malformed record, times
// that run backwards (submitted before intended, a batch ending before it started), or
// requests out of index order.
inline LoadTrace read_trace(std::istream& in) {
  LoadTrace t;
  std::string line;
  std::size_t n = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string kind;
    f >> kind;
    if (!header) {
      int format_version = 0;
      if (kind != "tailbatch-trace" || !(f >> format_version))
        tools::detail::trace_error(n, "not a tailbatch trace (expected \"tailbatch-trace 1\")");
      if (format_version != 1)
        tools::detail::trace_error(n, "unsupported version " + std::to_string(format_version));
      header = true;
      continue;
    }
    if (kind == "setup") {
      std::string kv;
      while (f >> kv) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0)
          tools::detail::trace_error(n, "setup: expected KEY=VALUE, got \"" + kv + "\"");
        t.setup[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    } else if (kind == "r") {
      TraceRequest r;
      std::int64_t a = 0, b = 0, c = 0;
      std::string status;
      int measured = -1;
      if (!(f >> r.index >> a >> b >> c >> status >> measured) || (measured != 0 && measured != 1))
        tools::detail::trace_error(n,
                                   "expected r INDEX INTENDED SUBMITTED COMPLETED STATUS MEASURED");
      r.intended = std::chrono::nanoseconds(a);
      r.submitted = std::chrono::nanoseconds(b);
      r.completed = std::chrono::nanoseconds(c);
      r.status = tools::detail::status_named(status, n);
      r.measured = measured == 1;
      if (r.submitted < r.intended) tools::detail::trace_error(n, "submitted before intended");
      if (c != -1 && r.completed < r.submitted)
        tools::detail::trace_error(n, "completed before submitted");
      if (!t.requests.empty() && r.index <= t.requests.back().index)
        tools::detail::trace_error(n, "requests out of index order");
      t.requests.push_back(r);
    } else if (kind == "b") {
      TraceBatch b;
      std::int64_t c = 0, s = 0, e = 0;
      std::string reason;
      if (!(f >> c >> s >> e >> b.size >> b.lane >> reason) || b.size == 0)
        tools::detail::trace_error(n, "expected b CLOSED STARTED ENDED SIZE LANE REASON");
      b.closed = std::chrono::nanoseconds(c);
      b.started = std::chrono::nanoseconds(s);
      b.ended = std::chrono::nanoseconds(e);
      b.reason = tools::detail::reason_named(reason, n);
      if (b.started < b.closed || b.ended < b.started)
        tools::detail::trace_error(n, "batch times run backwards");
      t.batches.push_back(b);
    } else {
      tools::detail::trace_error(n, "unknown record \"" + kind + "\"");
    }
    std::string extra;
    if (f >> extra) tools::detail::trace_error(n, "unexpected \"" + extra + "\"");
  }
  if (!header) tools::detail::trace_error(n, "empty: no \"tailbatch-trace 1\" header");
  std::stable_sort(t.batches.begin(), t.batches.end(),
                   [](const TraceBatch& x, const TraceBatch& y) { return x.closed < y.closed; });
  return t;
}

// Collects a live run's trace. Times are taken from the steady clock's time points the
// caller passes and stored from `origin`. Thread-safe (one mutex; a call costs a lock and,
// now and then, a vector's growth). A record that cannot be stored (out of memory) is
// dropped and counted in dropped().
class TraceRecorder {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  explicit TraceRecorder(time_point origin = std::chrono::steady_clock::now()) noexcept
      : origin_(origin) {}

  // Request `index` was meant to go at `intended` and was handed to the Pipeline at `at`.
  void submitted(std::uint64_t index, time_point intended, time_point at, bool measured) noexcept {
    std::lock_guard lock(mu_);
    TraceRequest* r = slot(index);
    if (r == nullptr) return;
    r->index = index;
    r->intended = since(intended);
    r->submitted = std::max(since(at), r->intended);
    r->measured = measured;
  }
  // Request `index` came back with `status` at `at`.
  void completed(std::uint64_t index, Status status, time_point at) noexcept {
    std::lock_guard lock(mu_);
    TraceRequest* r = slot(index);
    if (r == nullptr) return;
    r->completed = since(at);
    r->status = status;
  }
  // One executed batch, as the Pipeline reports it to its policy.
  void batch(const BatchFeedback& f) noexcept {
    TraceBatch b;
    b.closed = since(f.closed);
    b.started = std::max(since(f.started), b.closed);
    b.ended =
        b.started + std::max(std::chrono::duration_cast<std::chrono::nanoseconds>(f.model_time),
                             std::chrono::nanoseconds(0));
    b.size = f.size;
    b.lane = f.lane;
    b.reason = f.reason;
    std::lock_guard lock(mu_);
    try {
      batches_.push_back(b);
    } catch (...) {
      ++dropped_;
    }
  }
  // Records that could not be stored. Thread-safe.
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    std::lock_guard lock(mu_);
    return dropped_;
  }
  // What was recorded, with `setup`; the recorder is left empty. Requests never submitted
  // (indices skipped) are left out. Allocates.
  [[nodiscard]] LoadTrace take(std::map<std::string, std::string> setup) {
    LoadTrace t;
    t.setup = std::move(setup);
    std::lock_guard lock(mu_);
    t.requests.reserve(requests_.size());
    for (std::size_t i = 0; i < requests_.size(); ++i)
      if (present_[i]) t.requests.push_back(requests_[i]);
    t.batches = std::move(batches_);
    std::stable_sort(t.batches.begin(), t.batches.end(),
                     [](const TraceBatch& x, const TraceBatch& y) { return x.closed < y.closed; });
    requests_.clear();
    present_.clear();
    batches_.clear();
    return t;
  }

 private:
  std::chrono::nanoseconds since(time_point t) const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t - origin_);
  }
  TraceRequest* slot(std::uint64_t index) noexcept {
    try {
      if (index >= requests_.size()) {
        requests_.resize(static_cast<std::size_t>(index) + 1);
        present_.resize(static_cast<std::size_t>(index) + 1, false);
      }
    } catch (...) {
      ++dropped_;
      return nullptr;
    }
    present_[static_cast<std::size_t>(index)] = true;
    return &requests_[static_cast<std::size_t>(index)];
  }

  time_point origin_;
  mutable std::mutex mu_;
  std::vector<TraceRequest> requests_;
  std::vector<bool> present_;
  std::vector<TraceBatch> batches_;
  std::uint64_t dropped_ = 0;
};

// A batch policy that tells a TraceRecorder of each executed batch, then forwards the
// report to the policy it wraps if that one learns. Everything else is forwarded. The
// recorder (none: nullptr, nothing recorded) must outlive the policy and its copies.
// Thread-safe as the wrapped policy.
template <BatchPolicy P>
class RecordingPolicy {
 public:
  static constexpr bool uses_cost = tailbatch::detail::policy_uses_cost<P>();

  RecordingPolicy(P inner, TraceRecorder* recorder)
      : inner_(std::move(inner)), recorder_(recorder) {}

  [[nodiscard]] std::size_t max_batch() const noexcept { return inner_.max_batch(); }
  [[nodiscard]] BatchOrder order() const noexcept { return inner_.order(); }
  [[nodiscard]] BatchDecision decide(const BatchView& v) const noexcept { return inner_.decide(v); }
  void on_batch_executed(const BatchFeedback& f) const noexcept {
    if (recorder_ != nullptr) recorder_->batch(f);
    if constexpr (BatchFeedbackPolicy<P>) inner_.on_batch_executed(f);
  }
  [[nodiscard]] const P& inner() const noexcept { return inner_; }

 private:
  P inner_;
  TraceRecorder* recorder_;
};

// ---- what the trace says -----------------------------------------------------------------

// p50/p95/p99 of one part of the measured latency, milliseconds.
struct TracePart {
  double p50_ms = 0, p95_ms = 0, p99_ms = 0, mean_ms = 0;
};

// The measured requests' latency (intended send to completion) split into its parts, each
// request matched to its batch by order (FIFO policies: batches take the queue's oldest
// requests, in order of closing):
//   send       intended send -> submitted (the load generator late: shared cores)
//   queue      submitted -> its batch closed (the window, waiting for a lane, the leader's wake-up)
//   dispatch   closed -> model call started (handing the batch to its lane)
//   model      the model call
//   delivery   model call ended -> its completion came back
// matched is false when the batches do not account for the requests that ran (a
// non-FIFO policy, requests dropped at start): the parts other than total are then empty.
struct TraceBreakdown {
  TracePart total, send, queue, dispatch, model, delivery;
  // Batches closed by the window whose close came later than the first request's submit
  // plus window_ms (setup key window_ms; fixed windows only): how late the leader woke.
  TracePart window_lateness;
  std::size_t requests = 0, batches = 0;
  bool matched = false;
};

namespace tools::detail {

inline TracePart part_of(std::vector<std::chrono::nanoseconds> v) {
  TracePart p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const auto r = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()) / 100.0));
    return std::chrono::duration<double, std::milli>(
               v[std::min(v.size(), std::max<std::size_t>(r, 1)) - 1])
        .count();
  };
  p.p50_ms = at(50);
  p.p95_ms = at(95);
  p.p99_ms = at(99);
  double sum = 0;
  for (auto x : v) sum += std::chrono::duration<double, std::milli>(x).count();
  p.mean_ms = sum / static_cast<double>(v.size());
  return p;
}

// For each request that ran (in index order), the index of its batch in t.batches; empty
// when the sizes do not add up.
inline std::vector<std::size_t> batch_of_requests(const LoadTrace& t,
                                                  std::vector<std::size_t>& ran) {
  ran.clear();
  for (std::size_t i = 0; i < t.requests.size(); ++i) {
    const Status s = t.requests[i].status;
    if (t.requests[i].completed.count() >= 0 &&
        (s == Status::ok || s == Status::failed || s == Status::cancelled))
      ran.push_back(i);
  }
  std::size_t total = 0;
  for (const auto& b : t.batches) total += b.size;
  if (total != ran.size()) return {};
  std::vector<std::size_t> of(ran.size());
  std::size_t k = 0;
  for (std::size_t bi = 0; bi < t.batches.size(); ++bi)
    for (std::size_t j = 0; j < t.batches[bi].size; ++j) of[k++] = bi;
  return of;
}

}  // namespace tools::detail

// Splits the measured latency of `t` (see TraceBreakdown). Allocates. Thread-safe.
inline TraceBreakdown trace_breakdown(const LoadTrace& t) {
  using std::chrono::nanoseconds;
  TraceBreakdown out;
  std::vector<nanoseconds> total, send, queue, dispatch, model, delivery, late;
  for (const auto& r : t.requests)
    if (r.measured && r.status == Status::ok && r.completed.count() >= 0)
      total.push_back(r.completed - r.intended);
  out.requests = total.size();
  out.batches = t.batches.size();
  out.total = tools::detail::part_of(total);
  std::vector<std::size_t> ran;
  const auto of = tools::detail::batch_of_requests(t, ran);
  out.matched = !of.empty() || ran.empty();
  if (of.empty()) return out;
  std::vector<nanoseconds> first_submit(t.batches.size(), nanoseconds::max());
  for (std::size_t k = 0; k < ran.size(); ++k) {
    const auto& r = t.requests[ran[k]];
    const auto& b = t.batches[of[k]];
    first_submit[of[k]] = std::min(first_submit[of[k]], r.submitted);
    if (!r.measured || r.status != Status::ok) continue;
    send.push_back(r.submitted - r.intended);
    queue.push_back(std::max(b.closed - r.submitted, nanoseconds(0)));
    dispatch.push_back(b.started - b.closed);
    model.push_back(b.ended - b.started);
    delivery.push_back(std::max(r.completed - b.ended, nanoseconds(0)));
  }
  const double window_ms =
      t.text("policy", "fixed") == "fixed" ? t.number("window_ms", -1.0) : -1.0;
  if (window_ms >= 0) {
    const auto window = std::chrono::duration_cast<nanoseconds>(
        std::chrono::duration<double, std::milli>(window_ms));
    for (std::size_t bi = 0; bi < t.batches.size(); ++bi)
      if (t.batches[bi].reason == DispatchReason::window && first_submit[bi] != nanoseconds::max())
        late.push_back(
            std::max(t.batches[bi].closed - (first_submit[bi] + window), nanoseconds(0)));
  }
  out.send = tools::detail::part_of(send);
  out.queue = tools::detail::part_of(queue);
  out.dispatch = tools::detail::part_of(dispatch);
  out.model = tools::detail::part_of(model);
  out.delivery = tools::detail::part_of(delivery);
  out.window_lateness = tools::detail::part_of(late);
  return out;
}

// ---- replay ------------------------------------------------------------------------------

// What a replay puts back into the simulation from the trace (each measured there).
struct ReplayConfig {
  // Each batch's model time is its size's median recorded time (sizes never recorded:
  // the nearest recorded sizes' medians, interpolated or extrapolated by the last two),
  // run at the speed the machine had at that moment of the run: while a recorded batch
  // ran, the machine ran at its size's median over its time (a batch preempted for 5 ms
  // ran slowly for those 5 ms), and at full speed where no batch was recorded (false:
  // the median alone). The slow moments come where they came in the run (a neighbour's
  // burst slows whatever runs then), not at random, and a stall delays a batch by at
  // most its own length.
  bool cost_spread = true;
  // Arrivals at the recorded submit times, latency counted from the intended send times
  // (false: arrivals at the intended times).
  bool send_lag = true;
  // The close-to-start time of a batch, drawn from those recorded, added to its lane time.
  bool dispatch_lag = true;
  // Each completion's delay after its batch ended, drawn from those recorded at its
  // position in the batch.
  bool delivery_lag = true;
  std::uint64_t seed = 1;
};

// Predicted against measured, over the trace's measured requests.
struct ReplayResult {
  SimulationResult predicted;
  double measured_p50_ms = 0, measured_p95_ms = 0, measured_p99_ms = 0;
  double predicted_p50_ms = 0, predicted_p95_ms = 0, predicted_p99_ms = 0;
  std::uint64_t measured_ok = 0;
};

namespace tools::detail {

// Draws lane times per batch size from a trace, and the lags ReplayConfig puts back.
class TraceCosts {
 public:
  TraceCosts(const LoadTrace& t, const ReplayConfig& c) : cfg_(c), rng_(c.seed) {
    for (const auto& b : t.batches) {
      if (b.size >= by_size_.size()) by_size_.resize(b.size + 1);
      by_size_[b.size].push_back(b.ended - b.started);
      dispatch_.push_back(b.started - b.closed);
    }
    for (auto& v : by_size_) std::sort(v.begin(), v.end());
    fit_curve();
    // The machine's speed while each recorded batch ran: its size's median over its time.
    for (const auto& b : t.batches) {
      const auto took = static_cast<double>((b.ended - b.started).count());
      const double med = static_cast<double>(median(b.size).count());
      speed_.push_back(
          Segment{b.started, b.ended, took > 0 && med > 0 ? std::clamp(med / took, 0.0, 4.0) : 1.0});
    }
    std::sort(speed_.begin(), speed_.end(),
              [](const Segment& x, const Segment& y) { return x.from < y.from; });
    std::vector<std::size_t> ran;
    const auto of = batch_of_requests(t, ran);
    if (!of.empty()) {
      std::vector<std::size_t> position(t.batches.size(), 0);
      for (std::size_t k = 0; k < ran.size(); ++k) {
        const std::size_t pos = position[of[k]]++;
        const auto& r = t.requests[ran[k]];
        if (pos >= delivery_.size()) delivery_.resize(pos + 1);
        delivery_[pos].push_back(
            std::max(r.completed - t.batches[of[k]].ended, std::chrono::nanoseconds(0)));
      }
    }
  }

  [[nodiscard]] bool empty() const noexcept { return dispatch_.empty(); }

  // A batch of b starting at `at` (the trace's time).
  std::chrono::nanoseconds lane_time(std::size_t b, std::chrono::nanoseconds at) {
    auto t = model_time(b, at);
    if (cfg_.dispatch_lag && !dispatch_.empty()) t += draw(dispatch_);
    return t;
  }
  std::chrono::nanoseconds delivery(std::size_t position) {
    if (!cfg_.delivery_lag || delivery_.empty()) return std::chrono::nanoseconds(0);
    return draw(delivery_[std::min(position, delivery_.size() - 1)]);
  }
  // The modelled time of a batch of b: the median recorded at b where b ran at least
  // anchor_min times; between such sizes interpolated; outside them, the slope of a
  // least-squares line over every recorded size (weighted by count) from the nearest one.
  // (A size seen once or twice is one noisy sample: it neither sets its own cost nor
  // bends the line much.)
  [[nodiscard]] std::chrono::nanoseconds median(std::size_t b) const noexcept {
    if (curve_.empty()) return std::chrono::nanoseconds(0);
    const double v = b < curve_.size()
                         ? curve_[b]
                         : curve_.back() + slope_ * static_cast<double>(b - (curve_.size() - 1));
    return std::chrono::nanoseconds(static_cast<std::int64_t>(std::max(0.0, v)));
  }

 private:
  std::chrono::nanoseconds model_time(std::size_t b, std::chrono::nanoseconds at) {
    const auto m = median(b);
    if (!cfg_.cost_spread || speed_.empty()) return m;
    // Work m (at full speed) done from `at` at the recorded speeds: segment k holds from
    // its start to the earlier of its end and the next one's start; full speed between.
    auto it =
        std::upper_bound(speed_.begin(), speed_.end(), at,
                         [](std::chrono::nanoseconds x, const Segment& g) { return x < g.from; });
    std::size_t k =
        it == speed_.begin() ? speed_.size() : static_cast<std::size_t>(it - speed_.begin()) - 1;
    double left = static_cast<double>(m.count());
    double t = static_cast<double>(at.count());
    const double inf = std::numeric_limits<double>::infinity();
    for (int guard = 0; guard < 100000; ++guard) {
      double speed = 1.0, until = inf;
      std::size_t next = k == speed_.size() ? 0 : k + 1;
      if (k != speed_.size()) {
        const double end = static_cast<double>(speed_[k].to.count());
        const double next_from =
            next < speed_.size() ? static_cast<double>(speed_[next].from.count()) : inf;
        if (t < end) {
          speed = speed_[k].speed;
          until = std::min(end, next_from);
        } else {
          until = next_from;
        }
      } else {
        until = speed_.empty() || t >= static_cast<double>(speed_.front().from.count())
                    ? inf
                    : static_cast<double>(speed_.front().from.count());
      }
      if ((until - t) * speed >= left) {
        t += left / speed;
        left = 0;
        break;
      }
      left -= (until - t) * speed;
      t = until;
      k = next;
    }
    t += left;  // (past the guard: the rest at full speed)
    return std::chrono::nanoseconds(static_cast<std::int64_t>(t) - at.count());
  }
  static constexpr std::size_t anchor_min = 5;

  void fit_curve() {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    std::vector<std::size_t> anchors;
    for (std::size_t b = 1; b < by_size_.size(); ++b) {
      const auto& v = by_size_[b];
      if (v.empty()) continue;
      const double w = static_cast<double>(v.size()), x = static_cast<double>(b);
      const double y = static_cast<double>(v[(v.size() - 1) / 2].count());
      sw += w;
      sx += w * x;
      sy += w * y;
      sxx += w * x * x;
      sxy += w * x * y;
      if (v.size() >= anchor_min) anchors.push_back(b);
    }
    if (sw == 0) return;
    const double mx = sx / sw, my = sy / sw, var = sxx / sw - mx * mx;
    slope_ = var > 0 ? std::max(0.0, (sxy / sw - mx * my) / var) : 0.0;
    const double intercept = my - slope_ * mx;
    const std::size_t top = by_size_.size() - 1;
    curve_.assign(top + 1, 0.0);
    auto med = [&](std::size_t b) {
      return static_cast<double>(by_size_[b][(by_size_[b].size() - 1) / 2].count());
    };
    if (anchors.empty()) {
      for (std::size_t b = 1; b <= top; ++b)
        curve_[b] = intercept + slope_ * static_cast<double>(b);
      return;
    }
    for (std::size_t b = 1; b <= top; ++b) {
      auto hi = std::lower_bound(anchors.begin(), anchors.end(), b);
      if (hi != anchors.end() && *hi == b) {
        curve_[b] = med(b);
      } else if (hi == anchors.begin()) {
        curve_[b] = med(*hi) - slope_ * static_cast<double>(*hi - b);
      } else if (hi == anchors.end()) {
        curve_[b] = med(anchors.back()) + slope_ * static_cast<double>(b - anchors.back());
      } else {
        const std::size_t lo = *std::prev(hi);
        curve_[b] = med(lo) + (med(*hi) - med(lo)) * static_cast<double>(b - lo) /
                                  static_cast<double>(*hi - lo);
      }
    }
    for (std::size_t b = 2; b <= top; ++b) curve_[b] = std::max(curve_[b], curve_[b - 1]);
  }

  std::chrono::nanoseconds draw(const std::vector<std::chrono::nanoseconds>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng_)];
  }

  ReplayConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::chrono::nanoseconds>> by_size_;
  std::vector<std::chrono::nanoseconds> dispatch_;
  std::vector<std::vector<std::chrono::nanoseconds>> delivery_;
  struct Segment {
    std::chrono::nanoseconds from, to;
    double speed;  // the size's median over the time taken, at most 4
  };
  std::vector<Segment> speed_;  // by start
  std::vector<double> curve_;   // modelled time by size, ns (index 0 unused)
  double slope_ = 0.0;          // ns per request beyond the recorded sizes
};

}  // namespace tools::detail

// Replays `t`'s arrivals through the simulator under `policy` on setup["lanes"] lanes
// (default 1), with the recorded costs and what `config` puts back, and compares the
// predicted percentiles with the measured ones (intended send to completion, measured
// requests that completed ok). Deterministic for the same trace, policy and seed.
// Throws std::invalid_argument if the trace has no executed batch or no request.
// Single-threaded; allocates.
template <BatchPolicy Policy>
[[nodiscard]] ReplayResult replay_trace(const LoadTrace& t, Policy policy,
                                        const ReplayConfig& config = {}) {
  using std::chrono::nanoseconds;
  if (t.requests.empty())
    tailbatch::detail::throw_invalid_argument("replay_trace: the trace has no request");
  if (t.batches.empty())
    tailbatch::detail::throw_invalid_argument("replay_trace: the trace has no executed batch");
  auto costs = std::make_shared<tools::detail::TraceCosts>(t, config);

  SimulationConfig c;
  c.lanes = static_cast<std::size_t>(std::max(1.0, t.number("lanes", 1.0)));
  c.queue_capacity = static_cast<std::size_t>(std::max(1.0, t.number("queue", 4096.0)));
  c.max_requests = t.requests.size();
  // The simulation's time starts at the first arrival.
  const nanoseconds origin = std::min(t.requests.front().intended, t.requests.front().submitted);
  std::optional<nanoseconds> warm;
  for (const auto& r : t.requests) {
    const nanoseconds at = (config.send_lag ? r.submitted : r.intended) - origin;
    c.arrival_times.push_back(at);
    c.latency_from.push_back(r.intended - origin);
    if (r.measured && !warm) warm = at;
  }
  // Submits are in index order, but a clock read can go by a nanosecond: keep ascending.
  for (std::size_t i = 1; i < c.arrival_times.size(); ++i)
    c.arrival_times[i] = std::max(c.arrival_times[i], c.arrival_times[i - 1]);
  c.warmup = warm ? *warm : nanoseconds(0);
  if (c.warmup >= c.arrival_times.back() + nanoseconds(1)) c.warmup = nanoseconds(0);
  // The simulation's clock (copies share its time) tells when each batch starts.
  const ManualClock sim_clock = c.clock;
  const BatchTime sim_start = sim_clock.now();
  c.service_time = [costs, sim_clock, sim_start, origin](std::size_t b) {
    return costs->lane_time(
        b, origin + std::chrono::duration_cast<nanoseconds>(sim_clock.now() - sim_start));
  };
  c.completion_delay = [costs](std::size_t pos) { return costs->delivery(pos); };

  ReplayResult out;
  out.predicted = simulate(c, std::move(policy));
  LatencyHistogram h;
  for (const auto& r : t.requests)
    if (r.measured && r.status == Status::ok && r.completed.count() >= 0) {
      h.record(r.completed - r.intended);
      ++out.measured_ok;
    }
  const HistogramSnapshot m = h.snapshot();
  auto ms = [](nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); };
  out.measured_p50_ms = ms(m.percentile(50));
  out.measured_p95_ms = ms(m.percentile(95));
  out.measured_p99_ms = ms(m.percentile(99));
  out.predicted_p50_ms = ms(out.predicted.p50);
  out.predicted_p95_ms = ms(out.predicted.p95);
  out.predicted_p99_ms = ms(out.predicted.p99);
  return out;
}

}  // namespace tailbatch
