// The capacity planner against the latency field guide's worked examples and exercise, figure by figure.
#include <tailbatch/tools/planner.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "tailbatch_test.hpp"

using tailbatch::BatchPlan;
using tailbatch::CapacityPlan;
using tailbatch::LatencyProfile;
using tailbatch::PlannerConfig;

namespace {

// The latency field guide's Example 1: base 20 ms, +3 ms per extra item, network 5 ms, window 8 ms, two
// GPU streams, p95 SLO 150 ms.
PlannerConfig example1(double tail = 1.2) {
  PlannerConfig c;
  c.profile = LatencyProfile::linear(20.0, 3.0);
  c.network_ms = 5.0;
  c.window_ms = 8.0;
  c.streams = 2;
  c.tail = tail;
  c.slo_p95_ms = 150.0;
  return c;
}

// The latency field guide's Exercise: 18 ms + 2.5 ms per item, network 4 ms, window 6 ms for batch > 1,
// two streams, +20 % tail, p95 < 150 ms at 600 rps.
PlannerConfig exercise() {
  PlannerConfig c;
  c.profile = LatencyProfile::linear(18.0, 2.5);
  c.network_ms = 4.0;
  c.window_ms = 6.0;
  c.streams = 2;
  c.tail = 1.2;
  c.slo_p95_ms = 150.0;
  c.target_rps = 600.0;
  c.headroom = 0.3;
  return c;
}

const BatchPlan& at(const CapacityPlan& plan, int batch) {
  for (const auto& c : plan.candidates)
    if (c.batch_size == batch) return c;
  throw std::runtime_error("no candidate for batch " + std::to_string(batch));
}

}  // namespace

TEST_CASE("Example 1: batch 8 and 16 per-request time and throughput", "[planner][guide]") {
  auto plan = tailbatch::plan_capacity(example1());
  const auto& b8 = at(plan, 8);
  CHECK(b8.model_ms == Approx(41.0));
  CHECK(b8.request_ms == Approx(54.0));
  CHECK(b8.stream_rps == Approx(148.0).epsilon(0.005));    // 8 / 0.054 ≈ 148
  CHECK(b8.instance_rps == Approx(296.0).epsilon(0.005));  // both streams ≈ 296
  const auto& b16 = at(plan, 16);
  CHECK(b16.model_ms == Approx(65.0));
  CHECK(b16.request_ms == Approx(78.0));
  CHECK(b16.stream_rps == Approx(205.0).epsilon(0.005));   // 16 / 0.078 ≈ 205
  CHECK(b16.instance_rps == Approx(410.0).epsilon(0.005)); // ≈ 410
  // Batch 1 pays no window.
  CHECK(at(plan, 1).request_ms == Approx(25.0));
}

TEST_CASE("Example 1: p95 with 10-30 % tail inflation is 85-100 ms at batch 16, under the SLO",
          "[planner][guide]") {
  for (double tail : {1.1, 1.2, 1.3}) {
    auto plan = tailbatch::plan_capacity(example1(tail));
    const auto& b16 = at(plan, 16);
    CHECK(b16.p95_ms >= 85.0);
    CHECK(b16.p95_ms <= 102.0);  // 1.3 × 78 = 101.4: the latency field guide rounds to "≈ 100"
    CHECK(b16.meets_slo);
  }
}

TEST_CASE("Example 1: batch 16 is preferred over 8", "[planner][guide]") {
  auto config = example1();
  config.preferred = {8, 16};
  auto plan = tailbatch::plan_capacity(config);
  REQUIRE(plan.candidates.size() == 2);
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 16);
  CHECK(plan.reason.find("batch 16") != std::string::npos);
  CHECK(plan.reason.find("150.0 ms SLO") != std::string::npos);
}

TEST_CASE("Example 1 over every size: the largest batch whose p95 meets the SLO", "[planner]") {
  // request(b) = 20 + 3(b − 1) + 5 + 8 = 30 + 3b; 1.2 × (30 + 3b) <= 150  <=>  b <= 31.
  auto plan = tailbatch::plan_capacity(example1());
  CHECK(plan.candidates.size() == 64);
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 31);
  CHECK(at(plan, 31).meets_slo);
  CHECK_FALSE(at(plan, 32).meets_slo);
  CHECK(plan.reason.find("batch 32 would estimate") != std::string::npos);
}

TEST_CASE("Example 3: replicas, headroom and the in-flight cap from a measured instance",
          "[planner][guide]") {
  tailbatch::InstanceMeasurement m;
  m.instance_rps = 350.0;
  m.p95_ms = 120.0;
  m.target_rps = 2000.0;
  m.headroom = 0.3;
  m.batch_size = 32;
  auto p = tailbatch::plan_from_instance(m);
  CHECK(p.replicas == 6);                 // ceil(2000 / 350)
  CHECK(p.replicas_with_headroom == 8);   // ceil(2600 / 350)
  CHECK(p.concurrency == Approx(42.0));  // 350 × 0.12
  CHECK(p.max_in_flight == 50);           // 42 × 1.1 = 46.2, rounded up to 50
  CHECK(p.reason.find("cap it at 50") != std::string::npos);
}

TEST_CASE("The Exercise worked through: 18 ms + 2.5 ms/item, 2 streams, p95 < 150 ms at 600 rps",
          "[planner][guide]") {
  auto plan = tailbatch::plan_capacity(exercise());
  // request(b) = 18 + 2.5(b − 1) + 4 + 6 = 25.5 + 2.5b; 1.2 × request <= 150  <=>  b <= 39.
  REQUIRE(plan.recommendation() != nullptr);
  const auto& rec = *plan.recommendation();
  CHECK(rec.batch_size == 39);
  CHECK(rec.request_ms == Approx(123.0));
  CHECK(rec.p95_ms == Approx(147.6));
  CHECK(rec.instance_rps == Approx(634.1).epsilon(0.001));
  CHECK(rec.replicas == 1);
  CHECK(rec.replicas_with_headroom == 2);
  CHECK_FALSE(at(plan, 40).meets_slo);  // 1.2 × 125.5 = 150.6

  // The sizes docs/planner.md tabulates.
  const auto& b16 = at(plan, 16);
  CHECK(b16.request_ms == Approx(65.5));
  CHECK(b16.p95_ms == Approx(78.6));
  CHECK(b16.stream_rps == Approx(244.27).epsilon(0.001));
  CHECK(b16.instance_rps == Approx(488.55).epsilon(0.001));
  CHECK(b16.replicas == 2);
  CHECK(b16.replicas_with_headroom == 2);
  const auto& b32 = at(plan, 32);
  CHECK(b32.request_ms == Approx(105.5));
  CHECK(b32.p95_ms == Approx(126.6));
  CHECK(b32.instance_rps == Approx(606.64).epsilon(0.001));
  CHECK(b32.replicas == 1);
  CHECK(b32.replicas_with_headroom == 2);
  const auto& b1 = at(plan, 1);
  CHECK(b1.request_ms == Approx(22.0));  // no window at batch 1
  CHECK(b1.replicas == 7);                      // 2 × 1000/22 = 90.9 rps: ceil(600 / 90.9)

  // The same two replicas with headroom are reached at a much smaller batch: the plan says so.
  REQUIRE(plan.same_replicas_lower_p95.has_value());
  const auto& alt = plan.candidates[*plan.same_replicas_lower_p95];
  CHECK(alt.replicas_with_headroom == 2);
  CHECK(alt.p95_ms < b16.p95_ms + 1e-9);
  CHECK(plan.reason.find("the same cost for lower latency") != std::string::npos);
}

TEST_CASE("Exercise restricted to the preferred sizes 8, 16, 32", "[planner][guide]") {
  auto config = exercise();
  config.preferred = {32, 8, 16, 16};  // order and duplicates do not matter
  auto plan = tailbatch::plan_capacity(config);
  REQUIRE(plan.candidates.size() == 3);
  CHECK(plan.candidates[0].batch_size == 8);
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 32);
  REQUIRE(plan.same_replicas_lower_p95.has_value());
  CHECK(plan.candidates[*plan.same_replicas_lower_p95].batch_size == 16);
}

TEST_CASE("No SLO: the highest throughput; an unreachable SLO: no recommendation", "[planner]") {
  auto config = example1();
  config.slo_p95_ms.reset();
  config.max_batch = 16;
  auto plan = tailbatch::plan_capacity(config);
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 16);
  CHECK(plan.reason.find("no SLO") != std::string::npos);
  CHECK_FALSE(plan.candidates.front().replicas.has_value());  // no target, no replicas

  config.slo_p95_ms = 20.0;  // below even batch 1's 1.2 × 25 ms
  plan = tailbatch::plan_capacity(config);
  CHECK(plan.recommendation() == nullptr);
  CHECK(plan.candidates[plan.lowest_p95].batch_size == 1);
  CHECK(plan.reason.find("no candidate meets") != std::string::npos);
}

TEST_CASE("A measured profile: parsing, interpolation, candidates are the measured sizes",
          "[planner]") {
  auto p = LatencyProfile::parse("1:20,8:41,16:65");
  REQUIRE(p.is_measured());
  CHECK(p.points().size() == 3);
  CHECK(p.model_ms(8) == Approx(41.0));
  CHECK(p.model_ms(12) == Approx(53.0));  // halfway between 41 and 65
  CHECK_THROWS_AS(p.model_ms(17), std::invalid_argument);

  auto file = LatencyProfile::parse("# batch, latency\nbatch,latency_ms\n16, 65\n1 20\n8\t41  # measured\n\n");
  CHECK(file.points().size() == 3);
  CHECK(file.points().front().batch_size == 1);
  CHECK(file.model_ms(16) == Approx(65.0));

  auto config = example1();
  config.profile = p;
  auto plan = tailbatch::plan_capacity(config);
  REQUIRE(plan.candidates.size() == 3);
  // The measured table matches the linear model at these sizes, so the figures agree.
  CHECK(at(plan, 16).instance_rps == Approx(410.26).epsilon(0.001));
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 16);

  config.preferred = {12};
  CHECK(tailbatch::plan_capacity(config).candidates.front().model_ms == Approx(53.0));
  config.preferred = {32};
  CHECK_INVALID(tailbatch::plan_capacity(config), "outside the measured profile");
}

TEST_CASE("Bad input throws std::invalid_argument naming the field", "[planner]") {
  CHECK_INVALID(LatencyProfile::linear(0.0, 1.0), "base_ms");
  CHECK_INVALID(LatencyProfile::linear(1.0, -1.0), "per_item_ms");
  CHECK_INVALID(LatencyProfile::parse("1:20,8"), "\"8\"");
  CHECK_INVALID(LatencyProfile::parse("1:20,x:41"), "x:41");
  CHECK_INVALID(LatencyProfile::parse("1:20,1:30"), "listed twice");
  CHECK_INVALID(LatencyProfile::parse("2.5:20"), "whole batch size");
  CHECK_INVALID(LatencyProfile::parse(""), "no batch:ms pairs");
  CHECK_INVALID(LatencyProfile::parse("4:0"), "must be > 0");

  auto bad = [](auto mutate) {
    auto c = example1();
    mutate(c);
    return c;
  };
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.streams = 0; })),
                "streams");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.tail = 0.9; })),
                "tail");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.network_ms = -1; })),
                "network_ms");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.headroom = -0.1; })),
                "headroom");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.max_batch = 0; })),
                "max_batch");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.preferred = {128}; })),
                "exceeds max_batch");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.slo_p95_ms = 0.0; })),
                "slo_p95_ms");
  CHECK_INVALID(tailbatch::plan_capacity(bad([](PlannerConfig& c) { c.target_rps = -5.0; })),
                "target_rps");

  tailbatch::InstanceMeasurement m{350.0, 120.0, 2000.0, 0.3, 1, 1};
  m.p95_ms = 0.0;
  CHECK_INVALID(tailbatch::plan_from_instance(m), "p95_ms");
}

TEST_CASE("Replica and in-flight rounding", "[planner]") {
  CHECK(tailbatch::replicas_for(2000.0, 350.0) == 6);
  CHECK(tailbatch::replicas_for(2000.0, 350.0, 0.3) == 8);
  CHECK(tailbatch::replicas_for(2600.0, 325.0) == 8);  // exactly 8: no rounding up to 9
  CHECK(tailbatch::replicas_for(1.0, 1000.0) == 1);    // never fewer than one
  CHECK(tailbatch::suggested_max_in_flight(42.0) == 50);
  CHECK(tailbatch::suggested_max_in_flight(45.5) == 55);   // 50.05: a multiple of 5 below 100
  CHECK(tailbatch::suggested_max_in_flight(9.6) == 15);    // 10.56
  CHECK(tailbatch::suggested_max_in_flight(93.6) == 110);  // 102.96: a multiple of 10 from 100
  CHECK(tailbatch::suggested_max_in_flight(3.0) == 4);    // small caps keep their precision
  CHECK(tailbatch::suggested_max_in_flight(3.0, 32) == 32);  // never below batch × streams
  CHECK(tailbatch::littles_law_concurrency(350.0, 120.0) == Approx(42.0));
}

TEST_CASE("Huge counts are exact or refused, never wrapped to a negative number", "[planner][overflow]") {
  // 1e12 rps on 3200-rps instances: 312 500 000 replicas, counted exactly.
  CHECK(tailbatch::replicas_for(1e12, 3200.0) == 312'500'000);
  CHECK(tailbatch::replicas_for(1e12, 50.0) == 20'000'000'000);  // beyond INT_MAX, still exact
  // Beyond 2^53 - 1, or not finite: a clear error naming the inputs.
  CHECK_INVALID(tailbatch::replicas_for(10.0, 1e-300), "instance_rps");
  CHECK_INVALID(tailbatch::replicas_for(10.0, 1e-300), "more than the planner counts");
  CHECK_INVALID(tailbatch::replicas_for(100.0, 3200.0, 1e308), "headroom");
  CHECK_INVALID(tailbatch::replicas_for(1e300, 1.0), "target_rps");
  CHECK(tailbatch::suggested_max_in_flight(1e12) == 1'100'000'000'000);
  CHECK_INVALID(tailbatch::suggested_max_in_flight(1e300), "more than the planner counts");
  CHECK_INVALID(tailbatch::suggested_max_in_flight(std::numeric_limits<double>::infinity()), "concurrency");
  CHECK(tailbatch::suggested_max_in_flight(1.0, std::int64_t{3'000'000'000}) == 3'000'000'000);

  // Through the planner: a huge target gives huge, positive, exact counts.
  PlannerConfig c;
  c.profile = LatencyProfile::linear(20.0, 0.0);
  c.target_rps = 1e12;
  auto plan = tailbatch::plan_capacity(c);
  for (const auto& cand : plan.candidates) {
    REQUIRE(cand.replicas.has_value());
    CHECK(*cand.replicas >= 1);
    CHECK(*cand.replicas_with_headroom >= *cand.replicas);
  }
  CHECK(*at(plan, 1).replicas == 20'000'000'000);         // 1e12 / 50 rps
  CHECK(*at(plan, 1).replicas_with_headroom == 26'000'000'000);
  CHECK(plan.reason.find("-2147483648") == std::string::npos);

  c.headroom = 1e308;  // finite, but target × (1 + headroom) is not
  CHECK_INVALID(tailbatch::plan_capacity(c), "more than the planner counts");

  tailbatch::InstanceMeasurement m{1e-300, 100.0, 10.0, 0.3, 1, 1};
  CHECK_INVALID(tailbatch::plan_from_instance(m), "more than the planner counts");
  m = {350.0, 120.0, 2000.0, 1e308, 1, 1};
  CHECK_INVALID(tailbatch::plan_from_instance(m), "more than the planner counts");
}

namespace {
// The figures of every size in [lo, hi] by brute force, for checking the sparse candidates.
int brute_force_last_meeting_slo(const PlannerConfig& c, int lo, int hi) {
  int last = 0;
  for (int b = lo; b <= hi; ++b)
    if (tailbatch::plan_batch(c, b).meets_slo) last = b;
  return last;
}
}  // namespace

TEST_CASE("A huge max_batch plans a bounded set of candidates with the exact answer",
          "[planner][max_batch]") {
  // 33 ms + 1 ns per extra item, p95 = 1.2 x request <= 150 ms: the SLO holds up to
  // b - 1 <= 92e6, i.e. batch 92 000 001 (give or take the rounding of doubles).
  PlannerConfig c;
  c.profile = LatencyProfile::linear(20.0, 1e-6);
  c.network_ms = 5.0;
  c.window_ms = 8.0;
  c.slo_p95_ms = 150.0;
  for (int max_batch : {10'000'000, 100'000'000, std::numeric_limits<int>::max()}) {
    INFO("max_batch " << max_batch);
    c.max_batch = max_batch;
    c.target_rps.reset();
    auto plan = tailbatch::plan_capacity(c);
    CHECK(plan.candidates.size() <= 2000);  // about 1500 at most, whatever max_batch is
    CHECK(plan.candidates.front().batch_size == 1);
    CHECK(plan.candidates.back().batch_size == max_batch);
    for (std::size_t i = 1; i < plan.candidates.size(); ++i)
      CHECK(plan.candidates[i - 1].batch_size < plan.candidates[i].batch_size);
    REQUIRE(plan.recommendation() != nullptr);
    const int rec = plan.recommendation()->batch_size;
    if (max_batch == 10'000'000) {
      CHECK(rec == max_batch);  // every size meets the SLO; throughput grows with the batch
    } else {
      // The largest size that meets the SLO, exactly: it does, the next one does not.
      CHECK(rec > 91'000'000);
      CHECK(rec < 93'000'000);
      CHECK(tailbatch::plan_batch(c, rec).meets_slo);
      CHECK_FALSE(tailbatch::plan_batch(c, rec + 1).meets_slo);
      CHECK(brute_force_last_meeting_slo(c, rec - 1000, rec + 1000) == rec);
      CHECK(plan.reason.find("batch " + std::to_string(rec + 1) + " would estimate") != std::string::npos);
    }

    // With a target: the smallest size needing no more replicas is found exactly, too.
    c.target_rps = 1e9;
    plan = tailbatch::plan_capacity(c);
    CHECK(plan.candidates.size() <= 2000);
    REQUIRE(plan.recommendation() != nullptr);
    const auto& r = *plan.recommendation();
    REQUIRE(plan.same_replicas_lower_p95.has_value());
    const auto& alt = plan.candidates[*plan.same_replicas_lower_p95];
    CHECK(alt.batch_size < r.batch_size);
    CHECK(*alt.replicas_with_headroom <= *r.replicas_with_headroom);
    CHECK(*tailbatch::plan_batch(c, alt.batch_size - 1).replicas_with_headroom > *r.replicas_with_headroom);
  }
}

TEST_CASE("Up to 1024, every batch size is a candidate", "[planner][max_batch]") {
  auto c = example1();
  c.max_batch = tailbatch::dense_candidate_limit;
  auto plan = tailbatch::plan_capacity(c);
  CHECK(plan.candidates.size() == static_cast<std::size_t>(tailbatch::dense_candidate_limit));
  c.max_batch = tailbatch::dense_candidate_limit + 1;
  CHECK(tailbatch::plan_capacity(c).candidates.size() == static_cast<std::size_t>(tailbatch::dense_candidate_limit) + 1);
  REQUIRE(plan.recommendation() != nullptr);
  CHECK(plan.recommendation()->batch_size == 31);  // Example 1's answer is unchanged
}

TEST_CASE("Example 2: streaming shows content after 200 ms, the whole answer takes 2.18 s",
          "[planner][guide][streaming]") {
  // An LLM: prompt processing ≈ 120 ms, the first token ≈ 80 ms after that, then 50 tokens/s;
  // a 100-token answer.
  const tailbatch::GenerationProfile llm{.prefill_ms = 120.0, .first_token_ms = 80.0, .tokens_per_s = 50.0};
  const auto l = tailbatch::streaming_latency(llm, 100);
  CHECK(l.time_to_first_token_ms == Approx(200.0));      // streaming: content after ≈ 200 ms
  CHECK(l.inter_token_ms == Approx(20.0));
  CHECK(l.total_ms == Approx(120.0 + 80.0 + 1980.0));    // non-streaming: 120 + 80 + 99/50 s ≈ 2.18 s
  CHECK(l.total_ms - l.time_to_first_token_ms == Approx(1980.0));  // "then content flows for ~2 s"
  CHECK(l.streaming_speedup == Approx(10.9));            // "an order of magnitude"
  CHECK(l.streaming_speedup >= 10.0);

  // One token: both clients wait the same; longer answers widen the gap linearly.
  CHECK(tailbatch::streaming_latency(llm, 1).total_ms == Approx(200.0));
  CHECK(tailbatch::streaming_latency(llm, 1).streaming_speedup == Approx(1.0));
  CHECK(tailbatch::streaming_latency(llm, 1001).total_ms == Approx(200.0 + 1000 * 20.0));

  CHECK_INVALID(tailbatch::streaming_latency(llm, 0), "tokens");
  CHECK_INVALID(tailbatch::streaming_latency({120.0, 80.0, 0.0}, 100), "tokens_per_s");
  CHECK_INVALID(tailbatch::streaming_latency({-1.0, 80.0, 50.0}, 100), "prefill_ms");
  CHECK_INVALID(tailbatch::streaming_latency({0.0, 0.0, 50.0}, 100), "first_token_ms");
}
