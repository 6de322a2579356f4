// tailbatch/littles_law.hpp: the Little's-law self-check, from numbers and from a
// latency histogram's snapshot, on the latency field guide's Example 3.
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/metrics.hpp>
#include <tailbatch/littles_law.hpp>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::MetricsRegistry;

TEST_CASE("Little's law: the latency field guide's Example 3 is consistent", "[metrics][littles_law]") {
  // "Concurrency per instance ≈ throughput × latency ≈ 350 × 0.12 ≈ 42."
  const auto c = tailbatch::check_littles_law(350.0, 120ms, 42.0);
  CHECK(c.throughput_per_s == 350.0);
  CHECK(c.mean_latency == 120ms);
  CHECK(c.measured_in_flight == 42.0);
  CHECK(c.threshold == 0.2);
  CHECK(c.predicted_in_flight == Approx(42.0));
  CHECK(std::fabs(c.relative_deviation) < 1e-9);
  CHECK_FALSE(c.hidden_queue_suspected);
  INFO(c.explanation);
  CHECK(contains(c.explanation, "consistent"));
  CHECK(contains(c.explanation, "42"));

  // Measurement noise within the threshold is still consistent: 46 is +9.5 %.
  CHECK_FALSE(tailbatch::check_littles_law(350.0, 120ms, 46.0).hidden_queue_suspected);
}

TEST_CASE("Little's law flags a hidden queue in either direction", "[metrics][littles_law]") {
  SECTION("more in flight than throughput x latency: waiting the latency timer misses") {
    // 60 in flight at 350/s means 171 ms in the system, but only 120 ms is measured.
    const auto c = tailbatch::check_littles_law(350.0, 120ms, 60.0);
    CHECK(c.predicted_in_flight == Approx(42.0));
    CHECK(c.relative_deviation == Approx(60.0 / 42.0 - 1.0));
    CHECK(c.hidden_queue_suspected);
    INFO(c.explanation);
    CHECK(contains(c.explanation, "hidden queue suspected"));
    CHECK(contains(c.explanation, "+42.9 %"));
    CHECK(contains(c.explanation, "before the timer starts"));
  }
  SECTION("fewer in flight than predicted: waiting outside the in-flight count") {
    const auto c = tailbatch::check_littles_law(350.0, 120ms, 30.0);
    CHECK(c.relative_deviation == Approx(30.0 / 42.0 - 1.0));
    CHECK(c.hidden_queue_suspected);
    INFO(c.explanation);
    CHECK(contains(c.explanation, "-28.6 %"));
    CHECK(contains(c.explanation, "upstream"));
  }
  SECTION("the threshold decides") {
    // 50 in flight is +19 %: within the default 20 %, beyond a 10 % threshold.
    CHECK_FALSE(tailbatch::check_littles_law(350.0, 120ms, 50.0).hidden_queue_suspected);
    CHECK(tailbatch::check_littles_law(350.0, 120ms, 50.0, 0.1).hidden_queue_suspected);
  }
  SECTION("nothing completing while requests are in flight is flagged; an idle system is not") {
    const auto stuck = tailbatch::check_littles_law(0.0, 120ms, 5.0);
    CHECK(stuck.hidden_queue_suspected);
    CHECK(std::isinf(stuck.relative_deviation));
    const auto idle = tailbatch::check_littles_law(0.0, 0ms, 0.0);
    CHECK_FALSE(idle.hidden_queue_suspected);
    CHECK(idle.relative_deviation == 0.0);
  }
  SECTION("bad inputs throw, naming the field") {
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(-1.0, 1ms, 1.0), std::invalid_argument,
                       MessageContains("throughput_per_s"));
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(std::nan(""), 1ms, 1.0), std::invalid_argument,
                       MessageContains("throughput_per_s"));
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(1.0, -1ms, 1.0), std::invalid_argument,
                       MessageContains("mean_latency"));
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(1.0, 1ms, -1.0), std::invalid_argument,
                       MessageContains("mean_in_flight"));
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(1.0, 1ms, 1.0, 0.0), std::invalid_argument,
                       MessageContains("threshold"));
    tailbatch::LatencyHistogram h;
    CHECK_THROWS_MATCHES((void)tailbatch::check_littles_law(h.snapshot(), 0ms, 1.0), std::invalid_argument,
                       MessageContains("window"));
  }
}

TEST_CASE("Little's law from a histogram snapshot and an observation window",
          "[metrics][littles_law]") {
  // Example 3 again, as a server would measure it: 10 s at 350 completions/s, 120 ms each.
  MetricsRegistry r;
  auto& h = r.histogram("tailbatch_end_to_end_seconds", "h");
  for (int i = 0; i < 3500; ++i) h.record(120ms);
  const auto snap = h.snapshot();
  const auto ok = tailbatch::check_littles_law(snap, 10s, 42.0);
  CHECK(ok.throughput_per_s == Approx(350.0));
  CHECK(ok.mean_latency.count() == Approx(120e6).epsilon(0.01));
  CHECK(ok.predicted_in_flight == Approx(42.0).epsilon(0.01));
  CHECK_FALSE(ok.hidden_queue_suspected);
  CHECK(tailbatch::check_littles_law(snap, 10s, 60.0).hidden_queue_suspected);
}
