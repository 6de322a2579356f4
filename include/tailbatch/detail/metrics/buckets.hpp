// The buckets a latency histogram is exported with (Prometheus `le` bounds), chosen from
// the histogram's own log-linear layout so that each exported bucket is a union of its
// buckets and every count is exact. Machinery behind tailbatch/metrics.hpp.
//
// A bound is kept only where the histogram can count below it exactly: above its lowest
// value (every underflow is recorded as `lowest`) and at most the start of its last
// bucket (which also holds every overflow). A bound from a configured list that is not a
// boundary of the layout is counted at the nearest one (at most 1/(2M) of it away).
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <tailbatch/detail/histogram/layout.hpp>
#include <tailbatch/detail/math.hpp>
#include <tailbatch/detail/metrics/text.hpp>
#include <vector>

namespace tailbatch::detail {

// One histogram layout's export: parallel arrays, ascending; `+Inf` is implied.
struct ExportBuckets {
  std::vector<double> le_seconds;                  // the upper bounds as exported
  std::vector<std::string> le_text;                // ... as written in the `le` label
  std::vector<std::chrono::nanoseconds> count_at;  // the layout boundary each is counted at
  double max_relative_error = 0.0;
};

// A bound asked for: as exported (seconds) and as the nanoseconds it stands for.
struct WantedBound {
  double seconds = 0.0;
  std::uint64_t ns = 0;
  friend bool operator<(const WantedBound& a, const WantedBound& b) noexcept {
    return a.seconds < b.seconds;
  }
};

// 2^e * (1 + j/k) ns for every e, j with that value in [lowest, highest] (k a power of two).
[[nodiscard]] inline std::vector<std::uint64_t> coarsened_bounds(int per_octave,
                                                                 std::uint64_t lowest,
                                                                 std::uint64_t highest) {
  std::vector<std::uint64_t> out;
  const auto k = static_cast<std::uint64_t>(per_octave);
  const int shift = std::countr_zero(k);
  for (int e = shift; e < 63; ++e) {
    const std::uint64_t octave = std::uint64_t{1} << e;
    if (octave > highest) break;
    for (std::uint64_t j = 0; j < k; ++j) {
      const std::uint64_t b = octave + (j << (e - shift));
      if (b >= lowest && b <= highest) out.push_back(b);
    }
  }
  return out;
}

// The bounds `wanted` (seconds, with the nanoseconds each stands for) as a layout exports
// them. `wanted` may be in any order and hold duplicates.
[[nodiscard]] inline ExportBuckets export_buckets(std::vector<WantedBound> wanted,
                                                  const HistogramLayout& layout) {
  std::stable_sort(wanted.begin(), wanted.end());
  ExportBuckets out;
  std::uint64_t low = 0;  // the lower end of the bucket being closed: asked for or counted at
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    const WantedBound& w = wanted[i];
    if (!out.le_seconds.empty() && w.seconds == out.le_seconds.back()) continue;
    const std::size_t s = layout.nearest_boundary(w.ns);
    if (w.ns <= layout.lowest() || s < 1 || s >= layout.size()) continue;
    const std::uint64_t at = layout.boundary(s);
    // A quantile that falls into this bucket is interpolated between the bounds asked for,
    // while the true value lies between the boundaries counted at: its error is at most
    // the span of both over the lower end of both (exact integers: 1/k exactly).
    const std::uint64_t high = std::max(w.ns, at);
    if (!out.le_seconds.empty()) {
      out.max_relative_error = std::max(out.max_relative_error,
                                        static_cast<double>(high - low) / static_cast<double>(low));
    }
    low = std::min(w.ns, at);
    out.le_seconds.push_back(w.seconds);
    std::string text;
    append_finite_double(text, w.seconds);
    out.le_text.push_back(std::move(text));
    out.count_at.push_back(
        std::chrono::nanoseconds(static_cast<std::chrono::nanoseconds::rep>(at)));
  }
  return out;
}

// Seconds to whole nanoseconds, rounded (the caller has checked 0 < s <= 2^62 ns).
[[nodiscard]] inline std::uint64_t seconds_to_ns(double s) noexcept {
  return static_cast<std::uint64_t>(detail::llround(s * 1e9));
}

}  // namespace tailbatch::detail
