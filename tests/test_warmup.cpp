// Warmup: the sizes a policy forms, every size on every lane of a poll-driven Pipeline on
// a ManualClock (checked by the model itself), readiness and its gauge, failures, and a
// threaded Pipeline end to end.
#include <tailbatch/warmup.hpp>

#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

// Every (lane, batch size) the model ran.
struct Seen {
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::size_t>> batches;
  bool fail = false;
  std::chrono::milliseconds sleep{0};
  auto model() {
    return [this](std::span<const int> in, std::span<int> out, HostLane& lane) {
      if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
      {
        std::lock_guard lock(mu);
        batches.emplace_back(lane.index(), in.size());
      }
      if (fail) throw std::runtime_error("cold model");
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] + 1;
    };
  }
  std::set<std::pair<std::size_t, std::size_t>> pairs() {
    std::lock_guard lock(mu);
    return {batches.begin(), batches.end()};
  }
};

const std::vector<int> samples = {1, 2, 3};

}  // namespace

TEST_CASE("warmup_sizes: preferred sizes, else powers of two up to max_batch and max_batch") {
  CHECK(warmup_sizes(FixedWindow(32, 1ms)) == std::vector<std::size_t>{1, 2, 4, 8, 16, 32});
  CHECK(warmup_sizes(FixedWindow(12, 1ms)) == std::vector<std::size_t>{1, 2, 4, 8, 12});
  CHECK(warmup_sizes(FixedWindow(1, 1ms)) == std::vector<std::size_t>{1});
  CHECK(warmup_sizes(PreferredSizes({16, 4, 8}, 1ms)) == std::vector<std::size_t>{4, 8, 16});
}

TEST_CASE("warmup (poll-driven): every size runs on every lane; then ready") {
  ManualClock clock;
  HostLanes lanes(3);
  Seen seen;
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock> p(seen.model(), FixedWindow(8, 5ms), {}, lanes,
                                                                      clock);
  MetricsRegistry registry;
  Readiness ready(&registry, {{"server", "test"}});
  CHECK_FALSE(ready.is_ready());
  CHECK(registry.prometheus().find("tailbatch_ready{server=\"test\"} 0") != std::string::npos);

  const WarmupReport r = warmup(p, samples, {.advance_clock = [&](BatchTime t) { clock.advance_to(t); }, .readiness = &ready});
  CHECK(r.ok());
  CHECK(r.lanes_forced);
  CHECK(r.lanes == 3);
  CHECK(r.sizes == std::vector<std::size_t>{1, 2, 4, 8});
  CHECK(r.requests == 3 * (1 + 2 + 4 + 8));
  CHECK(r.completed_ok == r.requests);
  CHECK(r.batches == 3 * 4);
  std::set<std::pair<std::size_t, std::size_t>> want;
  for (std::size_t lane = 0; lane < 3; ++lane) {
    for (std::size_t size : {1u, 2u, 4u, 8u}) want.emplace(lane, size);
  }
  CHECK(seen.pairs() == want);
  CHECK(seen.batches.size() == 12);  // one batch of each size per lane, no more
  CHECK(ready.is_ready());
  CHECK(registry.prometheus().find("tailbatch_ready{server=\"test\"} 1") != std::string::npos);
  CHECK(p.stats().count(Status::ok) == r.requests);
}

TEST_CASE("warmup (poll-driven): preferred sizes, several lane slots, two rounds") {
  ManualClock clock;
  HostLanes lanes(2, 2);
  Seen seen;
  Pipeline<int, int, PreferredSizes, HostLanes, AdmitAll, ManualClock> p(seen.model(), PreferredSizes({2, 6}, 5ms),
                                                                         {}, lanes, clock);
  const WarmupReport r = warmup(p, samples, {.rounds = 2, .advance_clock = [&](BatchTime t) { clock.advance_to(t); }});
  CHECK(r.ok());
  CHECK(r.sizes == std::vector<std::size_t>{2, 6});
  CHECK(r.requests == 2 * 2 * (2 + 6));
  CHECK(seen.pairs() == std::set<std::pair<std::size_t, std::size_t>>{{0, 2}, {0, 6}, {1, 2}, {1, 6}});
  CHECK(seen.batches.size() == 8);
}

TEST_CASE("warmup: a failing model is reported and the server is not marked ready") {
  ManualClock clock;
  Seen seen;
  seen.fail = true;
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock> p(seen.model(), FixedWindow(4, 5ms), {}, clock);
  Readiness ready;
  const WarmupReport r = warmup(p, samples, {.advance_clock = [&](BatchTime t) { clock.advance_to(t); }, .readiness = &ready});
  CHECK_FALSE(r.ok());
  CHECK(r.failed == r.requests);
  CHECK(r.first_error == "failed: cold model");
  CHECK_FALSE(ready.is_ready());
}

TEST_CASE("warmup: bad arguments name the field") {
  ManualClock clock;
  Seen seen;
  Pipeline<int, int, FixedWindow, HostLanes, AdmitAll, ManualClock> p(seen.model(), FixedWindow(4, 5ms), {}, clock);
  const std::vector<int> none;
  auto advance = [&](BatchTime t) { clock.advance_to(t); };
  CHECK_THROWS_MATCHES((void)warmup(p, none, {.advance_clock = advance}), std::invalid_argument,
                       MessageIs("warmup: samples must not be empty"));
  CHECK_THROWS_MATCHES((void)warmup(p, samples, {.sizes = {5}, .advance_clock = advance}), std::invalid_argument,
                       MessageIs("warmup: sizes must be in [1, max_batch]"));
  CHECK_THROWS_MATCHES((void)warmup(p, samples, {.rounds = 0, .advance_clock = advance}), std::invalid_argument,
                       MessageIs("warmup: rounds must be >= 1"));
  CHECK_THROWS_MATCHES((void)warmup(p, samples), std::invalid_argument,
                       MessageIs("warmup: advance_clock must be set for a Pipeline stepped by poll() on a manual clock"));
  CHECK(seen.batches.empty());
}

TEST_CASE("warmup (worker threads): every size runs, and the report adds up") {
  HostLanes lanes(2);
  Seen seen;
  seen.sleep = 2ms;
  // A window long enough that each group of requests is always submitted within it.
  Pipeline<int, int, FixedWindow, HostLanes> p(seen.model(), FixedWindow(4, 50ms), {}, lanes);
  REQUIRE(p.worker_count() == 2);
  Readiness ready;
  const WarmupReport r = warmup(p, samples, {.timeout = 30s, .readiness = &ready});
  CHECK(r.ok());
  CHECK_FALSE(r.lanes_forced);
  CHECK(r.requests == 2 * (1 + 2 + 4));
  CHECK(ready.is_ready());
  std::set<std::size_t> sizes;
  for (const auto& [lane, size] : seen.pairs()) sizes.insert(size);
  CHECK(sizes == std::set<std::size_t>{1, 2, 4});
  p.shutdown();
}
