// Load profiles: when requests arrive, for the load generator and the simulator alike.
//
// A LoadProfile is an arrival process (Poisson or evenly spaced) and a rate that changes in
// steps over time: one phase for a steady test, several for a step or a spike. An
// ArrivalSchedule turns a profile and a seed into the intended send times, one by one, so
// the load generator and the discrete-event simulator see exactly the same arrivals for the
// same seed.
//
// Poisson arrivals across a rate change restart at the phase boundary with the new rate:
// by memorylessness that is exactly a Poisson process with a piecewise-constant rate.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <tailbatch/detail/throw.hpp>

namespace tailbatch {

// How arrivals are spaced within a phase.
enum class ArrivalProcess : std::uint8_t {
  poisson,   // exponential gaps: independent users, the realistic default
  constant,  // evenly spaced: a metronome, for reproducible step responses
};

// A short, stable, lower-case name ("poisson"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(ArrivalProcess p) noexcept {
  return p == ArrivalProcess::poisson ? "poisson" : "constant";
}

// One phase: a rate (requests per second, 0 for a pause) held for a duration.
struct LoadPhase {
  std::chrono::nanoseconds duration{0};
  double rps = 0.0;
};

// An arrival process and its rate over time. A value type; immutable after construction,
// so thread-safe to share. Factories throw std::invalid_argument naming the field.
class LoadProfile {
 public:
  // One phase at a steady rate. Allocates.
  [[nodiscard]] static LoadProfile steady(ArrivalProcess process, double rps, std::chrono::nanoseconds duration) {
    return LoadProfile(process, {LoadPhase{duration, rps}});
  }
  [[nodiscard]] static LoadProfile poisson(double rps, std::chrono::nanoseconds duration) {
    return steady(ArrivalProcess::poisson, rps, duration);
  }
  [[nodiscard]] static LoadProfile constant(double rps, std::chrono::nanoseconds duration) {
    return steady(ArrivalProcess::constant, rps, duration);
  }
  // Phases played one after another: a step profile (100 rps for 10 s, then 300 for 10 s).
  // Allocates.
  [[nodiscard]] static LoadProfile steps(ArrivalProcess process, std::vector<LoadPhase> phases) {
    return LoadProfile(process, std::move(phases));
  }
  // A spike: base_rps for `before`, spike_rps for `spike`, base_rps for `after`. Allocates.
  [[nodiscard]] static LoadProfile spike(ArrivalProcess process, double base_rps, double spike_rps,
                                         std::chrono::nanoseconds before, std::chrono::nanoseconds spike,
                                         std::chrono::nanoseconds after) {
    return LoadProfile(process, {LoadPhase{before, base_rps}, LoadPhase{spike, spike_rps}, LoadPhase{after, base_rps}});
  }

  [[nodiscard]] ArrivalProcess process() const noexcept { return process_; }
  [[nodiscard]] const std::vector<LoadPhase>& phases() const noexcept { return phases_; }

  // The profile's total length. Never throws. Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds duration() const noexcept {
    std::chrono::nanoseconds d{0};
    for (const auto& p : phases_) d += p.duration;
    return d;
  }
  // The rate in force at `offset` from the start (0 past the end). Thread-safe.
  [[nodiscard]] double rate_at(std::chrono::nanoseconds offset) const noexcept {
    std::chrono::nanoseconds end{0};
    for (const auto& p : phases_) {
      end += p.duration;
      if (offset < end) return p.rps;
    }
    return 0.0;
  }
  // The expected number of arrivals in [from, to). Thread-safe.
  [[nodiscard]] double expected_arrivals(std::chrono::nanoseconds from, std::chrono::nanoseconds to) const noexcept {
    double n = 0.0;
    std::chrono::nanoseconds begin{0};
    for (const auto& p : phases_) {
      const auto end = begin + p.duration;
      const auto lo = std::max(begin, from), hi = std::min(end, to);
      if (hi > lo) n += p.rps * std::chrono::duration<double>(hi - lo).count();
      begin = end;
    }
    return n;
  }
  // The highest rate of any phase. Thread-safe.
  [[nodiscard]] double peak_rps() const noexcept {
    double m = 0.0;
    for (const auto& p : phases_) m = std::max(m, p.rps);
    return m;
  }

 private:
  LoadProfile(ArrivalProcess process, std::vector<LoadPhase> phases) : process_(process), phases_(std::move(phases)) {
    if (process != ArrivalProcess::poisson && process != ArrivalProcess::constant)
      tailbatch::detail::throw_invalid_argument("LoadProfile: process must be poisson or constant");
    if (phases_.empty()) tailbatch::detail::throw_invalid_argument("LoadProfile: phases must not be empty");
    for (std::size_t i = 0; i < phases_.size(); ++i) {
      const auto& p = phases_[i];
      if (p.duration <= std::chrono::nanoseconds::zero())
        tailbatch::detail::throw_invalid_argument("LoadProfile: phase " + std::to_string(i) + " duration must be > 0");
      if (!(std::isfinite(p.rps) && p.rps >= 0.0 && p.rps <= 1e9))
        tailbatch::detail::throw_invalid_argument("LoadProfile: phase " + std::to_string(i) + " rps must be in [0, 1e9]");
    }
  }

  ArrivalProcess process_;
  std::vector<LoadPhase> phases_;
};

// The intended arrival times of a profile, as offsets from its start, in order. Seeded:
// the same profile and seed give the same times (with the same standard library).
// Not thread-safe: one consumer. Never allocates after construction.
class ArrivalSchedule {
 public:
  ArrivalSchedule(LoadProfile profile, std::uint64_t seed) : profile_(std::move(profile)), rng_(seed) {
    enter_phase(0, std::chrono::nanoseconds{0});
  }

  // The next intended arrival, or nullopt once the profile has ended. Never blocks.
  // Not thread-safe.
  [[nodiscard]] std::optional<std::chrono::nanoseconds> next() noexcept {
    const auto& phases = profile_.phases();
    while (phase_ < phases.size()) {
      const double rps = phases[phase_].rps;
      if (rps > 0.0) {
        std::chrono::nanoseconds t;
        if (profile_.process() == ArrivalProcess::constant) {
          // Exact multiples of the gap from the phase start: no drift from rounding.
          t = phase_start_ + std::chrono::nanoseconds(static_cast<std::int64_t>(
                                 std::llround(static_cast<double>(k_) * 1e9 / rps)));
          ++k_;
        } else {
          std::exponential_distribution<double> gap(rps);
          cursor_s_ += gap(rng_);
          t = phase_start_ + std::chrono::nanoseconds(static_cast<std::int64_t>(cursor_s_ * 1e9));
        }
        if (t < phase_end_) return t;
      }
      enter_phase(phase_ + 1, phase_end_);
    }
    return std::nullopt;
  }

  [[nodiscard]] const LoadProfile& profile() const noexcept { return profile_; }

 private:
  void enter_phase(std::size_t i, std::chrono::nanoseconds start) noexcept {
    phase_ = i;
    phase_start_ = start;
    phase_end_ = i < profile_.phases().size() ? start + profile_.phases()[i].duration : start;
    k_ = 0;
    cursor_s_ = 0.0;
  }

  LoadProfile profile_;
  std::mt19937_64 rng_;
  std::size_t phase_ = 0;
  std::chrono::nanoseconds phase_start_{0}, phase_end_{0};
  std::uint64_t k_ = 0;
  double cursor_s_ = 0.0;
};

}  // namespace tailbatch
