// Batch policies as pure decision objects: each is fed views at chosen times (no clock,
// no threads), so every window, size and deadline rule is checked exactly.
#include <tailbatch/batch_window.hpp>

#include <chrono>
#include <limits>
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
  CHECK_THROWS_MATCHES(FixedWindow(0, 1ms), std::invalid_argument,
                       MessageIs("FixedWindow: max_batch must be >= 1"));
  CHECK_THROWS_MATCHES(FixedWindow(4, -1ms), std::invalid_argument,
                       MessageIs("FixedWindow: max_wait must be >= 0"));
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
  // Six waiting at the deadline, then two: (count, padded_size) under each fill rule. Split
  // pads a remainder below the smallest size up to it.
  struct Row {
    PreferredSizes::Fill fill;
    std::size_t six_count, six_padded, two_count, two_padded;
  };
  for (const Row& row :
       {Row{PreferredSizes::Fill::pad, 6, 8, 2, 4}, Row{PreferredSizes::Fill::split, 4, 0, 2, 4},
        Row{PreferredSizes::Fill::exact, 6, 0, 2, 0}}) {
    CAPTURE(static_cast<int>(row.fill));
    PreferredSizes p({4, 8, 16}, 5ms, row.fill);
    BatchDecision d = p.decide(view(six, late));
    CHECK(d.count == row.six_count);
    CHECK(d.padded_size == row.six_padded);
    CHECK(d.reason == DispatchReason::window);
    d = p.decide(view(two, late));
    CHECK(d.count == row.two_count);
    CHECK(d.padded_size == row.two_padded);
    CHECK(p.may_pad() == (row.fill != PreferredSizes::Fill::exact));
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
  CHECK_THROWS_MATCHES(PreferredSizes({}, 1ms), std::invalid_argument,
                       MessageIs("PreferredSizes: sizes must not be empty"));
  CHECK_THROWS_MATCHES(PreferredSizes({0, 4}, 1ms), std::invalid_argument,
                       MessageIs("PreferredSizes: sizes must be >= 1"));
  CHECK_THROWS_MATCHES(PreferredSizes({4}, -1ms), std::invalid_argument,
                       MessageIs("PreferredSizes: max_wait must be >= 0"));
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
  CHECK(p.bucket_count() == 10);
  TokenBudget q({.budget = 512, .max_batch = 64, .max_wait = 5ms, .bucket_bounds = {32, 128}});
  CHECK(q.bucket_count() == 3);
  // (cost, its bucket by powers of two, its bucket by the bounds 32 and 128)
  const std::size_t rows[][3] = {{1, 0, 0},  {2, 1, 0},  {3, 2, 0},   {4, 2, 0},   {5, 3, 0},
                                 {32, 5, 0}, {33, 6, 1}, {128, 7, 1}, {500, 9, 2}, {512, 9, 2}};
  for (const auto& [cost, pow2, bounded] : rows) {
    CAPTURE(cost);
    CHECK(p.bucket_of(cost) == pow2);
    CHECK(q.bucket_of(cost) == bounded);
  }
}

TEST_CASE("TokenBudget: bad configuration names the field") {
  CHECK_THROWS_MATCHES(TokenBudget({.budget = 0, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {}}), std::invalid_argument,
                       MessageIs("TokenBudget: budget must be >= 1"));
  CHECK_THROWS_MATCHES(TokenBudget({.budget = 8, .max_batch = 0, .max_wait = 1ms, .bucket_bounds = {}}), std::invalid_argument,
                       MessageIs("TokenBudget: max_batch must be >= 1"));
  CHECK_THROWS_MATCHES(TokenBudget({.budget = 8, .max_batch = 4, .max_wait = 1ms, .bucket_bounds = {8, 4}}), std::invalid_argument,
                       MessageIs("TokenBudget: bucket_bounds must be ascending and >= 1"));
}

TEST_CASE("DeadlineAware: without deadlines it is a fixed window, and orders EDF") {
  DeadlineAware p({.max_batch = 4, .max_wait = 5ms, .margin = 0ms});
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
  CHECK_THROWS_MATCHES(DeadlineAware({.max_batch = 4, .max_wait = -1ms, .margin = 0ms}), std::invalid_argument,
                       MessageIs("DeadlineAware: max_wait must be >= 0"));
  CHECK_THROWS_MATCHES(DeadlineAware({.max_batch = 0, .max_wait = 1ms, .margin = 0ms}), std::invalid_argument,
                       MessageIs("DeadlineAware: max_batch must be >= 1"));
  CHECK_THROWS_MATCHES(DeadlineAware({.max_batch = 4, .max_wait = 1ms, .margin = -1ms}), std::invalid_argument,
                       MessageIs("DeadlineAware: margin must be >= 0"));
}

TEST_CASE("DeadlineAware: a deadline is a latest start: the batch closes so that it starts by it") {
  // A deadline bounds when the batch starts, not when it completes: the close comes at the
  // tightest deadline less the margin, not earlier by the batch's running time.
  DeadlineAware p({.max_batch = 8, .max_wait = 50ms, .margin = 1ms});
  std::vector<BatchCandidate> c{
      {t0, t0 + 50ms, 1, Priority::normal},
      {t0, t0 + 30ms, 1, Priority::normal},
  };
  BatchDecision d = p.decide(view(c, t0 + 1ms));
  CHECK(d.count == 0);
  CHECK(d.decide_again_at == t0 + 29ms);  // tightest deadline 30 ms, less the 1 ms margin
  d = p.decide(view(c, t0 + 28ms));
  CHECK(d.count == 0);
  d = p.decide(view(c, t0 + 29ms));
  CHECK(d.count == 2);
  CHECK(d.reason == DispatchReason::deadline);
}

TEST_CASE("DeadlineAware: an urgent newcomer is one whose latest start comes before the wake-up") {
  DeadlineAware p({.max_batch = 8, .max_wait = 20ms, .margin = 2ms});
  std::vector<BatchCandidate> c{{t0, t0 + 100ms, 1, Priority::normal}};
  BatchDecision d = p.decide(view(c, t0));
  CHECK(d.decide_again_at == t0 + 20ms);                   // the window, before 100 - 2 ms
  CHECK(d.decide_again_if_deadline_before == t0 + 22ms);   // deadline - margin < 20 ms
  c.push_back({t0 + 1ms, t0 + 21ms, 1, Priority::normal});  // closes at 19 ms
  d = p.decide(view(c, t0 + 1ms));
  CHECK(d.decide_again_at == t0 + 19ms);
  CHECK(d.decide_again_if_deadline_before == t0 + 21ms);
  // A deadline already inside the margin goes at once; one that has passed is the
  // Pipeline's to drop, but the policy still never waits on it.
  c.push_back({t0 + 2ms, t0 + 3ms, 1, Priority::normal});
  d = p.decide(view(c, t0 + 2ms));
  CHECK(d.count == 3);
  CHECK(d.reason == DispatchReason::deadline);
}

TEST_CASE("Policies bound max_batch and name the field") {
  const std::size_t huge = static_cast<std::size_t>(-1);
  const std::size_t big = std::size_t{1} << 40;
  CHECK(max_batch_limit == 65536);
  CHECK_THROWS_MATCHES(FixedWindow(huge, 5ms), std::invalid_argument,
                       MessageIs("FixedWindow: max_batch must be <= 65536"));
  CHECK_THROWS_MATCHES(FixedWindow(big, 5ms), std::invalid_argument,
                       MessageIs("FixedWindow: max_batch must be <= 65536"));
  CHECK(FixedWindow(max_batch_limit, 5ms).max_batch() == max_batch_limit);
  CHECK_THROWS_MATCHES(PreferredSizes({4, big}, 5ms), std::invalid_argument,
                       MessageIs("PreferredSizes: sizes must be <= 65536"));
  CHECK_THROWS_MATCHES(TokenBudget({.budget = 8, .max_batch = huge, .max_wait = 1ms, .bucket_bounds = {}}), std::invalid_argument,
                       MessageIs("TokenBudget: max_batch must be <= 65536"));
  CHECK_THROWS_MATCHES(DeadlineAware({.max_batch = big, .max_wait = 1ms, .margin = 0ms}), std::invalid_argument,
                       MessageIs("DeadlineAware: max_batch must be <= 65536"));
}

TEST_CASE("TokenBudget: the padded cost saturates instead of overflowing") {
  const std::size_t top = std::numeric_limits<std::size_t>::max();
  {
    // 2 x SIZE_MAX wraps to SIZE_MAX - 1 in size_t arithmetic, which would "fit".
    TokenBudget p({.budget = top, .max_batch = 8, .max_wait = 5ms, .bucket_bounds = {}});
    std::vector<BatchCandidate> c(3, BatchCandidate{t0, BatchTime::max(), top, Priority::normal});
    const BatchDecision d = p.decide(view(c, t0));
    CHECK(d.count == 1);
    CHECK(d.reason == DispatchReason::token_budget);
    CHECK(p.bucket_of(top) < p.bucket_count());
    CHECK(p.max_cost() == top);
    CHECK(TokenBudget::padded_cost(2, top) == top);  // saturates
    CHECK(TokenBudget::padded_cost(top, top) == top);
    CHECK(TokenBudget::padded_cost(3, 5) == 15);
    CHECK(TokenBudget::padded_cost(0, top) == 0);
  }
  {
    // 2 x 2^63 wraps to 0.
    const std::size_t half = std::size_t{1} << (std::numeric_limits<std::size_t>::digits - 1);
    TokenBudget p({.budget = half, .max_batch = 4, .max_wait = 5ms, .bucket_bounds = {}});
    std::vector<BatchCandidate> c(2, BatchCandidate{t0, BatchTime::max(), half, Priority::normal});
    const BatchDecision d = p.decide(view(c, t0));
    CHECK(d.count == 1);
    CHECK(d.reason == DispatchReason::token_budget);
  }
  {
    // The largest batch at the largest budget: 65536 rows of SIZE_MAX / 65536 tokens fit.
    const std::size_t len = top / max_batch_limit;
    TokenBudget p({.budget = top, .max_batch = max_batch_limit, .max_wait = 5ms, .bucket_bounds = {}});
    std::vector<BatchCandidate> c(max_batch_limit, BatchCandidate{t0, BatchTime::max(), len, Priority::normal});
    const BatchDecision d = p.decide(view(c, t0));
    CHECK(d.count == max_batch_limit);
    CHECK(d.reason == DispatchReason::size);
    c.back().cost = len + 1;  // 65536 x (len + 1) > SIZE_MAX
    CHECK(p.decide(view(c, t0)).count == max_batch_limit - 1);
  }
}

TEST_CASE("Reason and priority names are stable") {
  CHECK(std::string(to_string(DispatchReason::token_budget)) == "token_budget");
  CHECK(std::string(to_string(DispatchReason::flush)) == "flush");
  CHECK(std::string(to_string(Priority::low)) == "low");
}
