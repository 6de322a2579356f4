// Arrival stamps from the cycle counter: the calibration on made-up readings (exact), and
// the machine's own counter against its steady clock (skipped, with the reason, where the
// counter is not constant-rate).
#include <tailbatch/detail/pipeline/cycle_stamp.hpp>

#include <tailbatch/clock.hpp>

#include <chrono>
#include <thread>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;
using detail::CycleCalibration;

namespace {
const BatchTime t0 = BatchTime(1h);
}  // namespace

TEST_CASE("CycleCalibration: usable once the readings span 20 ms; converts stamps back") {
  CycleCalibration cal;
  CHECK_FALSE(cal.update(t0, 1000));  // not started
  cal.start(t0, 1000);
  CHECK_FALSE(cal.update(t0 + 10ms, 1000 + 20'000'000));  // 2 ticks per ns, too soon
  CHECK_FALSE(cal.usable());
  CHECK(cal.update(t0 + 20ms, 1000 + 40'000'000));
  CHECK(cal.ns_per_cycle() == Approx(0.5));
  const BatchTime now = t0 + 20ms;
  const std::uint64_t cycles = 1000 + 40'000'000;
  CHECK(cal.to_time(cycles - 2'000'000, now, cycles) == now - 1ms);
  CHECK(cal.to_time(cycles, now, cycles) == now);
  CHECK(cal.to_time(cycles + 5, now, cycles) == now);  // another core slightly ahead
  // Within a second of the last check the rate is kept as it is.
  CHECK(cal.update(t0 + 500ms, 1000 + 900'000'000));
  CHECK(cal.ns_per_cycle() == Approx(0.5));
  // A second later it is refined from the whole span.
  CHECK(cal.update(t0 + 1020ms, 1000 + 2'040'100'000));
  CHECK(cal.ns_per_cycle() == Approx(1020e6 / 2'040'100'000.0));
}

TEST_CASE("CycleCalibration: gives up for good on a counter that runs backwards or drifts") {
  SECTION("backwards") {
    CycleCalibration cal;
    cal.start(t0, 1'000'000);
    CHECK_FALSE(cal.update(t0 + 30ms, 999'999));
    CHECK(cal.failed());
    CHECK_FALSE(cal.update(t0 + 60ms, 1'000'000 + 120'000'000));
  }
  SECTION("drift") {
    CycleCalibration cal;
    cal.start(t0, 0 + 1);
    REQUIRE(cal.update(t0 + 20ms, 1 + 40'000'000));  // 0.5 ns per tick
    CHECK_FALSE(cal.update(t0 + 1100ms, 1 + 1'800'000'000));  // 0.61: not one rate
    CHECK(cal.failed());
    CHECK_FALSE(cal.usable());
  }
  SECTION("an implausible rate") {
    CycleCalibration cal;
    cal.start(t0, 1);
    CHECK_FALSE(cal.update(t0 + 20ms, 2));  // 20 ms per tick
    CHECK(cal.failed());
  }
}

TEST_CASE("CycleCalibration: a reading taken across an interruption changes nothing") {
  CycleCalibration cal;
  cal.start(t0, 1000, 100);  // the clock read took 100 ticks
  CHECK(cal.good_spread() == 4 * 100 + 64);
  // Interrupted between the two reads: ignored, even though it spans 20 ms.
  CHECK_FALSE(cal.update(t0 + 20ms, 1000 + 40'000'000, 100'000));
  CHECK_FALSE(cal.usable());
  CHECK_FALSE(cal.failed());
  CHECK(cal.update(t0 + 21ms, 1000 + 42'000'000, 80));
  CHECK(cal.ns_per_cycle() == Approx(0.5));
  CHECK(cal.good_spread() == 4 * 80 + 64);  // the tightest reading sets the allowance
}

TEST_CASE("Cycle stamps: a stamp holds a counter value or a time, never confused") {
  const BatchTime s = detail::cycles_as_stamp(123456789);
  CHECK(detail::stamp_is_cycles(s));
  CHECK(detail::stamp_cycles(s) == 123456789);
  CHECK(detail::stamp_is_cycles(detail::cycles_as_stamp(0)));
  CHECK(detail::stamp_cycles(detail::cycles_as_stamp(detail::max_stamp_cycles - 1)) == detail::max_stamp_cycles - 1);
  CHECK_FALSE(detail::stamp_is_cycles(SteadyClock{}.now()));
  CHECK_FALSE(detail::stamp_is_cycles(BatchTime{}));
}

TEST_CASE("Cycle stamps: this machine's counter agrees with its steady clock") {
  if (!detail::has_cycle_counter || !detail::cycle_counter_is_constant()) {
    WARN("skipped: no constant-rate cycle counter here; the Pipeline reads the clock for every arrival");
    return;
  }
  SteadyClock clock;
  CycleCalibration cal;
  const detail::ClockAndCycles a = detail::read_clock_and_cycles(clock, 0);
  cal.start(a.time, a.cycles, a.spread);
  std::this_thread::sleep_for(30ms);
  detail::ClockAndCycles b{};
  for (int i = 0; i < 100 && !cal.usable(); ++i) {  // until a reading is simultaneous enough
    b = detail::read_clock_and_cycles(clock, cal.good_spread());
    cal.update(b.time, b.cycles, b.spread);
  }
  REQUIRE(cal.usable());
  // A stamp taken now, converted 5 ms later, lands within 100 us of the clock's reading.
  const detail::ClockAndCycles r1 = detail::read_clock_and_cycles(clock, cal.good_spread());
  std::this_thread::sleep_for(5ms);
  const detail::ClockAndCycles r2 = detail::read_clock_and_cycles(clock, cal.good_spread());
  const auto error = cal.to_time(r1.cycles, r2.time, r2.cycles) - r1.time;
  const double error_us = static_cast<double>(error.count()) / 1000.0;
  INFO("conversion error " << error_us << " us");
  CHECK(std::chrono::abs(error) < 100us);
}
