// Arrival stamps from the processor's cycle counter, for the Pipeline's submit path.
//
// Reading the steady clock costs 20-50 ns on common virtual machines (kvm-clock, Hyper-V)
// and is the largest single cost of queueing a request; the counter it is built on costs
// a third of that. A submitter may stamp its request with the raw counter; the batch
// leader, which reads the steady clock anyway, converts the stamp into the clock's time
// when it takes the request, from a reading of both taken after it and a rate it
// calibrates itself. Only where the counter ticks at a constant rate on every core
// (x86's invariant TSC; AArch64's virtual counter) and only once calibrated; otherwise
// submitters read the clock. No state outside the object that uses it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include <tailbatch/submit_options.hpp>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>  // __get_cpuid; the counter itself is a builtin (<x86intrin.h> is 48k lines)
#define TAILBATCH_CYCLE_COUNTER 1
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define TAILBATCH_CYCLE_COUNTER 1
#else
#define TAILBATCH_CYCLE_COUNTER 0
#endif

namespace tailbatch::detail {

inline constexpr bool has_cycle_counter = TAILBATCH_CYCLE_COUNTER == 1;

// The counter; 0 where there is none.
inline std::uint64_t read_cycle_counter() noexcept {
#if TAILBATCH_CYCLE_COUNTER && (defined(__x86_64__) || defined(__i386__))
  return __builtin_ia32_rdtsc();
#elif TAILBATCH_CYCLE_COUNTER
  std::uint64_t v = 0;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return 0;
#endif
}

// Whether the counter ticks at one constant rate, in every power state and on every core.
inline bool cycle_counter_is_constant() noexcept {
#if TAILBATCH_CYCLE_COUNTER && (defined(__x86_64__) || defined(__i386__))
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000U, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007U) return false;
  if (__get_cpuid(0x80000007U, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1U << 8)) != 0;  // invariant TSC
#elif TAILBATCH_CYCLE_COUNTER
  return true;  // the architecture requires it of the generic timer
#else
  return false;
#endif
}

// A stamp that holds either a clock time or a raw counter value, in one BatchTime: the
// counter's values are kept as negative times, which the steady clock (counting from
// boot) never reads.
inline constexpr std::uint64_t max_stamp_cycles = std::uint64_t{1} << 62;
inline BatchTime cycles_as_stamp(std::uint64_t cycles) noexcept {
  return BatchTime(BatchDuration(-1 - static_cast<BatchDuration::rep>(cycles)));
}
inline bool stamp_is_cycles(BatchTime stamp) noexcept { return stamp.time_since_epoch().count() < 0; }
inline std::uint64_t stamp_cycles(BatchTime stamp) noexcept {
  return static_cast<std::uint64_t>(-1 - stamp.time_since_epoch().count());
}

// The counter's rate against a clock, from readings of both that one thread takes as it
// goes. Usable once the readings span min_span; refined every refine_every after that;
// given up for good when the counter runs backwards, at an implausible rate, or when
// the rate moves by more than max_drift (the counter is then not what it claims).
class CycleCalibration {
 public:
  static constexpr BatchDuration min_span = std::chrono::milliseconds(20);
  static constexpr BatchDuration refine_every = std::chrono::seconds(1);
  static constexpr double max_drift = 0.005;

  // The first reading of both. `spread`: how far the counter moved across the clock read
  // (see read_clock_and_cycles); the smallest seen sets what counts as simultaneous.
  void start(BatchTime t, std::uint64_t cycles, std::uint64_t spread = 0) noexcept {
    t0_ = t;
    c0_ = cycles;
    min_spread_ = spread;
    started_ = true;
  }

  // The spread below which a reading counts as simultaneous.
  [[nodiscard]] std::uint64_t good_spread() const noexcept { return 4 * min_spread_ + 64; }

  // Takes a reading of both. A reading that was not simultaneous (spread above
  // good_spread(): the thread was interrupted between them) changes nothing. Returns
  // whether stamps may be converted.
  bool update(BatchTime t, std::uint64_t cycles, std::uint64_t spread = 0) noexcept {
    if (failed_ || !started_) return false;
    if (spread > good_spread()) return usable();
    min_spread_ = std::min(min_spread_, spread);
    if (cycles <= c0_ || t <= t0_) {
      if (cycles < c0_ || t < t0_) failed_ = true;
      return usable();
    }
    const BatchDuration span = t - t0_;
    if (span < min_span) return usable();
    if (usable_ && t - checked_ < refine_every) return true;
    const double rate = static_cast<double>(span.count()) / static_cast<double>(cycles - c0_);
    if (!(rate > 0.01 && rate < 100.0)) {  // ns per tick: 10 MHz to 100 GHz
      failed_ = true;
      return false;
    }
    if (usable_ && (rate > ns_per_cycle_ * (1 + max_drift) || rate < ns_per_cycle_ * (1 - max_drift))) {
      failed_ = true;
      return false;
    }
    ns_per_cycle_ = rate;
    usable_ = true;
    checked_ = t;
    return true;
  }

  [[nodiscard]] bool usable() const noexcept { return usable_ && !failed_; }
  [[nodiscard]] bool failed() const noexcept { return failed_; }
  [[nodiscard]] double ns_per_cycle() const noexcept { return ns_per_cycle_; }

  // The clock's time when the counter read `stamp`, given a reading (t, cycles) of both
  // taken after it. A stamp ahead of the reading (another core's counter slightly
  // ahead) reads as t. Meaningful once usable() has been true (the last rate is kept
  // after a failure, for the stamps already taken).
  [[nodiscard]] BatchTime to_time(std::uint64_t stamp, BatchTime t, std::uint64_t cycles) const noexcept {
    if (stamp >= cycles) return t;
    const double ago = static_cast<double>(cycles - stamp) * ns_per_cycle_;
    const auto since = static_cast<double>(t.time_since_epoch().count());
    if (!(ago < since)) return BatchTime{};
    return t - BatchDuration(static_cast<BatchDuration::rep>(ago));
  }

 private:
  BatchTime t0_{};
  std::uint64_t c0_ = 0;
  BatchTime checked_{};
  std::uint64_t min_spread_ = 0;
  double ns_per_cycle_ = 0.0;
  bool started_ = false;
  bool usable_ = false;
  bool failed_ = false;
};

// A reading of a clock and of the counter at the same moment, as nearly as can be: the
// counter is read before and after the clock and the midpoint kept; `spread` is how far
// it moved in between. Up to three tries, until the spread is at most `good_spread`; the
// tightest is kept.
struct ClockAndCycles {
  BatchTime time{};
  std::uint64_t cycles = 0;
  std::uint64_t spread = 0;
};

template <class Clock>
ClockAndCycles read_clock_and_cycles(const Clock& clock, std::uint64_t good_spread) noexcept {
  ClockAndCycles best{};
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t before = read_cycle_counter();
    const BatchTime t = clock.now();
    const std::uint64_t after = read_cycle_counter();
    const std::uint64_t spread = after >= before ? after - before : 0;
    if (i == 0 || spread < best.spread) best = ClockAndCycles{t, before + spread / 2, spread};
    if (spread <= good_spread) break;
  }
  return best;
}

}  // namespace tailbatch::detail
