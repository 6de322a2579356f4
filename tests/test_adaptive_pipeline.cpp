// AdaptiveWindow behind a real Pipeline on the real clock: the Pipeline reports each
// executed batch (BatchFeedbackPolicy) and fills BatchView::lanes/idle_lanes, and the
// policy learns the model that really ran. No time is asserted: only that the learned
// cost is the sleeping model's, within 10 %, and that every request completed ok.
//
// Not built yet (the file name keeps it out of the tests/test_*.cpp glob): it needs the
// Pipeline to call on_batch_executed. Once it does, rename it to
// tests/test_adaptive_pipeline.cpp.
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/pipeline.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

#if defined(TAILBATCH_CATCH2_V3)
using Catch::Approx;
#else
using Catch::Detail::Approx;
#endif

using namespace std::chrono_literals;

TEST_CASE("AdaptiveWindow behind a Pipeline converges to the cost of a sleeping model", "[adaptive][pipeline][threads]") {
  auto true_cost = [](std::size_t b) { return 10ms + 1ms * static_cast<std::int64_t>(b); };
  auto model = [&](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
    std::this_thread::sleep_for(true_cost(in.size()));
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
  };
  tailbatch::AdaptiveWindowConfig c;
  c.slo_p95 = 200ms;
  c.max_batch = 32;
  const tailbatch::AdaptiveWindow policy(c);  // shares its state with the Pipeline's copy
  tailbatch::HostLanes lanes(2);
  tailbatch::Pipeline<int, int, tailbatch::AdaptiveWindow, tailbatch::HostLanes> pipeline(model, policy, {}, lanes);

  // Three submitters at about 100 requests/s each for 1.5 s: batches of many sizes.
  std::vector<std::thread> submitters;
  std::vector<std::vector<std::future<tailbatch::Outcome<int>>>> futures(3);
  for (int s = 0; s < 3; ++s) {
    submitters.emplace_back([&, s] {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 150; ++i) {
        std::this_thread::sleep_until(start + 10ms * i + 3ms * s);
        futures[static_cast<std::size_t>(s)].push_back(pipeline.submit(i));
      }
    });
  }
  for (auto& t : submitters) t.join();
  for (auto& per : futures)
    for (auto& f : per) CHECK(f.get().ok());
  pipeline.shutdown();

  const tailbatch::AdaptiveCostModel m = policy.cost_model();
  CHECK(m.samples == pipeline.stats().batches());
  CHECK(m.sizes_seen >= 2);
  for (std::size_t b : {1u, 4u, 8u, 16u}) {
    INFO("size " << b);
    CHECK(policy.estimate_seconds(b) == Approx(std::chrono::duration<double>(true_cost(b)).count()).epsilon(0.1));
  }
}
