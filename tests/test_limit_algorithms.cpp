// The limit algorithms on their own, fed hand-built sample windows: no threads, no clock.
// Scenarios ported (in our own words) from Netflix concurrency-limits' AIMDLimitTest and its
// Gradient2Limit behaviour, and from Envoy's adaptive concurrency gradient controller tests.
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <tailbatch/limit_algorithms.hpp>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::AimdLimitConfig;
using tailbatch::AimdLimit;
using tailbatch::GradientLimitConfig;
using tailbatch::GradientLimit;
using tailbatch::LimitWindow;
using tailbatch::StaticLimit;
using time_point = LimitWindow::time_point;

namespace {

const time_point t0 = time_point(std::chrono::hours(1));

// A window of n equal samples, admitted at in_flight, `drops` of them dropped, ending at `end`.
LimitWindow window(std::chrono::nanoseconds rtt, std::uint32_t n, std::uint32_t in_flight,
                   std::uint32_t drops = 0, time_point end = t0, std::uint32_t limit = 0) {
  LimitWindow w(end - 100ms, end, limit);
  for (std::uint32_t i = 0; i < n; ++i) w.add(rtt, in_flight, i < drops);
  return w;
}

template <class F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// Brings a gradient limit past its first probe with a min RTT of `min_rtt`, at time `at`.
void finish_first_probe(GradientLimit& g, std::chrono::nanoseconds min_rtt, time_point at = t0) {
  REQUIRE(g.probing());
  g.on_window(window(min_rtt, g.config().probe_samples, 1, 0, at));
  REQUIRE_FALSE(g.probing());
}

}  // namespace

TEST_CASE("LimitWindow summarises its samples", "[limit_algorithms]") {
  LimitWindow empty;
  CHECK(empty.count() == 0);
  CHECK(empty.min_rtt() == 0ns);
  CHECK(empty.mean_rtt() == 0ns);
  CHECK(empty.percentile(99) == 0ns);

  auto same = window(7ms, 10, 3, 2);
  CHECK(same.count() == 10);
  CHECK(same.drops() == 2);
  CHECK(same.max_in_flight() == 3);
  CHECK(same.min_rtt() == 7ms);
  CHECK(same.max_rtt() == 7ms);
  CHECK(same.mean_rtt() == 7ms);
  CHECK(same.percentile(50) == 7ms);  // equal samples: exact
  CHECK(same.percentile(99.9) == 7ms);

  LimitWindow spread(t0, t0 + 1s, 5);
  for (int ms = 1; ms <= 100; ++ms) spread.add(std::chrono::milliseconds(ms), ms % 7);
  CHECK(spread.min_rtt() == 1ms);
  CHECK(spread.max_rtt() == 100ms);
  CHECK(spread.mean_rtt() == 50500us);
  CHECK(spread.max_in_flight() == 6);
  CHECK(spread.limit() == 5);
  CHECK(spread.duration() == 1s);
  for (double p : {10.0, 50.0, 90.0, 95.0, 99.0}) {
    const double exact = p * 1e6;  // the p-th of 1..100 ms is p ms
    const double got = static_cast<double>(spread.percentile(p).count());
    CHECK(got == Approx(exact).epsilon(0.0625));
  }
  // Negative RTTs (a clock that moved under us) count as zero, and tiny and huge ones land
  // in the open-ended buckets without breaking the summary.
  LimitWindow odd;
  odd.add(-5ns);
  odd.add(100ns);
  odd.add(std::chrono::hours(1000));
  CHECK(odd.min_rtt() == 0ns);
  CHECK(odd.max_rtt() == std::chrono::hours(1000));
  CHECK(odd.percentile(1) <= 1024ns);
}

TEST_CASE("StaticLimit is fixed and validated", "[limit_algorithms]") {
  StaticLimit s(42);
  CHECK(s.limit() == 42);
  CHECK(s.max_limit() == 42);
  CHECK(s.on_window(window(1s, 100, 42, 100)) == 42);
  CHECK(what_of([] { StaticLimit bad(0); }).find("limit") != std::string::npos);
  CHECK_THROWS_AS(StaticLimit(tailbatch::kMaxConcurrencyLimit + 1), std::invalid_argument);
}

// --- AIMD: Netflix AIMDLimitTest's scenarios --------------------------------------------------

TEST_CASE("AIMD: defaults match the documented ones", "[limit_algorithms][aimd]") {
  AimdLimit a;
  CHECK(a.limit() == 20);
  CHECK(a.max_limit() == 200);
  CHECK(a.config().backoff_ratio == 0.9);
  CHECK(a.config().timeout == 5s);
  CHECK(a.next_window().min_duration == 250ms);
  CHECK(a.next_window().min_samples == 10);
  CHECK_FALSE(a.next_window().fresh_only);
}

TEST_CASE("AIMD: a used limit grows by one per good window", "[limit_algorithms][aimd]") {
  AimdLimit a(AimdLimitConfig{.initial_limit = 10, .min_limit = 1});
  CHECK(a.on_window(window(1ms, 10, 10)) == 11);
  CHECK(a.on_window(window(1ms, 10, 6)) == 12);  // 6 >= 0.5 * 11
}

TEST_CASE("AIMD: an idle limit does not grow", "[limit_algorithms][aimd]") {
  AimdLimit a(AimdLimitConfig{.initial_limit = 10, .min_limit = 1});
  CHECK(a.on_window(window(1ms, 10, 4)) == 10);  // 4 < 0.5 * 10: the service is not using it
  CHECK(a.on_window(LimitWindow{}) == 10);       // nothing happened: nothing changes
}

TEST_CASE("AIMD: a drop backs off multiplicatively, by at least one", "[limit_algorithms][aimd]") {
  AimdLimit a(AimdLimitConfig{.initial_limit = 10, .min_limit = 1});
  CHECK(a.on_window(window(1ms, 10, 10, 1)) == 9);
  AimdLimit b(AimdLimitConfig{.initial_limit = 30, .min_limit = 1});
  CHECK(b.on_window(window(1ms, 10, 30, 3)) == 27);
  AimdLimit c(AimdLimitConfig{.initial_limit = 5, .min_limit = 1, .backoff_ratio = 0.99});
  CHECK(c.on_window(window(1ms, 10, 5, 1)) == 4);  // floor(4.95) = 4
}

TEST_CASE("AIMD: a sample over the timeout counts as a drop", "[limit_algorithms][aimd]") {
  AimdLimit a(AimdLimitConfig{.initial_limit = 30, .min_limit = 1, .timeout = 1s});
  auto w = window(1ms, 9, 30);
  w.add(1s + 1ns, 30);
  CHECK(a.on_window(w) == 27);
  AimdLimit no_timeout(AimdLimitConfig{.initial_limit = 30, .min_limit = 1, .timeout = 0s});
  CHECK(no_timeout.on_window(w) == 31);
}

TEST_CASE("AIMD: latency over the target backs off, under it grows", "[limit_algorithms][aimd]") {
  AimdLimit a(AimdLimitConfig{
      .initial_limit = 20, .min_limit = 1, .latency_target = 50ms, .target_percentile = 95});
  auto slow = window(10ms, 90, 20);
  for (int i = 0; i < 10; ++i) slow.add(80ms, 20);  // p95 = 80 ms
  CHECK(a.on_window(slow) == 18);
  auto fast = window(10ms, 96, 20);
  for (int i = 0; i < 4; ++i) fast.add(80ms, 20);  // p95 = 10 ms
  CHECK(a.on_window(fast) == 19);
}

TEST_CASE("AIMD: bounds hold at the top and the bottom", "[limit_algorithms][aimd]") {
  AimdLimit top(AimdLimitConfig{.initial_limit = 21, .min_limit = 1, .max_limit = 21});
  CHECK(top.on_window(window(1ms, 10, 21)) == 21);
  AimdLimit bottom(AimdLimitConfig{.initial_limit = 3, .min_limit = 3});
  CHECK(bottom.on_window(window(1ms, 10, 3, 10)) == 3);
  AimdLimit big_step(AimdLimitConfig{.initial_limit = 20, .max_limit = 22, .increase = 5});
  CHECK(big_step.on_window(window(1ms, 10, 20)) == 22);
}

TEST_CASE("AIMD: saw-tooth against a fixed capacity", "[limit_algorithms][aimd]") {
  // A service that times out whenever more than 40 requests are in flight, with the limit
  // always used: the limit climbs by one per window to 41, is cut to floor(41 * 0.9) = 36,
  // climbs again: the classic saw-tooth, period 6 windows, forever between 36 and 41.
  constexpr std::uint32_t capacity = 40;
  AimdLimit a(AimdLimitConfig{.initial_limit = 30, .min_limit = 1});
  std::vector<std::uint32_t> trace;
  for (int i = 0; i < 40; ++i) {
    const auto limit = a.limit();
    const std::uint32_t drops = limit > capacity ? 1 : 0;
    trace.push_back(a.on_window(window(1ms, 10, limit, drops)));
  }
  // The rise from 30 to 41.
  for (std::size_t i = 0; i < 11; ++i) CHECK(trace[i] == 31 + i);
  // Then the tooth: 36 37 38 39 40 41 | 36 ...
  const std::vector<std::uint32_t> tooth = {36, 37, 38, 39, 40, 41};
  for (std::size_t i = 11; i < trace.size(); ++i) CHECK(trace[i] == tooth[(i - 11) % 6]);
}

TEST_CASE("AIMD: bad configuration names the field", "[limit_algorithms][aimd]") {
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.min_limit = 0}); }).find("min_limit") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.initial_limit = 300}); }).find("initial_limit") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.min_limit = 30}); }).find("initial_limit") !=
        std::string::npos);
  CHECK(what_of([] {
          AimdLimit a(AimdLimitConfig{.min_limit = 5, .max_limit = 4});
        }).find("max_limit") != std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.backoff_ratio = 1.0}); }).find("backoff_ratio") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.backoff_ratio = 0.4}); }).find("backoff_ratio") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.increase = 0}); }).find("increase") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.timeout = -1s}); }).find("timeout") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.latency_target = -1s}); }).find("latency_target") !=
        std::string::npos);
  CHECK(what_of([] {
          AimdLimit a(AimdLimitConfig{.target_percentile = 0});
        }).find("target_percentile") != std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.utilization = 1.5}); }).find("utilization") !=
        std::string::npos);
  CHECK(what_of([] { AimdLimit a(AimdLimitConfig{.window = 0s}); }).find("window") != std::string::npos);
  CHECK(what_of([] {
          AimdLimit a(AimdLimitConfig{.min_window_samples = 0});
        }).find("min_window_samples") != std::string::npos);
}

// --- Gradient: Envoy gradient controller tests and Netflix Gradient2 behaviour ----------------

TEST_CASE("Gradient: defaults match the documented ones", "[limit_algorithms][gradient]") {
  GradientLimit g(GradientLimitConfig{.seed = 1});
  const auto& c = g.config();
  CHECK(c.initial_limit == 20);
  CHECK(c.min_limit == 3);
  CHECK(c.max_limit == 1000);
  CHECK(c.smoothing == 0.2);
  CHECK(c.min_rtt_buffer == 0.25);
  CHECK(c.min_gradient == 0.5);
  CHECK(c.max_gradient == 2.0);
  CHECK(c.sample_percentile == 50);
  CHECK(c.probe_interval == 60s);
  CHECK(c.probe_jitter == 0.15);
  CHECK(c.probe_samples == 50);
  CHECK(c.probe_concurrency == 3);
  CHECK(c.reprobe_after_windows_at_min == 5);
  CHECK(g.max_limit() == 1000);
}

TEST_CASE("Gradient: starts by probing the min RTT at the probe concurrency",
          "[limit_algorithms][gradient]") {
  // Envoy MinRTTLogicTest: the limit is pinned while the probe gathers its samples, and the
  // probe's aggregate becomes the min RTT.
  GradientLimit g(GradientLimitConfig{.probe_samples = 50, .probe_concurrency = 7, .seed = 1});
  CHECK(g.probing());
  CHECK(g.limit() == 7);
  CHECK(g.next_window().fresh_only);
  CHECK(g.next_window().min_samples == 50);
  CHECK(g.next_window().min_duration == 0ns);
  CHECK(g.on_window(window(13ms, 49, 7)) == 7);  // not enough samples yet
  CHECK(g.probing());
  CHECK(g.on_window(window(13ms, 50, 7)) == 20);  // done: back to the initial limit
  CHECK_FALSE(g.probing());
  CHECK(g.min_rtt() == 13ms);
  CHECK(g.probes_completed() == 1);
}

TEST_CASE("Gradient: the min RTT is the probe's sample percentile",
          "[limit_algorithms][gradient]") {
  // Envoy SamplePercentileProcessTest-like: samples of 1..5 ms, p50 -> 3 ms.
  GradientLimit g(GradientLimitConfig{.probe_samples = 5, .seed = 1});
  LimitWindow w(t0 - 1s, t0, 3);
  for (int ms = 1; ms <= 5; ++ms) w.add(std::chrono::milliseconds(ms), 1);
  g.on_window(w);
  // Window percentiles are bucketed: within 6.25 % (equal samples come out exact).
  CHECK(static_cast<double>(g.min_rtt().count()) == Approx(3e6).epsilon(0.0625));
}

TEST_CASE("Gradient: the buffer keeps a slightly slower RTT from shrinking the limit",
          "[limit_algorithms][gradient]") {
  // Envoy MinRTTBufferTest: min RTT 5 ms, 50 % buffer, samples at 6 ms: the limit keeps rising.
  GradientLimit g(GradientLimitConfig{.min_rtt_buffer = 0.5, .probe_samples = 5, .seed = 1});
  finish_first_probe(g, 5ms);
  for (int i = 0; i < 10; ++i) {
    const auto before = g.limit();
    CHECK(g.on_window(window(6ms, 10, before)) > before);
  }
}

TEST_CASE("Gradient: grows under low latency, shrinks under high, within the gradient bounds",
          "[limit_algorithms][gradient]") {
  // Envoy ConcurrencyLimitBehaviorTestBasic, with Envoy's settings (no smoothing).
  GradientLimit g(GradientLimitConfig{.initial_limit = 7,
                                 .min_limit = 7,
                                 .smoothing = 1.0,
                                 .min_rtt_buffer = 0.1,
                                 .probe_samples = 5,
                                 .probe_concurrency = 7,
                                 .seed = 1});
  finish_first_probe(g, 5ms);
  CHECK(g.limit() == 7);
  for (int i = 0; i < 10; ++i) {  // faster than the min RTT: grows, at most 2x + sqrt per window
    const double before = g.limit();
    const double after = g.on_window(window(4ms, 10, g.limit()));
    CHECK(after > before);
    CHECK(after <= 2.0 * before + std::sqrt(2.0 * before) + 1);
  }
  for (int i = 0; i < 10; ++i) {  // slower than min RTT + buffer: shrinks, at most by half
    const double before = g.limit();
    const double after = g.on_window(window(6ms, 10, g.limit()));
    CHECK(after < before);
    CHECK(after >= 0.5 * before);
    CHECK(after >= 7);
  }
}

TEST_CASE("Gradient: falls when latency rises and recovers when it falls",
          "[limit_algorithms][gradient]") {
  GradientLimit g(GradientLimitConfig{.initial_limit = 40,
                                 .probe_interval = std::chrono::hours(1),
                                 .probe_samples = 10,
                                 .seed = 7});
  finish_first_probe(g, 20ms);
  auto step = [&](std::chrono::nanoseconds rtt) { return g.on_window(window(rtt, 20, g.limit())); };
  // Steady at the min RTT: grows (queue allowance, gradient > 1 within the buffer).
  for (int i = 0; i < 10; ++i) step(20ms);
  const auto healthy = g.limit();
  CHECK(healthy > 40);
  // Latency triples (queueing): the limit falls every window, by at most half per window.
  std::uint32_t prev = healthy;
  for (int i = 0; i < 15; ++i) {
    const auto now = step(60ms);
    CHECK(now <= prev);
    CHECK(now >= prev / 2);
    prev = now;
  }
  const auto overloaded = g.limit();
  CHECK(overloaded < healthy / 2);
  CHECK(overloaded >= 3);
  // Latency back to normal: the limit recovers.
  for (int i = 0; i < 30; ++i) step(20ms);
  CHECK(g.limit() > healthy);
}

TEST_CASE("Gradient: no growth while the limit is not used", "[limit_algorithms][gradient]") {
  // Netflix Gradient2: "don't grow the limit if we are app limited".
  GradientLimit g(GradientLimitConfig{.initial_limit = 20, .probe_samples = 5, .seed = 1});
  finish_first_probe(g, 10ms);
  for (int i = 0; i < 10; ++i) CHECK(g.on_window(window(10ms, 10, 9)) == 20);  // 9 < 10
  CHECK(g.on_window(window(10ms, 10, 10)) > 20);
  // ... but an idle service whose latency rises still backs off.
  CHECK(g.on_window(window(40ms, 10, 2)) < 21);
}

TEST_CASE("Gradient: Netflix-style configuration (fixed queue of 4, gradient <= 1)",
          "[limit_algorithms][gradient]") {
  GradientLimit g(GradientLimitConfig{.initial_limit = 20,
                                 .min_limit = 20,
                                 .max_limit = 200,
                                 .min_rtt_buffer = 0.5,
                                 .max_gradient = 1.0,
                                 .queue_allowance_sqrt_scale = 0,
                                 .queue_allowance_fixed = 4,
                                 .probe_samples = 5,
                                 .seed = 1});
  finish_first_probe(g, 10ms);
  // Steady latency: 20 -> 20 * 0.8 + (20 + 4) * 0.2 = 20.8 -> 21.6 -> ...: +0.8 per window.
  CHECK(g.on_window(window(10ms, 10, 20)) == 20);
  CHECK(g.on_window(window(10ms, 10, 20)) == 21);
  // Latency within the 1.5x tolerance: still growing.
  const auto before = g.limit();
  CHECK(g.on_window(window(15ms, 10, 21)) > before);
}

TEST_CASE("Gradient: an empty window changes nothing", "[limit_algorithms][gradient]") {
  // Envoy NoSamplesTest.
  GradientLimit g(GradientLimitConfig{.probe_samples = 5, .seed = 1});
  finish_first_probe(g, 5ms);
  for (int i = 0; i < 3; ++i) g.on_window(window(4ms, 10, g.limit()));
  const auto limit = g.limit();
  for (int i = 0; i < 5; ++i) CHECK(g.on_window(LimitWindow(t0, t0 + 100ms, limit)) == limit);
}

TEST_CASE("Gradient: re-probes on schedule and restores the previous limit",
          "[limit_algorithms][gradient]") {
  // Envoy MinRTTReturnToPreviousLimit and MinRTTRescheduleTest, with jitter off.
  GradientLimit g(
      GradientLimitConfig{.probe_interval = 30s, .probe_jitter = 0, .probe_samples = 5, .seed = 1});
  finish_first_probe(g, 5ms, t0);
  CHECK(g.next_probe_at() == t0 + 30s);
  time_point now = t0;
  for (int i = 0; i < 5; ++i) {
    const auto before = g.limit();
    now += 101ms;
    CHECK(g.on_window(window(4ms, 10, before, 0, now)) > before);
  }
  const auto grown = g.limit();
  // Windows before the due time do not probe; the first one at or after it does.
  CHECK_FALSE(g.probing());
  g.on_window(window(5ms, 10, grown, 0, t0 + 30s - 1ns));
  CHECK_FALSE(g.probing());
  const auto limit_before_probe = g.limit();
  CHECK(g.on_window(window(5ms, 10, limit_before_probe, 0, t0 + 30s)) == 3);
  CHECK(g.probing());
  // While probing, regular windows (too few fresh samples) change nothing.
  CHECK(g.on_window(window(13ms, 4, 3, 0, t0 + 30s + 101ms)) == 3);
  // The probe completes and the limit from before the probe comes back.
  CHECK(g.on_window(window(13ms, 5, 3, 0, t0 + 31s)) == limit_before_probe);
  CHECK(g.min_rtt() == 13ms);
  CHECK(g.next_probe_at() == t0 + 31s + 30s);
}

TEST_CASE("Gradient: jitter delays probes by at most probe_jitter of the interval, seeded",
          "[limit_algorithms][gradient]") {
  // Envoy TimerAccuracyTest: with 10 % jitter of 100 s, the next probe is in [100 s, 110 s).
  auto schedule = [](std::uint64_t seed) {
    GradientLimit g(GradientLimitConfig{
        .probe_interval = 100s, .probe_jitter = 0.10, .probe_samples = 5, .seed = seed});
    std::vector<time_point::duration> delays;
    time_point at = t0;
    for (int i = 0; i < 20; ++i) {
      g.on_window(window(5ms, 5, 3, 0, at));  // completes the probe
      REQUIRE_FALSE(g.probing());
      const auto delay = g.next_probe_at() - at;
      CHECK(delay >= 100s);
      CHECK(delay < 110s);
      delays.push_back(delay);
      at = g.next_probe_at();
      g.on_window(window(5ms, 10, g.limit(), 0, at));  // due: starts the next probe
      REQUIRE(g.probing());
    }
    return delays;
  };
  const auto a = schedule(42);
  CHECK(a == schedule(42));  // same seed, same schedule
  CHECK(a != schedule(43));
  std::int64_t distinct = 0;
  for (std::size_t i = 1; i < a.size(); ++i) distinct += a[i] != a[i - 1];
  CHECK(distinct > 10);  // the delay really varies

  // Without jitter the schedule is exact (Envoy TimerAccuracyTestNoJitter).
  GradientLimit exact(
      GradientLimitConfig{.probe_interval = 45s, .probe_jitter = 0, .probe_samples = 5, .seed = 3});
  exact.on_window(window(5ms, 5, 3, 0, t0));
  CHECK(exact.next_probe_at() == t0 + 45s);
}

TEST_CASE("Gradient: sitting at the minimum triggers a fresh probe",
          "[limit_algorithms][gradient]") {
  // Envoy ConsecutiveMinConcurrencyReset: latencies far above the min RTT pin the limit at its
  // minimum; after 5 such windows the min RTT is re-measured, and with the new (higher) min
  // RTT the limit grows again at the same latency.
  GradientLimit g(GradientLimitConfig{.initial_limit = 7,
                                 .min_limit = 7,
                                 .min_rtt_buffer = 0,
                                 .probe_interval = 3600s,
                                 .probe_samples = 5,
                                 .probe_concurrency = 7,
                                 .seed = 1});
  finish_first_probe(g, 5ms);
  int windows = 0;
  while (!g.probing() && windows < 20) {
    g.on_window(window(10ms, 10, g.limit()));
    ++windows;
  }
  REQUIRE(g.probing());
  CHECK(windows == 5);
  g.on_window(window(10ms, 5, 7));  // the probe measures 10 ms
  CHECK(g.min_rtt() == 10ms);
  for (int i = 0; i < 10; ++i) {
    const auto before = g.limit();
    CHECK(g.on_window(window(10ms, 10, before)) >= before);
  }
  CHECK(g.limit() > 7);
}

TEST_CASE("Gradient: an unpinned probe measures live traffic at the current limit",
          "[limit_algorithms][gradient]") {
  GradientLimit g(
      GradientLimitConfig{.initial_limit = 50, .probe_samples = 5, .probe_concurrency = 0, .seed = 1});
  CHECK(g.probing());
  CHECK(g.limit() == 50);
  g.on_window(window(8ms, 5, 30));
  CHECK(g.min_rtt() == 8ms);
  CHECK(g.limit() == 50);
}

TEST_CASE("Gradient and AIMD: limits stay within their bounds whatever the samples",
          "[limit_algorithms]") {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<int> rtt_ms(1, 500);
  std::uniform_int_distribution<int> count(0, 60);
  std::uniform_int_distribution<int> coin(0, 9);
  GradientLimit g(GradientLimitConfig{.initial_limit = 10,
                                 .min_limit = 4,
                                 .max_limit = 64,
                                 .probe_interval = 5s,
                                 .probe_samples = 5,
                                 .probe_concurrency = 2,
                                 .seed = 9});
  AimdLimit a(
      AimdLimitConfig{.initial_limit = 10, .min_limit = 4, .max_limit = 64, .latency_target = 200ms});
  time_point now = t0;
  for (int i = 0; i < 5000; ++i) {
    now += 100ms;
    LimitWindow w(now - 100ms, now, g.limit());
    const int n = count(rng);
    for (int k = 0; k < n; ++k)
      w.add(std::chrono::milliseconds(rtt_ms(rng)), static_cast<std::uint32_t>(count(rng)),
            coin(rng) == 0);
    const auto gl = g.on_window(w);
    const auto al = a.on_window(w);
    if (g.probing()) {
      CHECK(gl == 2);
    } else {
      CHECK(gl >= 4);
      CHECK(gl <= 64);
    }
    CHECK(al >= 4);
    CHECK(al <= 64);
  }
  CHECK(g.probes_completed() > 10);
}

TEST_CASE("Gradient: bad configuration names the field", "[limit_algorithms][gradient]") {
  auto msg = [](GradientLimitConfig c) { return what_of([&] { GradientLimit g(c); }); };
  CHECK(msg({.min_limit = 0, .seed = 1}).find("min_limit") != std::string::npos);
  CHECK(msg({.max_limit = 2, .seed = 1}).find("max_limit") != std::string::npos);
  CHECK(msg({.initial_limit = 2, .seed = 1}).find("initial_limit") != std::string::npos);
  CHECK(msg({.smoothing = 0, .seed = 1}).find("smoothing") != std::string::npos);
  CHECK(msg({.smoothing = 1.5, .seed = 1}).find("smoothing") != std::string::npos);
  CHECK(msg({.min_rtt_buffer = -0.1, .seed = 1}).find("min_rtt_buffer") != std::string::npos);
  CHECK(msg({.min_gradient = 0, .seed = 1}).find("min_gradient") != std::string::npos);
  CHECK(msg({.max_gradient = 0.9, .seed = 1}).find("max_gradient") != std::string::npos);
  CHECK(msg({.queue_allowance_sqrt_scale = -1, .seed = 1}).find("queue_allowance_sqrt_scale") !=
        std::string::npos);
  CHECK(msg({.queue_allowance_fixed = -1, .seed = 1}).find("queue_allowance_fixed") !=
        std::string::npos);
  CHECK(msg({.sample_percentile = 0, .seed = 1}).find("sample_percentile") != std::string::npos);
  CHECK(msg({.window = 0ms, .seed = 1}).find("window") != std::string::npos);
  CHECK(msg({.min_window_samples = 0, .seed = 1}).find("min_window_samples") != std::string::npos);
  CHECK(msg({.app_limited_fraction = 2, .seed = 1}).find("app_limited_fraction") !=
        std::string::npos);
  CHECK(msg({.probe_interval = 0s, .seed = 1}).find("probe_interval") != std::string::npos);
  CHECK(msg({.probe_jitter = 1.5, .seed = 1}).find("probe_jitter") != std::string::npos);
  CHECK(msg({.probe_samples = 0, .seed = 1}).find("probe_samples") != std::string::npos);
  CHECK(msg({.probe_concurrency = 5000, .seed = 1}).find("probe_concurrency") != std::string::npos);
}
