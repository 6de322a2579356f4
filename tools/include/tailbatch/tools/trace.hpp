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
      int version = 0;
      if (kind != "tailbatch-trace" || !(f >> version))
        tools::detail::trace_error(n, "not a tailbatch trace (expected \"tailbatch-trace 1\")");
      if (version != 1)
        tools::detail::trace_error(n, "unsupported version " + std::to_string(version));
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
  // Each batch's model time drawn at random from the times recorded at its size (false:
  // their median). Sizes never recorded: the nearest recorded sizes' medians, interpolated
  // (or extrapolated by the last two).
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

  std::chrono::nanoseconds lane_time(std::size_t b) {
    auto t = model_time(b);
    if (cfg_.dispatch_lag && !dispatch_.empty()) t += draw(dispatch_);
    return t;
  }
  std::chrono::nanoseconds delivery(std::size_t position) {
    if (!cfg_.delivery_lag || delivery_.empty()) return std::chrono::nanoseconds(0);
    return draw(delivery_[std::min(position, delivery_.size() - 1)]);
  }
  // The median recorded model time at size b, or interpolated.
  [[nodiscard]] std::chrono::nanoseconds median(std::size_t b) const noexcept {
    if (b < by_size_.size() && !by_size_[b].empty()) return by_size_[b][by_size_[b].size() / 2];
    std::optional<std::size_t> lo, hi, lo2, hi2;
    for (std::size_t s = std::min(b, by_size_.size()); s-- > 1;)
      if (!by_size_[s].empty()) {
        if (!lo)
          lo = s;
        else if (!lo2) {
          lo2 = s;
          break;
        }
      }
    for (std::size_t s = b + 1; s < by_size_.size(); ++s)
      if (!by_size_[s].empty()) {
        if (!hi)
          hi = s;
        else if (!hi2) {
          hi2 = s;
          break;
        }
      }
    auto med = [&](std::size_t s) {
      return static_cast<double>(by_size_[s][by_size_[s].size() / 2].count());
    };
    auto line = [&](std::size_t a, std::size_t c) {
      const double slope = (med(c) - med(a)) / static_cast<double>(c - a);
      return std::chrono::nanoseconds(static_cast<std::int64_t>(
          std::max(0.0, med(a) + slope * (static_cast<double>(b) - static_cast<double>(a)))));
    };
    if (lo && hi) return line(*lo, *hi);
    if (lo && lo2) return line(*lo2, *lo);
    if (hi && hi2) return line(*hi, *hi2);
    if (lo) return std::chrono::nanoseconds(static_cast<std::int64_t>(med(*lo)));
    if (hi) return std::chrono::nanoseconds(static_cast<std::int64_t>(med(*hi)));
    return std::chrono::nanoseconds(0);
  }

 private:
  std::chrono::nanoseconds model_time(std::size_t b) {
    if (cfg_.cost_spread && b < by_size_.size() && !by_size_[b].empty()) return draw(by_size_[b]);
    return median(b);
  }
  std::chrono::nanoseconds draw(const std::vector<std::chrono::nanoseconds>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng_)];
  }

  ReplayConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::chrono::nanoseconds>> by_size_;
  std::vector<std::chrono::nanoseconds> dispatch_;
  std::vector<std::vector<std::chrono::nanoseconds>> delivery_;
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
  c.service_time = [costs](std::size_t b) { return costs->lane_time(b); };
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
