// PolicyVariant: one policy type over several, dispatched per call. Each alternative's
// decisions are compared with the same policy's own on the same views, feedback reaches a
// learning alternative (and only it), and a Pipeline on the manual clock runs with either.
#include <chrono>
#include <future>
#include <span>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/batch_window.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/policy_variant.hpp>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;
using namespace std::chrono_literals;

namespace {

using FixedOrAdaptive = PolicyVariant<FixedWindow, AdaptiveWindow>;

const BatchTime t0 = ManualClock::start();

std::vector<BatchCandidate> arrivals(std::initializer_list<BatchDuration> offsets) {
  std::vector<BatchCandidate> v;
  for (auto d : offsets) v.push_back(BatchCandidate{t0 + d, BatchTime::max(), 1, Priority::normal});
  return v;
}

BatchView view(const std::vector<BatchCandidate>& c, BatchTime now) {
  return BatchView{std::span<const BatchCandidate>(c), c.size(), now, false};
}

AdaptiveWindowConfig adaptive_config() {
  AdaptiveWindowConfig c;
  c.slo_p95 = 50ms;
  c.max_batch = 8;
  return c;
}

}  // namespace

static_assert(BatchPolicy<FixedOrAdaptive>);
static_assert(BatchFeedbackPolicy<FixedOrAdaptive>);
// No learning alternative: no on_batch_executed, so the Pipeline pays nothing for it.
static_assert(BatchPolicy<PolicyVariant<FixedWindow, PreferredSizes>>);
static_assert(!BatchFeedbackPolicy<PolicyVariant<FixedWindow, PreferredSizes>>);
static_assert(!PolicyVariant<FixedWindow, AdaptiveWindow>::uses_cost);
static_assert(PolicyVariant<FixedWindow, TokenBudget>::uses_cost);

TEST_CASE("PolicyVariant holding a FixedWindow decides as the FixedWindow does") {
  const FixedWindow fixed(4, 10ms);
  const FixedOrAdaptive v = fixed;
  CHECK(v.holds<FixedWindow>());
  CHECK_FALSE(v.holds<AdaptiveWindow>());
  CHECK(v.index() == 0);
  REQUIRE(v.get_if<FixedWindow>() != nullptr);
  CHECK(v.get_if<AdaptiveWindow>() == nullptr);
  CHECK(v.max_batch() == 4);
  CHECK(v.order() == BatchOrder::fifo);
  for (const auto& c :
       {arrivals({}), arrivals({0ms}), arrivals({0ms, 1ms}), arrivals({0ms, 1ms, 2ms, 3ms, 4ms})}) {
    for (const BatchDuration at : {0ms, 5ms, 10ms, 20ms}) {
      const BatchDecision a = v.decide(view(c, t0 + at));
      const BatchDecision b = fixed.decide(view(c, t0 + at));
      CHECK(a.count == b.count);
      CHECK(a.decide_again_at == b.decide_again_at);
      CHECK(a.reason == b.reason);
    }
  }
  // Feedback to a FixedWindow is accepted and ignored.
  v.on_batch_executed(BatchFeedback{});
  CHECK(v.max_batch() == 4);
}

TEST_CASE("PolicyVariant holding an AdaptiveWindow forwards decisions and feedback to it") {
  const AdaptiveWindow adaptive(adaptive_config());
  const FixedOrAdaptive v = adaptive;  // copies share the learned state
  CHECK(v.holds<AdaptiveWindow>());
  CHECK(v.index() == 1);
  CHECK(v.max_batch() == 8);
  const auto c = arrivals({0ms, 1ms, 2ms});
  const BatchDecision a = v.decide(view(c, t0 + 3ms));
  const BatchDecision b = adaptive.decide(view(c, t0 + 3ms));
  CHECK(a.count == b.count);
  CHECK(a.reason == b.reason);

  CHECK(adaptive.cost_model().samples == 0);
  for (std::size_t size : {1u, 2u, 4u, 8u}) {
    BatchFeedback f;
    f.size = size;
    f.padded_size = size;
    f.model_time = 1ms + 100us * static_cast<std::int64_t>(size);
    f.started = t0;
    v.on_batch_executed(f);
  }
  CHECK(adaptive.cost_model().samples == 4);
  CHECK(adaptive.cost_model().sizes_seen == 4);
}

TEST_CASE("PolicyVariant behind a Pipeline on the manual clock: one Pipeline type, either policy") {
  using P = Pipeline<int, int, FixedOrAdaptive, HostLanes, AdmitAll, ManualClock>;
  // The model takes 1 ms of manual time per batch, so the feedback carries a real cost.
  ManualClock clock;
  std::vector<std::size_t> sizes;
  auto model = [&sizes, clock](std::span<const int> in, std::span<int> out, HostLane&) mutable {
    sizes.push_back(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i] + 1;
    clock.advance(1ms);
  };

  SECTION("FixedWindow: a full batch closes at once, a partial one when its window ends") {
    P p(model, FixedOrAdaptive(FixedWindow(3, 10ms)), {}, clock);
    std::vector<std::future<Outcome<int>>> f;
    for (int i = 0; i < 4; ++i) f.push_back(p.submit(i));
    CHECK(p.poll().batches == 1);
    CHECK(sizes == std::vector<std::size_t>{3});
    clock.advance(10ms);
    CHECK(p.poll().batches == 1);
    CHECK(sizes == std::vector<std::size_t>{3, 1});
    for (int i = 0; i < 4; ++i) CHECK(f[static_cast<std::size_t>(i)].get().value() == i + 1);
  }

  SECTION("AdaptiveWindow: the Pipeline's feedback reaches the policy held") {
    const AdaptiveWindow adaptive(adaptive_config());
    P p(model, FixedOrAdaptive(adaptive), {}, clock);
    std::vector<std::future<Outcome<int>>> f;
    for (int i = 0; i < 5; ++i) {
      f.push_back(p.submit(i));
      (void)p.poll();
      clock.advance(1ms);
    }
    p.shutdown();
    for (auto& x : f) CHECK(x.get().ok());
    CHECK(adaptive.cost_model().samples == p.stats().batches());
    CHECK(adaptive.cost_model().samples >= 1);
  }
}
