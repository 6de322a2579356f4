// Batch policies as pure decision objects: each is fed views at chosen times (no clock,
// no threads), so every window, size and deadline rule is checked exactly.
#include <tailbatch/batch_window.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

const BatchTime t0 = BatchTime(std::chrono::hours(1));

std::vector<BatchCandidate> arrivals(std::initializer_list<BatchDuration> offsets) {
  std::vector<BatchCandidate> v;
  for (auto d : offsets) v.push_back(BatchCandidate{t0 + d, BatchTime::max(), 1, Priority::normal});
  return v;
}

BatchView view(const std::vector<BatchCandidate>& c, BatchTime now, bool flush = false) {
  return BatchView{std::span<const BatchCandidate>(c), c.size(), now, flush};
}

template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("FixedWindow: empty queue waits for the first arrival") {
  FixedWindow w(4, 5ms);
  std::vector<BatchCandidate> none;
  const BatchDecision d = w.decide(view(none, t0));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == BatchTime::max());
  CHECK(d.decide_again_at_queued == 1);
}

TEST_CASE("FixedWindow: the size trigger dispatches max_batch at once") {
  FixedWindow w(4, 5ms);
  auto c = arrivals({0ms, 1ms, 1ms, 2ms});
  const BatchDecision d = w.decide(view(c, t0 + 2ms));
  CHECK(d.count == 4);
  CHECK(d.reason == DispatchReason::size);
}

TEST_CASE("FixedWindow: the window opens at the batch's first request and closes max_wait later") {
  FixedWindow w(8, 5ms);
  auto c = arrivals({1ms, 2ms, 4ms});
  BatchDecision d = w.decide(view(c, t0 + 4ms));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == t0 + 6ms);      // first arrival + max_wait
  CHECK(d.decide_again_at_queued == 8);     // or when the batch fills
  d = w.decide(view(c, t0 + 6ms - 1ns));
  CHECK(d.count == 0);
  d = w.decide(view(c, t0 + 6ms));
  CHECK(d.count == 3);
  CHECK(d.reason == DispatchReason::window);
}

TEST_CASE("FixedWindow: flush dispatches without waiting, max_wait 0 never waits") {
  FixedWindow w(8, 5ms);
  auto c = arrivals({0ms, 0ms});
  BatchDecision d = w.decide(view(c, t0, true));
  CHECK(d.count == 2);
  CHECK(d.reason == DispatchReason::flush);
  FixedWindow eager(8, 0ms);
  d = eager.decide(view(c, t0));
  CHECK(d.count == 2);
  CHECK(d.reason == DispatchReason::window);
}

TEST_CASE("FixedWindow: bad configuration names the field") {
  CHECK(invalid_argument_message([] { FixedWindow(0, 1ms); }) == "FixedWindow: max_batch must be >= 1");
  CHECK(invalid_argument_message([] { FixedWindow(4, -1ms); }) == "FixedWindow: max_wait must be >= 0");
}

TEST_CASE("PreferredSizes: dispatch at once on a preferred size or the largest") {
  PreferredSizes p({8, 4, 16, 4}, 5ms);
  CHECK(p.max_batch() == 16);
  CHECK(std::vector<std::size_t>(p.sizes().begin(), p.sizes().end()) == std::vector<std::size_t>{4, 8, 16});
  auto three = arrivals({0ms, 0ms, 0ms});
  BatchDecision d = p.decide(view(three, t0));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at_queued == 4);  // the next preferred size
  CHECK(d.decide_again_at == t0 + 5ms);
  auto four = arrivals({0ms, 0ms, 0ms, 0ms});
  d = p.decide(view(four, t0));
  CHECK(d.count == 4);
  CHECK(d.reason == DispatchReason::size);
  CHECK(d.padded_size == 0);
  auto five = arrivals({0ms, 0ms, 0ms, 0ms, 0ms});
  d = p.decide(view(five, t0));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at_queued == 8);
}

TEST_CASE("PreferredSizes: after max_wait, pad up, split, or send as is") {
  auto six = arrivals({0ms, 1ms, 1ms, 1ms, 2ms, 2ms});
  auto two = arrivals({0ms, 1ms});
  const BatchTime late = t0 + 5ms;
  SECTION("pad") {
    PreferredSizes p({4, 8, 16}, 5ms, PreferredSizes::Fill::pad);
    BatchDecision d = p.decide(view(six, late));
    CHECK(d.count == 6);
    CHECK(d.padded_size == 8);
    CHECK(d.reason == DispatchReason::window);
    d = p.decide(view(two, late));
    CHECK(d.count == 2);
    CHECK(d.padded_size == 4);
  }
  SECTION("split") {
    PreferredSizes p({4, 8, 16}, 5ms, PreferredSizes::Fill::split);
    BatchDecision d = p.decide(view(six, late));
    CHECK(d.count == 4);
    CHECK(d.padded_size == 0);
    // A remainder below the smallest size is padded up to it.
    d = p.decide(view(two, late));
    CHECK(d.count == 2);
    CHECK(d.padded_size == 4);
  }
  SECTION("exact") {
    PreferredSizes p({4, 8, 16}, 5ms, PreferredSizes::Fill::exact);
    BatchDecision d = p.decide(view(six, late));
    CHECK(d.count == 6);
    CHECK(d.padded_size == 0);
    CHECK_FALSE(p.may_pad());
  }
  SECTION("flush applies the fill rule without waiting") {
    PreferredSizes p({4, 8}, 5ms, PreferredSizes::Fill::pad);
    BatchDecision d = p.decide(view(six, t0 + 2ms, true));
    CHECK(d.count == 6);
    CHECK(d.padded_size == 8);
    CHECK(d.reason == DispatchReason::flush);
  }
}

TEST_CASE("PreferredSizes: bad configuration names the field") {
  CHECK(invalid_argument_message([] { PreferredSizes({}, 1ms); }) == "PreferredSizes: sizes must not be empty");
  CHECK(invalid_argument_message([] { PreferredSizes({0, 4}, 1ms); }) == "PreferredSizes: sizes must be >= 1");
  CHECK(invalid_argument_message([] { PreferredSizes({4}, -1ms); }) == "PreferredSizes: max_wait must be >= 0");
}

TEST_CASE("TokenBudget: closes when max_len x batch would exceed the budget") {
  TokenBudget p({.budget = 100, .max_batch = 16, .max_wait = 5ms, .bucket_bounds = {}});
  std::vector<BatchCandidate> c;
  for (std::size_t len : {20, 30, 25, 10}) c.push_back(BatchCandidate{t0, BatchTime::max(), len, Priority::normal});
  // 1x20, 2x30, 3x30 = 90 fit; a fourth makes 4x30 = 120 > 100.
  BatchDecision d = p.decide(view(c, t0));
  CHECK(d.count == 3);
  CHECK(d.reason == DispatchReason::token_budget);
  // Three that fit, window still open: wait for more or for the window.
  c.pop_back();
  d = p.decide(view(c, t0 + 1ms));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == t0 + 5ms);
  CHECK(d.decide_again_at_queued == 4);
  d = p.decide(view(c, t0 + 5ms));
  CHECK(d.count == 3);
  CHECK(d.reason == DispatchReason::window);
}

TEST_CASE("TokenBudget: max_batch caps short requests") {
  TokenBudget p({.budget = 1000, .max_batch = 4, .max_wait = 5ms, .bucket_bounds = {}});
  std::vector<BatchCandidate> c(6, BatchCandidate{t0, BatchTime::max(), 2, Priority::normal});
  c.resize(4);
  const BatchDecision d = p.decide(view(c, t0));
  CHECK(d.count == 4);
  CHECK(d.reason == DispatchReason::size);
}

TEST_CASE("TokenBudget: power-of-two buckets by default, explicit bounds otherwise") {
  TokenBudget p({.budget = 512, .max_batch = 64, .max_wait = 5ms, .bucket_bounds = {}});
  CHECK(p.max_cost() == 512);
  CHECK(p.bucket_of(1) == 0);
  CHECK(p.bucket_of(2) == 1);
  CHECK(p.bucket_of(3) == 2);
  CHECK(p.bucket_of(4) == 2);
  CHECK(p.bucket_of(5) == 3);
  CHECK(p.bucket_of(512) == 9);
  CHECK(p.bucket_count() == 10);
  TokenBudget q({.budget = 512, .max_batch = 64, .max_wait = 5ms, .bucket_bounds = {32, 128}});
  CHECK(q.bucket_count() == 3);
  CHECK(q.bucket_of(1) == 0);
  CHECK(q.bucket_of(32) == 0);
  CHECK(q.bucket_of(33) == 1);
  CHECK(q.bucket_of(128) == 1);
  CHECK(q.bucket_of(500) == 2);
}

TEST_CASE("TokenBudget: bad configuration names the field") {
  CHECK(invalid_argument_message([] { TokenBudget({.budget = 0, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {}}); }) ==
        "TokenBudget: budget must be >= 1");
  CHECK(invalid_argument_message([] { TokenBudget({.budget = 8, .max_batch = 0, .max_wait = 1ms, .bucket_bounds = {}}); }) ==
        "TokenBudget: max_batch must be >= 1");
  CHECK(invalid_argument_message([] { TokenBudget({.budget = 8, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {8, 4}}); }) ==
        "TokenBudget: bucket_bounds must be ascending and >= 1");
}

TEST_CASE("DeadlineAware: closes when waiting for one more request would miss the tightest deadline") {
  // Cost: 10 ms for one, +2 ms per extra request. Window 20 ms.
  DeadlineAware p({.max_batch = 8, .max_wait = 20ms, .cost_estimate = LinearCost{10ms, 2ms}, .margin = 1ms});
  std::vector<BatchCandidate> c{
      {t0, t0 + 50ms, 1, Priority::normal},
      {t0, t0 + 30ms, 1, Priority::normal},
  };
  // Tightest deadline 30 ms; with 3 requests the batch takes 14 ms, margin 1 ms:
  // latest start = 30 - 14 - 1 = 15 ms, before the window's 20 ms.
  BatchDecision d = p.decide(view(c, t0 + 1ms));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == t0 + 15ms);
  CHECK(d.decide_again_if_deadline_before > t0 + 15ms);
  d = p.decide(view(c, t0 + 15ms));
  CHECK(d.count == 2);
  CHECK(d.reason == DispatchReason::deadline);
  CHECK(p.estimate(3) == 14ms);
}

TEST_CASE("DeadlineAware: without deadlines it is a fixed window, and orders EDF") {
  DeadlineAware p({.max_batch = 4, .max_wait = 5ms, .cost_estimate = LinearCost{1ms, 0ms}, .margin = 0ms});
  CHECK(p.order() == BatchOrder::earliest_deadline);
  auto c = arrivals({0ms, 1ms});
  BatchDecision d = p.decide(view(c, t0 + 1ms));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == t0 + 5ms);
  d = p.decide(view(c, t0 + 5ms));
  CHECK(d.reason == DispatchReason::window);
  auto full = arrivals({0ms, 0ms, 0ms, 0ms});
  CHECK(p.decide(view(full, t0)).reason == DispatchReason::size);
}

TEST_CASE("DeadlineAware: bad configuration names the field") {
  CHECK(invalid_argument_message([] { DeadlineAware({.max_batch = 4, .max_wait = 1ms, .cost_estimate = {}, .margin = 0ms}); }) ==
        "DeadlineAware: cost_estimate must be set");
  CHECK(invalid_argument_message([] {
          DeadlineAware({.max_batch = 0, .max_wait = 1ms, .cost_estimate = LinearCost{}, .margin = 0ms});
        }) == "DeadlineAware: max_batch must be >= 1");
  CHECK(invalid_argument_message([] {
          DeadlineAware({.max_batch = 4, .max_wait = 1ms, .cost_estimate = LinearCost{}, .margin = -1ms});
        }) == "DeadlineAware: margin must be >= 0");
}

TEST_CASE("Reason and priority names are stable") {
  CHECK(std::string(to_string(DispatchReason::token_budget)) == "token_budget");
  CHECK(std::string(to_string(DispatchReason::flush)) == "flush");
  CHECK(std::string(to_string(Priority::low)) == "low");
}
