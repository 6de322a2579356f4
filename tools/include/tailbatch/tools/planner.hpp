// Capacity planner: the latency field guide's back-of-the-envelope capacity math, as a function.
//
// Given how long the model takes for a batch of b requests, the planner works out, for every
// candidate batch size, what one request costs end to end, what p95 to expect, how many
// requests per second one stream and one instance serve, how many replicas a target load
// needs (with and without headroom), how many requests are in flight by Little's law, and
// what cap to put on in-flight work. It then recommends the batch size with the highest
// instance throughput whose estimated p95 meets the SLO, and says why.
//
// The formulas (docs/planner.md works the latency field guide's examples through them):
//   model(b)        = base + per_item × (b − 1), or interpolated from a measured table
//   request(b)      = model(b) + network + (b > 1 ? window : 0)
//   p95(b)          = tail × request(b)
//   stream_rps(b)   = b / request(b)
//   instance_rps(b) = streams × stream_rps(b)
//   replicas        = ceil(target / instance_rps), with headroom ceil(target × (1 + h) / instance_rps)
//   concurrency     = instance_rps × p95                     (Little's law, sized for the tail)
//   max_in_flight   = max(1.1 × concurrency rounded up to 1, 5 or 10, b × streams)
//
// Counts (replicas, in-flight caps) are std::int64_t and at most max_planned_count
// (2^53 − 1, the largest whole number a double and a JSON reader hold exactly); a figure
// beyond it, or not finite, throws std::invalid_argument naming the inputs, never wraps.
//
// Everything here is plain arithmetic on doubles in milliseconds and requests per second:
// no clocks, no threads, no global state. Functions are pure; every type is a value type.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

// The largest replica count or in-flight cap the planner reports: 2^53 − 1, the largest
// whole number that a double (the planner's arithmetic) and a JSON reader hold exactly.
// A plan that needs more throws std::invalid_argument rather than wrap or round.
inline constexpr std::int64_t max_planned_count = (std::int64_t{1} << 53) - 1;

// Every batch size up to this is a candidate when plan_capacity enumerates a linear
// profile; above it the candidates thin out geometrically (see plan_capacity).
inline constexpr int dense_candidate_limit = 1024;

// One measured point of a latency profile: the model's time for a batch of batch_size.
struct ProfilePoint {
  int batch_size = 1;
  double model_ms = 0.0;
};

// How long the model takes for a batch of b requests: either the latency field guide's linear model
// (base + per_item × (b − 1)) or a table measured on the real model.
//
// A value type. Immutable after construction; thread-safe to share. Construction validates
// and throws std::invalid_argument naming the field.
class LatencyProfile {
 public:
  // The linear model L(b) = base_ms + per_item_ms × (b − 1). Throws std::invalid_argument
  // if base_ms <= 0 or per_item_ms < 0 (or either is not finite). Allocates nothing.
  // Thread-safe.
  [[nodiscard]] static LatencyProfile linear(double base_ms, double per_item_ms) {
    if (!(std::isfinite(base_ms) && base_ms > 0.0))
      tailbatch::detail::throw_invalid_argument("LatencyProfile: base_ms must be > 0");
    if (!(std::isfinite(per_item_ms) && per_item_ms >= 0.0))
      tailbatch::detail::throw_invalid_argument("LatencyProfile: per_item_ms must be >= 0");
    LatencyProfile p;
    p.base_ms_ = base_ms;
    p.per_item_ms_ = per_item_ms;
    return p;
  }

  // A measured table. Points may come in any order; batch sizes must be >= 1 and distinct,
  // times > 0. Between measured sizes the time is interpolated linearly; outside the
  // measured range it is not defined (the planner never extrapolates a measurement).
  // Allocates. Throws std::invalid_argument naming the offending point. Thread-safe.
  [[nodiscard]] static LatencyProfile measured(std::vector<ProfilePoint> points) {
    if (points.empty()) tailbatch::detail::throw_invalid_argument("LatencyProfile: the measured table is empty");
    std::sort(points.begin(), points.end(),
              [](const ProfilePoint& a, const ProfilePoint& b) { return a.batch_size < b.batch_size; });
    for (std::size_t i = 0; i < points.size(); ++i) {
      const auto& pt = points[i];
      if (pt.batch_size < 1)
        tailbatch::detail::throw_invalid_argument("LatencyProfile: batch size " + std::to_string(pt.batch_size) +
                                    " must be >= 1");
      if (!(std::isfinite(pt.model_ms) && pt.model_ms > 0.0))
        tailbatch::detail::throw_invalid_argument("LatencyProfile: the latency of batch " +
                                    std::to_string(pt.batch_size) + " must be > 0 ms");
      if (i > 0 && points[i - 1].batch_size == pt.batch_size)
        tailbatch::detail::throw_invalid_argument("LatencyProfile: batch size " + std::to_string(pt.batch_size) +
                                    " is listed twice");
    }
    LatencyProfile p;
    p.points_ = std::move(points);
    return p;
  }

  // Parses a measured table written as "1:20,8:41,16:65" (batch:ms pairs separated by
  // commas, semicolons or white space) or as the text of a file with one "batch ms" pair
  // per line (separated by white space, a comma or a colon; '#' starts a comment; a first
  // line without a number, such as "batch,latency_ms", is taken as a header). Allocates.
  // Throws std::invalid_argument quoting the text that could not be read. Thread-safe.
  [[nodiscard]] static LatencyProfile parse(std::string_view text) {
    std::vector<ProfilePoint> points;
    bool first_content_line = true;
    std::size_t line_start = 0;
    while (line_start <= text.size()) {
      std::size_t line_end = text.find('\n', line_start);
      if (line_end == std::string_view::npos) line_end = text.size();
      std::string_view line = text.substr(line_start, line_end - line_start);
      line_start = line_end + 1;
      if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
      auto fields = split_numbers(line);
      if (fields.empty()) continue;
      bool any_number = std::any_of(fields.begin(), fields.end(), [](std::string_view f) {
        double v = 0;
        return parse_double(f, v);
      });
      if (!any_number && first_content_line) {  // a header line such as "batch,latency_ms"
        first_content_line = false;
        continue;
      }
      first_content_line = false;
      const bool colon_pairs = line.find(':') != std::string_view::npos;
      if (!colon_pairs && fields.size() != 2)
        tailbatch::detail::throw_invalid_argument("LatencyProfile: cannot read \"" + std::string(trim(line)) +
                                    "\": expected batch:ms pairs (\"1:20,8:41\") or one "
                                    "\"batch ms\" pair per line");
      if (colon_pairs) {
        // "1:20,8:41,16:65": pairs joined by ':', the pairs split by the separators.
        for (auto pair : split_pairs(line)) points.push_back(read_pair(pair, ':'));
      } else {
        points.push_back(read_fields(fields[0], fields[1], line));
      }
    }
    if (points.empty())
      tailbatch::detail::throw_invalid_argument("LatencyProfile: no batch:ms pairs found in \"" +
                                  std::string(trim(text.substr(0, 80))) + "\"");
    return measured(std::move(points));
  }

  // True for a measured table, false for the linear model. Never throws. Thread-safe.
  [[nodiscard]] bool is_measured() const noexcept { return !points_.empty(); }

  // The measured points, sorted by batch size (empty for the linear model). Thread-safe.
  [[nodiscard]] std::span<const ProfilePoint> points() const noexcept { return points_; }

  // The smallest and largest batch size the profile defines: 1 and `limit` for the linear
  // model, the measured range for a table. Never throws. Thread-safe.
  [[nodiscard]] int min_batch() const noexcept { return points_.empty() ? 1 : points_.front().batch_size; }
  [[nodiscard]] int max_batch(int limit) const noexcept {
    return points_.empty() ? limit : std::min(limit, points_.back().batch_size);
  }

  // The model's time in ms for a batch of batch_size. Throws std::invalid_argument if
  // batch_size < 1 or lies outside a measured table's range. Never allocates except for
  // the exception's message. Thread-safe.
  [[nodiscard]] double model_ms(int batch_size) const {
    if (batch_size < 1) tailbatch::detail::throw_invalid_argument("LatencyProfile: batch size must be >= 1");
    if (points_.empty()) return base_ms_ + per_item_ms_ * static_cast<double>(batch_size - 1);
    if (batch_size < points_.front().batch_size || batch_size > points_.back().batch_size)
      tailbatch::detail::throw_invalid_argument("LatencyProfile: batch size " + std::to_string(batch_size) +
                                  " is outside the measured range " +
                                  std::to_string(points_.front().batch_size) + ".." +
                                  std::to_string(points_.back().batch_size));
    auto hi = std::lower_bound(points_.begin(), points_.end(), batch_size,
                               [](const ProfilePoint& p, int b) { return p.batch_size < b; });
    if (hi->batch_size == batch_size) return hi->model_ms;
    auto lo = hi - 1;
    double f = static_cast<double>(batch_size - lo->batch_size) /
               static_cast<double>(hi->batch_size - lo->batch_size);
    return lo->model_ms + f * (hi->model_ms - lo->model_ms);
  }

  // The linear model's parameters (0 for a measured table). Thread-safe.
  [[nodiscard]] double base_ms() const noexcept { return base_ms_; }
  [[nodiscard]] double per_item_ms() const noexcept { return per_item_ms_; }

 private:
  LatencyProfile() = default;

  static std::string_view trim(std::string_view s) noexcept {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
  }
  // The separators between fields: ',', ';' and white space (and, with colon, ':').
  static bool is_separator(char c, bool colon) noexcept {
    return c == ',' || c == ';' || c == ' ' || c == '\t' || c == '\r' || (colon && c == ':');
  }
  // The non-empty fields of a line between separators.
  static std::vector<std::string_view> split(std::string_view line, bool colon) {
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && is_separator(line[i], colon)) ++i;
      std::size_t j = i;
      while (j < line.size() && !is_separator(line[j], colon)) ++j;
      if (j > i) out.push_back(line.substr(i, j - i));
      i = j;
    }
    return out;
  }
  // The fields of a line split on every separator, ':' included.
  static std::vector<std::string_view> split_numbers(std::string_view line) {
    return split(line, true);
  }
  // "1:20,8:41 16:65" -> {"1:20", "8:41", "16:65"}
  static std::vector<std::string_view> split_pairs(std::string_view line) {
    return split(line, false);
  }
  static bool parse_double(std::string_view s, double& out) noexcept {
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && ptr == s.data() + s.size();
  }
  static ProfilePoint read_pair(std::string_view pair, char joiner) {
    auto pos = pair.find(joiner);
    if (pos == std::string_view::npos)
      tailbatch::detail::throw_invalid_argument("LatencyProfile: cannot read \"" + std::string(pair) +
                                  "\": expected batch:ms, as in 8:41");
    return read_fields(pair.substr(0, pos), pair.substr(pos + 1), pair);
  }
  static ProfilePoint read_fields(std::string_view batch, std::string_view ms, std::string_view whole) {
    double b = 0, v = 0;
    if (!parse_double(trim(batch), b) || !parse_double(trim(ms), v) || b != std::floor(b) ||
        b < 1 || b > 1e6)
      tailbatch::detail::throw_invalid_argument("LatencyProfile: cannot read \"" + std::string(trim(whole)) +
                                  "\": expected a whole batch size and a latency in ms, as in 8:41");
    return ProfilePoint{static_cast<int>(b), v};
  }

  std::vector<ProfilePoint> points_;
  double base_ms_ = 0.0;
  double per_item_ms_ = 0.0;
};

// What the planner is asked. Every time is in milliseconds, every rate in requests per
// second. A plain aggregate; plan_capacity() validates it.
struct PlannerConfig {
  LatencyProfile profile = LatencyProfile::linear(1.0, 0.0);
  double network_ms = 0.0;   // per request, both ways: serialization, transport, tokenization
  double window_ms = 0.0;    // the batch window, counted only when the batch is larger than 1
  int streams = 1;           // lanes that run batches at once (GPU streams, workers)
  double tail = 1.2;         // p95 ≈ tail × per-request time; the latency field guide's 1.1–1.3 for queueing
  std::optional<double> slo_p95_ms;  // unset: no SLO, recommend the highest throughput
  std::optional<double> target_rps;  // unset: replicas are not computed
  double headroom = 0.3;     // spare capacity for spikes: 0.3 plans for 130 % of the target
  int max_batch = 64;        // the largest batch considered
  std::vector<int> preferred;  // if not empty, only these batch sizes are candidates
};

// The planner's figures for one batch size. The field names are the JSON contract of
// `tailbatch-plan --json` (candidates[] and recommended).
struct BatchPlan {
  int batch_size = 1;
  double model_ms = 0.0;     // the model's time for the batch
  double request_ms = 0.0;   // per-request time: model + network + window (batch > 1)
  double p95_ms = 0.0;       // tail × request_ms
  double stream_rps = 0.0;   // batch_size / request_ms
  double instance_rps = 0.0; // streams × stream_rps
  std::optional<std::int64_t> replicas;                // ceil(target / instance_rps); unset without a target
  std::optional<std::int64_t> replicas_with_headroom;  // ceil(target × (1 + headroom) / instance_rps)
  double concurrency = 0.0;  // Little's law: instance_rps × p95 (requests in flight per instance)
  std::int64_t max_in_flight = 1;  // suggested in-flight cap per instance (see suggested_max_in_flight)
  bool meets_slo = true;     // p95_ms <= slo (true when there is no SLO)
};

// The planner's answer: every candidate, the recommendation and the reason for it.
struct CapacityPlan {
  std::vector<BatchPlan> candidates;        // ascending batch size
  std::optional<std::size_t> recommended;   // index into candidates; unset if none meets the SLO
  std::size_t lowest_p95 = 0;               // index of the candidate with the lowest p95
  // With a target: the smallest batch size that meets the SLO and needs no more replicas
  // (with headroom) than the recommendation; unset when that is the recommendation itself.
  // Same cost, lower latency: often the better pick once replicas are rounded up.
  std::optional<std::size_t> same_replicas_lower_p95;
  std::string reason;                       // one or two sentences: why this batch size

  // The recommended candidate, or nullptr when no candidate meets the SLO. Thread-safe.
  [[nodiscard]] const BatchPlan* recommendation() const noexcept {
    return recommended ? &candidates[*recommended] : nullptr;
  }
};

// Replicas for a target load: ceil(target × (1 + headroom) / instance_rps), at least 1.
// A hair of tolerance keeps 2000 × 1.3 / 325 from becoming 9 through rounding error.
// Throws std::invalid_argument if instance_rps <= 0, target_rps < 0 or headroom < 0 (or
// any is not finite), and, naming all three, if the count is not finite or exceeds
// max_planned_count (a target of 1e12 rps on instances of 1e-300 rps is not a plan).
// Allocates only for the exception's message. Thread-safe.
[[nodiscard]] inline std::int64_t replicas_for(double target_rps, double instance_rps, double headroom = 0.0) {
  if (!(instance_rps > 0.0) || !std::isfinite(instance_rps))
    tailbatch::detail::throw_invalid_argument("replicas_for: instance_rps must be > 0");
  if (!(target_rps >= 0.0) || !std::isfinite(target_rps))
    tailbatch::detail::throw_invalid_argument("replicas_for: target_rps must be >= 0");
  if (!(headroom >= 0.0) || !std::isfinite(headroom))
    tailbatch::detail::throw_invalid_argument("replicas_for: headroom must be >= 0");
  const double need = target_rps * (1.0 + headroom) / instance_rps;
  const double r = std::max(1.0, std::ceil(need - 1e-9));
  if (!(r <= static_cast<double>(max_planned_count))) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "replicas_for: target_rps %g x (1 + headroom %g) / instance_rps %g needs %g replicas, "
                  "more than the planner counts (2^53 - 1): check target_rps, instance_rps and headroom",
                  target_rps, headroom, instance_rps, need);
    tailbatch::detail::throw_invalid_argument(buf);
  }
  return static_cast<std::int64_t>(r);
}

// Requests in flight by Little's law: throughput × latency. Never throws. Thread-safe.
[[nodiscard]] constexpr double littles_law_concurrency(double rps, double latency_ms) noexcept {
  return rps * latency_ms / 1000.0;
}

// The suggested cap on in-flight requests for one instance: 10 % above the Little's-law
// concurrency (bursts are not averages), rounded up to a number people remember — a whole
// number below 10, a multiple of 5 below 100, of 10 from 100 — and never below `floor`:
// pass batch_size × streams, because a cap under that starves the batcher (it could never
// fill a batch on every stream). The latency field guide's Example 3: 42 in flight → 46.2 → 50.
// Throws std::invalid_argument if concurrency is negative or not finite, or the cap would
// exceed max_planned_count. Allocates only for the exception's message. Thread-safe.
[[nodiscard]] inline std::int64_t suggested_max_in_flight(double concurrency, std::int64_t floor = 1) {
  if (!(concurrency >= 0.0) || !std::isfinite(concurrency))
    tailbatch::detail::throw_invalid_argument("suggested_max_in_flight: concurrency must be finite and >= 0");
  const double raw = std::max(1.0, 1.1 * concurrency);
  const double step = raw <= 10.0 ? 1.0 : raw <= 100.0 ? 5.0 : 10.0;
  const double rounded = std::ceil(raw / step - 1e-9) * step;
  if (!(rounded <= static_cast<double>(max_planned_count))) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "suggested_max_in_flight: %g requests in flight is more than the planner counts "
                  "(2^53 - 1): check the throughput and latency",
                  concurrency);
    tailbatch::detail::throw_invalid_argument(buf);
  }
  return std::max({static_cast<std::int64_t>(rounded), floor, std::int64_t{1}});
}

namespace tools::detail {
inline void check_planner_config(const PlannerConfig& c) {
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0.0; };
  if (!finite_nonneg(c.network_ms)) tailbatch::detail::throw_invalid_argument("PlannerConfig: network_ms must be >= 0");
  if (!finite_nonneg(c.window_ms)) tailbatch::detail::throw_invalid_argument("PlannerConfig: window_ms must be >= 0");
  if (c.streams < 1) tailbatch::detail::throw_invalid_argument("PlannerConfig: streams must be >= 1");
  if (!(std::isfinite(c.tail) && c.tail >= 1.0))
    tailbatch::detail::throw_invalid_argument("PlannerConfig: tail must be >= 1 (p95 is never below the per-request time)");
  if (c.slo_p95_ms && !(std::isfinite(*c.slo_p95_ms) && *c.slo_p95_ms > 0.0))
    tailbatch::detail::throw_invalid_argument("PlannerConfig: slo_p95_ms must be > 0");
  if (c.target_rps && !(std::isfinite(*c.target_rps) && *c.target_rps > 0.0))
    tailbatch::detail::throw_invalid_argument("PlannerConfig: target_rps must be > 0");
  if (!finite_nonneg(c.headroom)) tailbatch::detail::throw_invalid_argument("PlannerConfig: headroom must be >= 0");
  if (c.max_batch < 1) tailbatch::detail::throw_invalid_argument("PlannerConfig: max_batch must be >= 1");
  for (int b : c.preferred) {
    if (b < 1) tailbatch::detail::throw_invalid_argument("PlannerConfig: preferred batch sizes must be >= 1");
    if (b > c.max_batch)
      tailbatch::detail::throw_invalid_argument("PlannerConfig: preferred batch size " + std::to_string(b) +
                                  " exceeds max_batch " + std::to_string(c.max_batch));
    if (c.profile.is_measured() && (b < c.profile.min_batch() || b > c.profile.max_batch(c.max_batch)))
      tailbatch::detail::throw_invalid_argument("PlannerConfig: preferred batch size " + std::to_string(b) +
                                  " is outside the measured profile (" +
                                  std::to_string(c.profile.min_batch()) + ".." +
                                  std::to_string(c.profile.points().back().batch_size) + ")");
  }
  if (c.profile.is_measured() && c.profile.min_batch() > c.max_batch)
    tailbatch::detail::throw_invalid_argument("PlannerConfig: max_batch " + std::to_string(c.max_batch) +
                                " is below the smallest measured batch size");
}

inline std::string format_number(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}
}  // namespace tools::detail

// The planner's figures for one batch size under config (config is not validated here;
// plan_capacity() validates). Throws std::invalid_argument if the profile does not define
// batch_size. Thread-safe.
[[nodiscard]] inline BatchPlan plan_batch(const PlannerConfig& config, int batch_size) {
  BatchPlan p;
  p.batch_size = batch_size;
  p.model_ms = config.profile.model_ms(batch_size);
  p.request_ms = p.model_ms + config.network_ms + (batch_size > 1 ? config.window_ms : 0.0);
  p.p95_ms = config.tail * p.request_ms;
  p.stream_rps = static_cast<double>(batch_size) * 1000.0 / p.request_ms;
  p.instance_rps = static_cast<double>(config.streams) * p.stream_rps;
  if (config.target_rps) {
    p.replicas = replicas_for(*config.target_rps, p.instance_rps, 0.0);
    p.replicas_with_headroom = replicas_for(*config.target_rps, p.instance_rps, config.headroom);
  }
  p.concurrency = littles_law_concurrency(p.instance_rps, p.p95_ms);
  p.max_in_flight = suggested_max_in_flight(
      p.concurrency, static_cast<std::int64_t>(batch_size) * static_cast<std::int64_t>(config.streams));
  p.meets_slo = !config.slo_p95_ms || p.p95_ms <= *config.slo_p95_ms;
  return p;
}

namespace tools::detail {

// The candidate sizes for a linear profile: every size up to dense_candidate_limit, then
// each about 3 % above the last (b + b / 32), then max_batch itself. About 1500 sizes at
// most, whatever max_batch is.
inline std::vector<int> linear_candidate_sizes(int max_batch) {
  std::vector<int> sizes;
  for (int b = 1; b <= max_batch && b <= dense_candidate_limit; ++b) sizes.push_back(b);
  for (std::int64_t b = dense_candidate_limit + dense_candidate_limit / 32; b < max_batch; b += b / 32)
    sizes.push_back(static_cast<int>(b));
  if (sizes.back() != max_batch) sizes.push_back(max_batch);
  return sizes;
}

// The largest b in [lo, hi] for which holds(b) is true, given that it is true at lo and
// true-then-false over the range. O(log(hi − lo)) calls.
template <class Holds>
int last_true(int lo, int hi, Holds holds) {
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (holds(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Scans the candidates: the recommendation, the lowest p95, the first size over the SLO.
struct CandidateScan {
  std::optional<std::size_t> recommended;
  std::size_t lowest_p95 = 0;
  std::size_t over_slo = 0;
  std::optional<std::size_t> first_over;
  std::optional<std::size_t> same_replicas_lower_p95;
};

inline CandidateScan scan_candidates(const std::vector<BatchPlan>& cs, bool with_target) {
  CandidateScan s;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const auto& c = cs[i];
    if (c.p95_ms < cs[s.lowest_p95].p95_ms) s.lowest_p95 = i;
    if (!c.meets_slo) {
      ++s.over_slo;
      if (!s.first_over) s.first_over = i;
      continue;
    }
    if (!s.recommended || c.instance_rps > cs[*s.recommended].instance_rps) s.recommended = i;
  }
  if (with_target && s.recommended) {
    const auto& rec = cs[*s.recommended];
    for (std::size_t i = 0; i < *s.recommended; ++i) {
      if (cs[i].meets_slo && cs[i].replicas_with_headroom <= rec.replicas_with_headroom) {
        s.same_replicas_lower_p95 = i;
        break;
      }
    }
  }
  return s;
}

}  // namespace tools::detail

// Plans the candidate batch sizes and recommends one.
//
// Candidates: config.preferred if given; the measured sizes up to max_batch for a table;
// for the linear model, every size 1..max_batch up to dense_candidate_limit (1024), and
// above it a geometric grid (each size about 3 % above the last) plus max_batch and the
// sizes where the answer turns: the largest size whose p95 meets the SLO and the next one,
// and the smallest size that needs no more replicas than the recommendation. The linear
// model's p95 grows with the batch size and its throughput is monotonic above batch 1, so
// these few sizes give the same recommendation as trying every size would, in time and
// memory bounded whatever max_batch is (about 1500 candidates at most).
//
// The recommendation is the candidate with the highest instance throughput whose
// estimated p95 meets the SLO (the smaller batch on an exact tie); with no SLO, the
// highest throughput. If no candidate meets the SLO, `recommended` is unset and the
// reason names the candidate with the lowest p95. Allocates. Throws std::invalid_argument
// naming the bad field, or from replicas_for / suggested_max_in_flight when a count is
// beyond max_planned_count. Thread-safe.
[[nodiscard]] inline CapacityPlan plan_capacity(const PlannerConfig& config) {
  tools::detail::check_planner_config(config);
  std::vector<int> sizes;
  const bool enumerated = config.preferred.empty() && !config.profile.is_measured();
  if (!config.preferred.empty()) {
    sizes = config.preferred;
  } else if (config.profile.is_measured()) {
    for (const auto& pt : config.profile.points())
      if (pt.batch_size <= config.max_batch) sizes.push_back(pt.batch_size);
  } else {
    sizes = tools::detail::linear_candidate_sizes(config.max_batch);
    // Where the grid is sparse, add the last size whose p95 meets the SLO and the first
    // that does not: p95 never falls as the batch grows (above batch 1, which pays no
    // window), so a binary search finds them.
    if (config.slo_p95_ms && config.max_batch > dense_candidate_limit) {
      auto meets = [&](int b) { return config.tail * (config.profile.model_ms(b) + config.network_ms + config.window_ms) <=
                                       *config.slo_p95_ms; };
      if (meets(dense_candidate_limit)) {
        const int last = tools::detail::last_true(dense_candidate_limit, config.max_batch, meets);
        sizes.push_back(last);
        if (last < config.max_batch) sizes.push_back(last + 1);
      }
    }
  }
  auto normalise = [](std::vector<int>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  normalise(sizes);

  CapacityPlan plan;
  plan.candidates.reserve(sizes.size() + 1);
  for (int b : sizes) plan.candidates.push_back(plan_batch(config, b));
  tools::detail::CandidateScan scan = tools::detail::scan_candidates(plan.candidates, config.target_rps.has_value());

  // The smallest size needing no more replicas than the recommendation may lie between two
  // grid sizes: search that gap (replicas never rise with the batch size there, since the
  // throughput does not fall on the way to the recommendation) and plan it too.
  if (enumerated && scan.same_replicas_lower_p95 && *scan.same_replicas_lower_p95 > 0 &&
      plan.candidates[*scan.same_replicas_lower_p95].batch_size > dense_candidate_limit) {
    const auto target = plan.candidates[*scan.recommended].replicas_with_headroom;
    const int hi = plan.candidates[*scan.same_replicas_lower_p95].batch_size;
    const int lo = plan.candidates[*scan.same_replicas_lower_p95 - 1].batch_size;
    auto too_many = [&](int b) { return b == lo || plan_batch(config, b).replicas_with_headroom > target; };
    const int first = tools::detail::last_true(lo, hi, too_many) + 1;
    if (first < hi) {
      sizes.push_back(first);
      normalise(sizes);
      plan.candidates.clear();
      for (int b : sizes) plan.candidates.push_back(plan_batch(config, b));
      scan = tools::detail::scan_candidates(plan.candidates, true);
    }
  }
  plan.recommended = scan.recommended;
  plan.lowest_p95 = scan.lowest_p95;
  const std::size_t over_slo = scan.over_slo;
  const std::optional<std::size_t> first_over = scan.first_over;

  using tools::detail::format_number;
  const std::size_t n = plan.candidates.size();
  if (!plan.recommended) {
    const auto& best = plan.candidates[plan.lowest_p95];
    plan.reason = "no candidate meets the p95 SLO of " + format_number(*config.slo_p95_ms, 1) +
                  " ms: the lowest estimated p95 is " + format_number(best.p95_ms, 1) +
                  " ms, at batch " + std::to_string(best.batch_size) +
                  ". Shorten the window or the network path, use a faster model, or relax the SLO.";
    return plan;
  }
  const auto& rec = plan.candidates[*plan.recommended];
  std::string why = "batch " + std::to_string(rec.batch_size) + " has the highest instance throughput (" +
                    format_number(rec.instance_rps, 0) + " rps over " + std::to_string(config.streams) +
                    (config.streams == 1 ? " stream" : " streams") + ")";
  if (config.slo_p95_ms) {
    why += " of the " + std::to_string(n - over_slo) + " of " + std::to_string(n) +
           " candidates whose estimated p95 meets the " + format_number(*config.slo_p95_ms, 1) +
           " ms SLO (its p95 is " + format_number(rec.p95_ms, 1) + " ms)";
    if (first_over) {
      const auto& over = plan.candidates[*first_over];
      why += "; batch " + std::to_string(over.batch_size) + " would estimate " +
             format_number(over.p95_ms, 1) + " ms";
    }
  } else {
    why += "; no SLO was given, so p95 did not limit the choice";
  }
  why += ".";
  if (config.target_rps && rec.replicas && rec.replicas_with_headroom) {
    why += " " + std::to_string(*rec.replicas) + (*rec.replicas == 1 ? " replica serves " : " replicas serve ") +
           format_number(*config.target_rps, 0) + " rps; " + std::to_string(*rec.replicas_with_headroom) +
           " with " + format_number(config.headroom * 100.0, 0) + " % headroom.";
  }
  if (scan.same_replicas_lower_p95) {
    plan.same_replicas_lower_p95 = scan.same_replicas_lower_p95;
    const auto& c = plan.candidates[*scan.same_replicas_lower_p95];
    why += " Batch " + std::to_string(c.batch_size) + " needs the same " +
           std::to_string(*c.replicas_with_headroom) + " replicas with headroom at a p95 of " +
           format_number(c.p95_ms, 1) + " ms: the same cost for lower latency.";
  }
  plan.reason = std::move(why);
  return plan;
}

// A measured instance, for the planner's second mode (the latency field guide's Example 3).
struct InstanceMeasurement {
  double instance_rps = 0.0;  // what one instance sustains within its SLO
  double p95_ms = 0.0;        // its p95 at that load
  double target_rps = 0.0;    // the load to serve
  double headroom = 0.3;
  int batch_size = 1;         // the batch size it runs at (floors the in-flight cap)
  int streams = 1;            // lanes per instance (floors the in-flight cap)
};

// The second mode's answer. Field names follow BatchPlan's (the JSON contract).
struct InstancePlan {
  int batch_size = 1;
  double p95_ms = 0.0;
  double instance_rps = 0.0;
  std::int64_t replicas = 1;                // ceil(target / instance_rps)
  std::int64_t replicas_with_headroom = 1;  // ceil(target × (1 + headroom) / instance_rps)
  double concurrency = 0.0;                 // instance_rps × p95: requests in flight per instance
  std::int64_t max_in_flight = 1;           // suggested_max_in_flight(concurrency, batch_size × streams)
  std::string reason;
};

// Replicas and in-flight cap from one measured instance. Allocates (the reason). Throws
// std::invalid_argument naming the bad field. Thread-safe.
[[nodiscard]] inline InstancePlan plan_from_instance(const InstanceMeasurement& m) {
  if (!(std::isfinite(m.instance_rps) && m.instance_rps > 0.0))
    tailbatch::detail::throw_invalid_argument("InstanceMeasurement: instance_rps must be > 0");
  if (!(std::isfinite(m.p95_ms) && m.p95_ms > 0.0))
    tailbatch::detail::throw_invalid_argument("InstanceMeasurement: p95_ms must be > 0");
  if (!(std::isfinite(m.target_rps) && m.target_rps > 0.0))
    tailbatch::detail::throw_invalid_argument("InstanceMeasurement: target_rps must be > 0");
  if (!(std::isfinite(m.headroom) && m.headroom >= 0.0))
    tailbatch::detail::throw_invalid_argument("InstanceMeasurement: headroom must be >= 0");
  if (m.batch_size < 1) tailbatch::detail::throw_invalid_argument("InstanceMeasurement: batch_size must be >= 1");
  if (m.streams < 1) tailbatch::detail::throw_invalid_argument("InstanceMeasurement: streams must be >= 1");
  InstancePlan p;
  p.batch_size = m.batch_size;
  p.p95_ms = m.p95_ms;
  p.instance_rps = m.instance_rps;
  p.replicas = replicas_for(m.target_rps, m.instance_rps, 0.0);
  p.replicas_with_headroom = replicas_for(m.target_rps, m.instance_rps, m.headroom);
  p.concurrency = littles_law_concurrency(m.instance_rps, m.p95_ms);
  p.max_in_flight = suggested_max_in_flight(
      p.concurrency, static_cast<std::int64_t>(m.batch_size) * static_cast<std::int64_t>(m.streams));
  using tools::detail::format_number;
  p.reason = std::to_string(p.replicas) + " x " + format_number(m.instance_rps, 0) + " rps covers " +
             format_number(m.target_rps, 0) + " rps; " + std::to_string(p.replicas_with_headroom) +
             " replicas keep " + format_number(m.headroom * 100.0, 0) +
             " % headroom. Each instance holds about " + format_number(p.concurrency, 0) +
             " requests in flight (" + format_number(m.instance_rps, 0) + " rps x " +
             format_number(m.p95_ms / 1000.0, 3) + " s); cap it at " + std::to_string(p.max_in_flight) +
             " and scale out when the queue keeps growing.";
  return p;
}

// ---- streaming: what a client of a generative model perceives -----------------------

// How a generative model produces an answer: the latency field guide's Example 2 terms.
struct GenerationProfile {
  double prefill_ms = 0.0;      // prompt processing before decoding starts
  double first_token_ms = 0.0;  // from the end of prefill until the first token is ready
  double tokens_per_s = 0.0;    // the decode rate after the first token, per sequence
};

// The two latencies a client perceives for one answer.
struct StreamingLatency {
  double time_to_first_token_ms = 0.0;  // prefill + first token: when a streaming client sees content
  double inter_token_ms = 0.0;          // 1000 / tokens_per_s
  double total_ms = 0.0;                // time to first token + (tokens − 1) × inter-token time:
                                        // when a client that waits for the whole answer sees it
  double streaming_speedup = 1.0;       // total / time to first token
};

// The latency field guide's Example 2 arithmetic: an answer of `tokens` tokens, the first
// after prefill + first_token, the rest at tokens_per_s. 120 ms + 80 ms, 50 tokens/s, 100
// tokens: the first token at 200 ms, the whole answer at 200 + 99 × 20 = 2180 ms, 10.9x
// later. Throws std::invalid_argument naming the field if a time is negative or not
// finite, tokens_per_s <= 0 or not finite, tokens < 1, or the time to first token is 0.
// Allocates only for the exception's message. Thread-safe.
[[nodiscard]] inline StreamingLatency streaming_latency(const GenerationProfile& g, std::int64_t tokens) {
  if (!(std::isfinite(g.prefill_ms) && g.prefill_ms >= 0.0))
    tailbatch::detail::throw_invalid_argument("GenerationProfile: prefill_ms must be >= 0");
  if (!(std::isfinite(g.first_token_ms) && g.first_token_ms >= 0.0))
    tailbatch::detail::throw_invalid_argument("GenerationProfile: first_token_ms must be >= 0");
  if (!(g.prefill_ms + g.first_token_ms > 0.0))
    tailbatch::detail::throw_invalid_argument("GenerationProfile: prefill_ms + first_token_ms must be > 0");
  if (!(std::isfinite(g.tokens_per_s) && g.tokens_per_s > 0.0))
    tailbatch::detail::throw_invalid_argument("GenerationProfile: tokens_per_s must be > 0");
  if (tokens < 1) tailbatch::detail::throw_invalid_argument("streaming_latency: tokens must be >= 1");
  StreamingLatency l;
  l.time_to_first_token_ms = g.prefill_ms + g.first_token_ms;
  l.inter_token_ms = 1000.0 / g.tokens_per_s;
  l.total_ms = l.time_to_first_token_ms + static_cast<double>(tokens - 1) * l.inter_token_ms;
  l.streaming_speedup = l.total_ms / l.time_to_first_token_ms;
  return l;
}

}  // namespace tailbatch
