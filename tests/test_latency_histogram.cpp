// LatencyHistogram, HistogramSnapshot and RollingHistogram: accuracy against exact
// nearest-rank percentiles, edge cases, merge/reset, the rolling window on ManualClock,
// coordinated-omission back-fill, and concurrent recording with threads coming and going.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/metrics.hpp>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::LatencyHistogramConfig;
using tailbatch::HistogramSnapshot;
using tailbatch::LatencyHistogram;
using tailbatch::ManualClock;
using tailbatch::RollingHistogram;
using ns = std::chrono::nanoseconds;

namespace {

constexpr int slowdown = tailbatch::test::sanitizer_slowdown;

// The reference definition: the r-th smallest value, r = ceil(p * n / 100), at least 1.
std::int64_t exact_percentile(const std::vector<std::int64_t>& sorted, double p) {
  const auto n = sorted.size();
  double r = std::ceil(p * static_cast<double>(n) / 100.0);
  if (r < 1) r = 1;
  if (r > static_cast<double>(n)) r = static_cast<double>(n);
  return sorted[static_cast<std::size_t>(r) - 1];
}

std::vector<double> probe_percentiles() {
  std::vector<double> ps;
  for (int i = 0; i <= 1000; ++i) ps.push_back(i / 10.0);  // 0, 0.1, ..., 100
  for (double p : {99.95, 99.99, 99.995, 99.999, 99.9999, 0.001, 0.0001}) ps.push_back(p);
  return ps;
}

// Records `values` into a histogram with `options` and checks every probe percentile, min,
// max and mean against the sorted values.
void check_accuracy(std::vector<std::int64_t> values, const LatencyHistogramConfig& options, double bound) {
  LatencyHistogram h(options);
  long double sum = 0;
  for (auto v : values) {
    h.record(ns(v));
    sum += static_cast<long double>(v);
  }
  std::sort(values.begin(), values.end());
  const HistogramSnapshot s = h.snapshot();
  REQUIRE(s.count() == values.size());
  REQUIRE(s.underflow_count() == 0);
  REQUIRE(s.overflow_count() == 0);
  REQUIRE(s.min().count() == values.front());
  REQUIRE(s.max().count() == values.back());
  const auto exact_mean = static_cast<double>(sum / static_cast<long double>(values.size()));
  REQUIRE(std::abs(static_cast<double>(s.mean().count()) - exact_mean) <= 0.5 + 1e-9 * exact_mean);
  REQUIRE(std::abs(s.sum_seconds() - static_cast<double>(sum / 1e9L)) <= 1e-12 * static_cast<double>(sum / 1e9L));

  const auto ps = probe_percentiles();
  std::vector<ns> got(ps.size());
  s.percentiles(ps, got);
  double worst = 0;
  double worst_p = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto exact = static_cast<double>(exact_percentile(values, ps[i]));
    const double err = std::abs(static_cast<double>(got[i].count()) - exact) / exact;
    if (err > worst) {
      worst = err;
      worst_p = ps[i];
    }
    REQUIRE(got[i] == s.percentile(ps[i]));
  }
  INFO("worst relative error " << worst << " at p" << worst_p << ", bound " << bound);
  REQUIRE(worst <= bound);
  REQUIRE(worst <= s.max_relative_error());
}

std::size_t accuracy_samples() { return 1'000'000 / slowdown; }

std::vector<std::int64_t> clamp_to_default_range(std::vector<double> xs) {
  std::vector<std::int64_t> out;
  out.reserve(xs.size());
  for (double x : xs) out.push_back(std::clamp<std::int64_t>(std::llround(x), 1'000, 100'000'000'000));
  return out;
}

std::vector<std::int64_t> lognormal_samples(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(std::log(2e6), 1.0);  // median 2 ms, long tail
  std::vector<double> xs(accuracy_samples());
  for (auto& x : xs) x = d(rng);
  return clamp_to_default_range(std::move(xs));
}

std::vector<std::int64_t> bimodal_samples(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution slow(0.3);
  std::normal_distribution<double> fast_mode(1e6, 1e5);   // 1 ms +- 0.1 ms
  std::normal_distribution<double> slow_mode(5e7, 5e6);   // 50 ms +- 5 ms
  std::vector<double> xs(accuracy_samples());
  for (auto& x : xs) x = slow(rng) ? slow_mode(rng) : fast_mode(rng);
  return clamp_to_default_range(std::move(xs));
}

std::vector<std::int64_t> uniform_samples(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> d(1'000, 100'000'000);  // 1 us .. 100 ms
  std::vector<std::int64_t> xs(accuracy_samples());
  for (auto& x : xs) x = d(rng);
  return xs;
}

// Waits (bounded) until pred() holds; false on timeout.
// Requires two snapshots to agree on the count, min, max, sum, under- and overflows and
// each of these percentiles.
void require_same(const HistogramSnapshot& x, const HistogramSnapshot& y,
                  const std::vector<double>& percentiles) {
  REQUIRE(x.count() == y.count());
  REQUIRE(x.min() == y.min());
  REQUIRE(x.max() == y.max());
  REQUIRE(x.sum_seconds() == y.sum_seconds());
  REQUIRE(x.underflow_count() == y.underflow_count());
  REQUIRE(x.overflow_count() == y.overflow_count());
  for (double p : percentiles) REQUIRE(x.percentile(p) == y.percentile(p));
}

template <class Pred>
bool wait_for(std::mutex& m, std::condition_variable& cv, Pred pred) {
  std::unique_lock lock(m);
  return cv.wait_for(lock, 30s, pred);
}

}  // namespace

TEST_CASE("layout: every value lies in its bucket, midpoints within the bound", "[histogram]") {
  using tailbatch::detail::HistogramLayout;
  REQUIRE(HistogramLayout::bits_for_digits(1) == 3);
  REQUIRE(HistogramLayout::bits_for_digits(2) == 6);
  REQUIRE(HistogramLayout::bits_for_digits(3) == 9);
  REQUIRE(HistogramLayout::bits_for_digits(4) == 13);
  for (int digits = 1; digits <= 3; ++digits) {
    const HistogramLayout l(1, std::uint64_t{1} << 40, HistogramLayout::bits_for_digits(digits));
    std::mt19937_64 rng(digits);
    std::uint64_t prev_high = 0;
    for (std::size_t s = 0; s < l.size(); ++s) {  // slots tile the range without gaps
      if (s > 0) REQUIRE(l.slot_low(s) == prev_high + 1);
      REQUIRE(l.slot_low(s) <= l.slot_mid(s));
      REQUIRE(l.slot_mid(s) <= l.slot_high(s));
      prev_high = l.slot_high(s);
    }
    REQUIRE(prev_high == l.highest());
    for (int i = 0; i < 100'000; ++i) {
      const std::uint64_t v = 1 + rng() % l.highest();
      const std::size_t s = l.slot(v);
      REQUIRE(l.slot_low(s) <= v);
      REQUIRE(v <= l.slot_high(s));
      const double err = std::abs(static_cast<double>(l.slot_mid(s)) - static_cast<double>(v)) / static_cast<double>(v);
      REQUIRE(err <= l.max_relative_error());
      REQUIRE(err < std::pow(10.0, -digits));
    }
  }
}

TEST_CASE("accuracy: every percentile within 1 % at 2 digits, 0.1 % at 3 digits", "[histogram][accuracy]") {
  LatencyHistogramConfig two{};
  LatencyHistogramConfig three{};
  three.significant_digits = 3;
  SECTION("lognormal") {
    check_accuracy(lognormal_samples(1), two, 0.01);
    check_accuracy(lognormal_samples(2), three, 0.001);
  }
  SECTION("bimodal") {
    check_accuracy(bimodal_samples(3), two, 0.01);
    check_accuracy(bimodal_samples(4), three, 0.001);
  }
  SECTION("uniform") {
    check_accuracy(uniform_samples(5), two, 0.01);
    check_accuracy(uniform_samples(6), three, 0.001);
  }
}

TEST_CASE("memory per shard at the default precision is at most 16 KB", "[histogram]") {
  LatencyHistogram h;
  INFO("shard_bytes = " << h.shard_bytes() << ", buckets = " << h.bucket_count());
  REQUIRE(h.shard_bytes() <= 16 * 1024);
  REQUIRE(h.bucket_count() * sizeof(std::uint64_t) <= h.shard_bytes());
  LatencyHistogramConfig three{};
  three.significant_digits = 3;
  REQUIRE(LatencyHistogram(three).shard_bytes() > h.shard_bytes());
  REQUIRE(h.shard_count() == 0);  // nothing allocated per thread until a thread records
}

TEST_CASE("empty and single-value histograms", "[histogram]") {
  LatencyHistogram h;
  const auto empty = h.snapshot();
  REQUIRE(empty.count() == 0);
  REQUIRE(empty.min() == 0ns);
  REQUIRE(empty.max() == 0ns);
  REQUIRE(empty.mean() == 0ns);
  REQUIRE(empty.sum_seconds() == 0.0);
  REQUIRE(empty.percentile(50) == 0ns);
  REQUIRE(HistogramSnapshot().percentile(99) == 0ns);

  h.record(1234567ns);
  const auto one = h.snapshot();
  REQUIRE(one.count() == 1);
  for (double p : {0.0, 1.0, 50.0, 99.0, 99.9, 100.0}) REQUIRE(one.percentile(p) == 1234567ns);
  REQUIRE(one.min() == 1234567ns);
  REQUIRE(one.max() == 1234567ns);
  REQUIRE(one.mean() == 1234567ns);
  REQUIRE(one.sum_seconds() == Approx(0.001234567));
}

TEST_CASE("durations of any type; out-of-range values are clamped and counted", "[histogram]") {
  LatencyHistogram h;  // 1 us .. 100 s
  h.record(0ns);
  h.record(-5ms);
  h.record(999ns);
  h.record(std::chrono::duration<double>(std::nan("")));
  h.record(std::chrono::duration<double, std::milli>(2.5));  // 2.5 ms, in range
  h.record(3us);
  h.record(101s);
  h.record(std::chrono::hours(24 * 365 * 1000));
  h.record(std::chrono::duration<double>(std::numeric_limits<double>::infinity()));
  h.record(std::chrono::duration<std::uint32_t, std::micro>(7));  // unsigned rep
  const auto s = h.snapshot();
  REQUIRE(s.count() == 10);
  REQUIRE(s.underflow_count() == 4);
  REQUIRE(s.overflow_count() == 3);
  REQUIRE(s.min() == 1us);
  REQUIRE(s.max() == 100s);
  REQUIRE(s.percentile(0) == 1us);
  REQUIRE(s.percentile(100) == 100s);
  // Sorted: 1, 1, 1, 1, 3, 7 us, 2.5 ms, 100 s, 100 s, 100 s.
  REQUIRE(s.percentile(50).count() == Approx(3e3).epsilon(0.01));
  REQUIRE(s.percentile(70).count() == Approx(2.5e6).epsilon(0.01));
  REQUIRE(s.percentile(-3) == s.percentile(0));
  REQUIRE(s.percentile(250) == s.percentile(100));
  REQUIRE(s.percentile(std::nan("")) == s.percentile(0));
  // The clamped values make up the sum: 4 x 1 us + 2.5 ms + 3 us + 7 us + 3 x 100 s.
  REQUIRE(s.sum_seconds() == Approx(4e-6 + 2.5e-3 + 3e-6 + 7e-6 + 300.0).epsilon(1e-12));
}

TEST_CASE("bad options throw std::invalid_argument naming the field", "[histogram]") {
  auto message_of = [](auto make) -> std::string {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  LatencyHistogramConfig o;
  o.lowest = 0ns;
  CHECK_THAT(message_of([&] { LatencyHistogram h(o); }), Catch::Contains("LatencyHistogram") && Catch::Contains("lowest"));
  o = {};
  o.highest = 1500ns;  // < 2 * lowest
  CHECK_THAT(message_of([&] { LatencyHistogram h(o); }), Catch::Contains("highest"));
  o = {};
  o.highest = std::chrono::hours(24 * 365 * 200);
  CHECK_THAT(message_of([&] { LatencyHistogram h(o); }), Catch::Contains("highest"));
  for (int digits : {0, 5, -1}) {
    o = {};
    o.significant_digits = digits;
    CHECK_THAT(message_of([&] { LatencyHistogram h(o); }), Catch::Contains("significant_digits"));
    CHECK_THAT(message_of([&] { HistogramSnapshot s(o); }),
               Catch::Contains("HistogramSnapshot") && Catch::Contains("significant_digits"));
  }
  CHECK_THAT(message_of([] { RollingHistogram<ManualClock> r(0s, 10, {}, ManualClock{}); }), Catch::Contains("window"));
  CHECK_THAT(message_of([] { RollingHistogram<ManualClock> r(10s, 0, {}, ManualClock{}); }), Catch::Contains("slots"));
  CHECK_THAT(message_of([] { RollingHistogram<ManualClock> r(5ns, 10, {}, ManualClock{}); }), Catch::Contains("window"));
  o = {};
  o.significant_digits = 9;
  CHECK_THAT(message_of([&] { RollingHistogram<ManualClock> r(10s, 10, o, ManualClock{}); }),
             Catch::Contains("RollingHistogram") && Catch::Contains("significant_digits"));
}

TEST_CASE("config errors name the LatencyHistogramConfig field, as it is spelled", "[histogram]") {
  LatencyHistogramConfig o;
  o.lowest = 0ns;
  CHECK_THROWS_MATCHES(
      LatencyHistogram(o), std::invalid_argument,
      MessageIs("LatencyHistogram: LatencyHistogramConfig::lowest must be >= 1ns"));
  o = {};
  o.highest = 1500ns;
  CHECK_THROWS_MATCHES(
      HistogramSnapshot(o), std::invalid_argument,
      MessageIs("HistogramSnapshot: LatencyHistogramConfig::highest must be >= 2 * lowest"));
  o = {};
  o.significant_digits = 5;
  CHECK_THROWS_MATCHES(
      RollingHistogram<ManualClock>(10s, 10, o, ManualClock{}), std::invalid_argument,
      MessageIs("RollingHistogram: LatencyHistogramConfig::significant_digits must be in [1, 4]"));
  // A registry's histogram is a LatencyHistogram, and says so.
  tailbatch::MetricsRegistry registry;
  CHECK_THROWS_MATCHES(
      registry.histogram("h_seconds", "h", {}, o), std::invalid_argument,
      MessageIs("LatencyHistogram: LatencyHistogramConfig::significant_digits must be in [1, 4]"));
  // Merging histograms of different configs names what differs.
  LatencyHistogramConfig three;
  three.significant_digits = 3;
  HistogramSnapshot fixed{LatencyHistogramConfig{}};
  CHECK_THROWS_MATCHES(fixed.merge(LatencyHistogram(three).snapshot()), std::invalid_argument,
                       MessageIs("HistogramSnapshot::merge: the configs differ"));
}

TEST_CASE("merge: two halves merge into the whole; differing options throw", "[histogram]") {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> d(std::log(5e5), 1.5);
  LatencyHistogram whole, a, b;
  for (int i = 0; i < 100'000; ++i) {
    const ns v(static_cast<std::int64_t>(d(rng)));
    whole.record(v);
    (i % 3 == 0 ? a : b).record(v);
  }
  HistogramSnapshot merged = a.snapshot();
  merged.merge(b.snapshot());
  const HistogramSnapshot w = whole.snapshot();
  require_same(merged, w, probe_percentiles());
  REQUIRE(merged.mean() == w.mean());

  // merge_into gives the same as merging snapshots.
  HistogramSnapshot into;
  a.merge_into(into);
  b.merge_into(into);
  REQUIRE(into.count() == w.count());
  REQUIRE(into.percentile(99) == w.percentile(99));

  // A default snapshot adopts the first options it sees; after that, options must match.
  LatencyHistogramConfig three;
  three.significant_digits = 3;
  LatencyHistogram precise(three);
  precise.record(5ms);
  HistogramSnapshot adopt;
  adopt.merge(precise.snapshot());
  REQUIRE(adopt.config() == three);
  REQUIRE(adopt.count() == 1);
  REQUIRE_THROWS_AS(merged.merge(precise.snapshot()), std::invalid_argument);
  REQUIRE_THROWS_AS(precise.merge_into(merged), std::invalid_argument);
  REQUIRE(merged.count() == w.count());  // unchanged by the failed merges
  HistogramSnapshot fixed(LatencyHistogramConfig{});
  REQUIRE_THROWS_AS(fixed.merge(precise.snapshot()), std::invalid_argument);
}

TEST_CASE("reset forgets earlier values; later ones count", "[histogram]") {
  LatencyHistogram h;
  for (int i = 0; i < 1000; ++i) h.record(50ms);
  h.record(1ns);  // an underflow
  h.reset();
  const auto cleared = h.snapshot();
  REQUIRE(cleared.count() == 0);
  REQUIRE(cleared.underflow_count() == 0);
  REQUIRE(cleared.sum_seconds() == 0.0);
  REQUIRE(cleared.max() == 0ns);
  h.record(2ms);
  h.record(3ms);
  const auto after = h.snapshot();
  REQUIRE(after.count() == 2);
  REQUIRE(after.min() == 2ms);
  REQUIRE(after.max() == 3ms);
  REQUIRE(after.mean() == 2500us);
  REQUIRE(after.percentile(100) == 3ms);
}

TEST_CASE("percentiles() answers in any order, with duplicates, in one pass", "[histogram]") {
  LatencyHistogram h;
  for (int i = 1; i <= 10'000; ++i) h.record(std::chrono::microseconds(i));
  const auto s = h.snapshot();
  const std::vector<double> ps = {99.9, 50, 0, 99, 50, 100, 90, 25.5, 99.9, 1};
  std::vector<ns> out(ps.size());
  s.percentiles(ps, out);
  for (std::size_t i = 0; i < ps.size(); ++i) REQUIRE(out[i] == s.percentile(ps[i]));
  REQUIRE(out[2] == 1us);
  REQUIRE(out[5] == 10ms);
  // out shorter than ps: only out.size() answers are written.
  std::vector<ns> two(2, ns(-1));
  s.percentiles(ps, two);
  REQUIRE(two[0] == s.percentile(99.9));
  REQUIRE(two[1] == s.percentile(50));
}

TEST_CASE("record_corrected back-fills expected intervals (coordinated omission)", "[histogram]") {
  SECTION("the textbook case: one 100 ms stall with a request expected every 10 ms") {
    LatencyHistogram h;
    h.record_corrected(100ms, 10ms);
    const auto s = h.snapshot();
    REQUIRE(s.count() == 10);  // 100, 90, ..., 10 ms
    REQUIRE(s.min() == 10ms);
    REQUIRE(s.max() == 100ms);
    REQUIRE(s.mean() == 55ms);
    REQUIRE(s.percentile(50).count() == Approx(50e6).epsilon(0.01));
    h.record_corrected(5ms, 10ms);  // shorter than the interval: nothing to back-fill
    h.record_corrected(5ms, 0ns);   // no interval: a plain record
    REQUIRE(h.snapshot().count() == 12);
  }
  SECTION("the same as recording each missing value, including clamping") {
    LatencyHistogramConfig o;
    o.lowest = 1us;
    o.highest = 1s;
    std::mt19937_64 rng(7);
    for (int round = 0; round < 200; ++round) {
      LatencyHistogram fast(o), slow(o);
      const std::int64_t value = std::uniform_int_distribution<std::int64_t>(1, 3'000'000'000)(rng);
      const std::int64_t interval = std::uniform_int_distribution<std::int64_t>(
          std::max<std::int64_t>(1, value / 20'000), std::max<std::int64_t>(2, value))(rng);
      fast.record_corrected(ns(value), ns(interval));
      slow.record(ns(value));
      for (std::int64_t missing = value - interval; missing >= interval; missing -= interval) slow.record(ns(missing));
      const auto f = fast.snapshot();
      const auto s = slow.snapshot();
      INFO("value " << value << " interval " << interval);
      require_same(f, s, {0.0, 10.0, 50.0, 75.0, 90.0, 99.0, 99.9, 100.0});
    }
  }
  SECTION("a huge back-fill is cheap and its sum stays exact beyond 2^64 ns") {
    LatencyHistogramConfig o;
    o.lowest = 1ns;
    LatencyHistogram h(o);
    constexpr std::int64_t v = 100'000'000'000;  // 100 s, back-filled every 1 ns: 10^11 values
    h.record_corrected(ns(v), 1ns);
    const auto s = h.snapshot();
    REQUIRE(s.count() == static_cast<std::uint64_t>(v));  // v, v-1, ..., 1
    REQUIRE(s.min() == 1ns);
    REQUIRE(s.max() == ns(v));
    // The exact sum is v(v+1)/2 ns = 5.00000000005e21 ns, far beyond 2^64 ns (1.8e19).
    REQUIRE(s.sum_seconds() == Approx(5.00000000005e12).epsilon(1e-12));
    REQUIRE(std::abs(s.mean().count() - v / 2) <= 1);
    REQUIRE(s.percentile(50).count() == Approx(v / 2.0).epsilon(0.01));
  }
}

TEST_CASE("rolling window on ManualClock: p95 over the last 10 s", "[histogram][rolling]") {
  ManualClock clock;
  RollingHistogram<ManualClock> r(10s, 10, {}, clock);
  REQUIRE(r.window() == 10s);
  REQUIRE(r.slots() == 10);
  REQUIRE(r.snapshot().count() == 0);

  // t = 0..1 s: a slow burst.
  for (int i = 0; i < 100; ++i) r.record(200ms);
  clock.advance(1s);
  // t = 1..10 s: fast traffic, 100 samples a second.
  for (int sec = 1; sec < 10; ++sec) {
    for (int i = 0; i < 100; ++i) r.record(2ms);
    clock.advance(1s);
  }
  // Now t = 10 s: the slot of t = 0 has left the window.
  auto s = r.snapshot();
  REQUIRE(s.count() == 900);
  REQUIRE(s.max() == 2ms);

  // The boundary, on a fresh window: the burst stays in until its slot is a window old.
  ManualClock clock2;
  RollingHistogram<ManualClock> r2(10s, 10, {}, clock2);
  for (int i = 0; i < 100; ++i) r2.record(200ms);
  clock2.advance(1s);
  for (int i = 0; i < 900; ++i) r2.record(2ms);
  s = r2.snapshot();
  REQUIRE(s.count() == 1000);
  REQUIRE(s.percentile(95).count() == Approx(200e6).epsilon(0.01));  // the burst dominates p95
  clock2.advance(8s + 999ms);  // t = 9.999 s: the burst's slot [0, 1 s) is still the oldest one
  REQUIRE(r2.snapshot().count() == 1000);
  clock2.advance(1ms);  // t = 10 s: it has left
  s = r2.snapshot();
  REQUIRE(s.count() == 900);
  REQUIRE(s.percentile(95).count() == Approx(2e6).epsilon(0.01));
  // A slot is cleared when the ring comes round to it, and old data never reappears.
  r2.record(7ms);  // lands in the slot that held the burst
  s = r2.snapshot();
  REQUIRE(s.count() == 901);
  REQUIRE(s.max() == 7ms);
  clock2.advance(100s);  // everything is older than the window
  REQUIRE(r2.snapshot().count() == 0);
  r2.record(1ms);
  REQUIRE(r2.snapshot().count() == 1);
  r2.reset();
  REQUIRE(r2.snapshot().count() == 0);
}

TEST_CASE("rolling window: several threads record while the clock moves", "[histogram][rolling][threads]") {
  ManualClock clock;
  RollingHistogram<ManualClock> r(1s, 4, {}, clock);
  const int per_thread = 20'000 / slowdown;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < per_thread; ++i) r.record(1ms);
    });
  }
  go = true;
  for (int i = 0; i < 50; ++i) {
    clock.advance(100ms);
    (void)r.snapshot();
  }
  for (auto& t : threads) t.join();
  REQUIRE(r.snapshot().count() <= static_cast<std::uint64_t>(3 * per_thread));
  clock.advance(10s);
  REQUIRE(r.snapshot().count() == 0);
}

TEST_CASE("concurrent recording from 1, 2, 3, 7 and 16 threads loses nothing", "[histogram][threads]") {
  for (int threads : {1, 2, 3, 7, 16}) {
    DYNAMIC_SECTION(threads << " threads") {
      LatencyHistogram h;
      const int per_thread = 400'000 / threads / slowdown;
      std::atomic<int> ready{0};
      std::atomic<bool> done{false};
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          ready.fetch_add(1);
          while (ready.load() < threads) std::this_thread::yield();
          // Thread t records values 1..per_thread microseconds, plus t ns so threads differ.
          for (int i = 1; i <= per_thread; ++i) h.record(ns(std::int64_t{i} * 1000 + t));
        });
      }
      // A reader takes snapshots throughout: counts only grow.
      std::thread reader([&] {
        std::uint64_t last = 0;
        while (!done.load()) {
          const auto c = h.snapshot().count();
          CHECK(c >= last);
          last = c;
          std::this_thread::yield();
        }
      });
      for (auto& w : workers) w.join();
      done = true;
      reader.join();
      const auto s = h.snapshot();
      const auto n = static_cast<std::uint64_t>(per_thread);
      REQUIRE(s.count() == n * static_cast<std::uint64_t>(threads));
      // Exact sum: each thread adds 1000 * n(n+1)/2 + t * n.
      long double expected = 0;
      for (int t = 0; t < threads; ++t)
        expected += 1000.0L * static_cast<long double>(n * (n + 1) / 2) + static_cast<long double>(t) * static_cast<long double>(n);
      REQUIRE(s.sum_seconds() == Approx(static_cast<double>(expected / 1e9L)).epsilon(1e-12));
      REQUIRE(s.min() == 1us);
      REQUIRE(s.max() == ns(static_cast<std::int64_t>(per_thread) * 1000 + threads - 1));
      REQUIRE(h.shard_count() <= static_cast<std::size_t>(threads));
    }
  }
}

TEST_CASE("exited threads hand their shards on; counts survive", "[histogram][threads]") {
  LatencyHistogram h;
  const int rounds = 20 / (slowdown > 1 ? 4 : 1);
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> batch;
    for (int t = 0; t < 4; ++t) {
      batch.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) h.record(1ms);
      });
    }
    for (auto& t : batch) t.join();
  }
  REQUIRE(h.snapshot().count() == static_cast<std::uint64_t>(rounds) * 4 * 1000);
  REQUIRE(h.shard_count() <= 4);  // reused, not one per thread ever started
}

TEST_CASE("histograms die and are born while threads keep recording", "[histogram][threads]") {
  // Long-lived threads record into a histogram; it is destroyed and a new one (likely at
  // the same address) created; the same threads record again. Stale per-thread cache
  // entries must never match the new histogram (ASan would catch a use-after-free).
  std::mutex m;
  std::condition_variable cv;
  int phase = 0;         // guarded by m: which histogram generation to record into
  int finished = 0;      // guarded by m: threads done with the current phase
  LatencyHistogram* current = nullptr;
  constexpr int threads = 3;
  constexpr int phases = 6;
  const int per_phase = 5000 / slowdown;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int p = 1; p <= phases; ++p) {
        LatencyHistogram* h = nullptr;
        {
          std::unique_lock lock(m);
          if (!cv.wait_for(lock, 30s, [&] { return phase >= p; })) return;
          h = current;
        }
        for (int i = 0; i < per_phase; ++i) h->record(ns(1000 + i));
        {
          std::lock_guard lock(m);
          ++finished;
        }
        cv.notify_all();
      }
      // Stay alive until the last check: an exiting thread hands its shard on.
      std::unique_lock lock(m);
      (void)cv.wait_for(lock, 30s, [&] { return phase > phases; });
    });
  }
  for (int p = 1; p <= phases; ++p) {
    auto h = std::make_unique<LatencyHistogram>();
    {
      std::lock_guard lock(m);
      current = h.get();
      finished = 0;
      phase = p;
    }
    cv.notify_all();
    // CHECK, not REQUIRE: a throw here would abandon joinable threads.
    const bool all_finished = wait_for(m, cv, [&] { return finished == threads; });
    CHECK(all_finished);
    if (!all_finished) break;
    CHECK(h->snapshot().count() == static_cast<std::uint64_t>(threads * per_phase));
    CHECK(h->shard_count() == static_cast<std::size_t>(threads));
    // h dies here while the workers are alive and still hold cache entries for it.
  }
  {
    std::lock_guard lock(m);
    phase = phases + 1;
  }
  cv.notify_all();
  for (auto& w : workers) w.join();
}

TEST_CASE("one thread records into many histograms at once", "[histogram]") {
  // More histograms than cache ways: entries collide and are found again on the slow path.
  std::vector<std::unique_ptr<LatencyHistogram>> hs;
  for (int i = 0; i < 40; ++i) hs.push_back(std::make_unique<LatencyHistogram>());
  for (int round = 0; round < 50; ++round)
    for (std::size_t i = 0; i < hs.size(); ++i) hs[i]->record(ns(1000 * static_cast<std::int64_t>(i + 1)));
  for (std::size_t i = 0; i < hs.size(); ++i) {
    const auto s = hs[i]->snapshot();
    REQUIRE(s.count() == 50);
    REQUIRE(s.min() == ns(1000 * static_cast<std::int64_t>(i + 1)));
    INFO("histogram " << i);
    REQUIRE(hs[i]->shard_count() == 1);
  }
  // Many short-lived histograms: the thread's list of borrowed shards stays pruned.
  for (int i = 0; i < 2000 / slowdown; ++i) {
    LatencyHistogram h;
    h.record(1ms);
    REQUIRE(h.snapshot().count() == 1);
  }
}

namespace {
struct RecordsOnThreadExit {
  LatencyHistogram* h;
  ~RecordsOnThreadExit() { h->record(9ms); }
};
}  // namespace

TEST_CASE("recording from a thread_local destructor after the shard list is gone", "[histogram][threads]") {
  LatencyHistogram h;
  std::thread t([&] {
    // Constructed before the thread's shard list, so destroyed after it: its record takes
    // the locked fallback path.
    thread_local RecordsOnThreadExit late{&h};
    (void)late;
    h.record(1ms);
  });
  t.join();
  const auto s = h.snapshot();
  REQUIRE(s.count() == 2);
  REQUIRE(s.max() == 9ms);
}

TEST_CASE("reset racing with recorders never shows a negative or resurrected count", "[histogram][threads]") {
  LatencyHistogram h;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> recorded{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; ++t) {
    workers.emplace_back([&] {
      h.record(2ms);
      std::uint64_t mine = 1;
      recorded.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        h.record(2ms);
        ++mine;
      }
      recorded.fetch_add(mine - 1);
    });
  }
  // Bounded wait until every worker is recording (the machine may be busy).
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (recorded.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  const int resets = 200 / slowdown;
  for (int i = 0; i < resets; ++i) {
    h.reset();
    const auto s = h.snapshot();
    CHECK(s.count() < (std::uint64_t{1} << 40));  // a baseline above the counts would wrap
    // Exact, or (when the snapshot caught a record between its count and its min) the
    // bound of the bucket that holds it.
    if (s.count() > 0) CHECK(s.min().count() == Approx(2e6).epsilon(0.01));
  }
  stop = true;
  for (auto& w : workers) w.join();
  CHECK(recorded.load() >= 3);
  h.reset();
  REQUIRE(h.snapshot().count() == 0);
  for (int i = 0; i < 5; ++i) h.record(3ms);
  const auto s = h.snapshot();
  REQUIRE(s.count() == 5);
  REQUIRE(s.mean() == 3ms);
}

TEST_CASE("RollingHistogram on the steady clock", "[histogram][rolling]") {
  RollingHistogram<> r(std::chrono::hours(1));  // wide enough that this test never sees a rotation edge
  r.record(4ms);
  r.record(std::chrono::duration<double, std::milli>(6.0));
  const auto s = r.snapshot();
  REQUIRE(s.count() == 2);
  REQUIRE(s.mean() == 5ms);
  REQUIRE(r.config() == LatencyHistogramConfig{});
}

TEST_CASE("snapshots are values: copies are independent, merged sums carry past 2^64", "[histogram]") {
  LatencyHistogramConfig o;
  o.lowest = 1ns;
  LatencyHistogram h(o);
  h.record_corrected(ns(100'000'000'000), 1ns);  // sum 5.00000000005e21 ns > 2^64
  const HistogramSnapshot a = h.snapshot();
  HistogramSnapshot b = a;
  b.merge(a);
  b.merge(a);
  REQUIRE(a.count() == 100'000'000'000u);
  REQUIRE(b.count() == 300'000'000'000u);
  REQUIRE(b.sum_seconds() == Approx(3 * 5.00000000005e12).epsilon(1e-12));
  REQUIRE(b.mean() == a.mean());
}
