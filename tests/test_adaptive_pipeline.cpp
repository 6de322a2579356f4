// AdaptiveWindow behind a real Pipeline on the real clock: the Pipeline reports each
// executed batch (BatchFeedbackPolicy) and fills BatchView::lanes/idle_lanes, and the
// policy learns the model that really ran. No time is asserted: only that the learned
// cost is the sleeping model's, within 10 %, and that every request completed ok.
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/pipeline.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;

TEST_CASE("AdaptiveWindow behind a Pipeline converges to the cost of a sleeping model", "[adaptive][pipeline][threads]") {
  auto nominal_cost = [](std::size_t b) { return 10ms + 1ms * static_cast<std::int64_t>(b); };
  // The true cost is what the sleeps really took (a loaded machine oversleeps), per size.
  std::mutex taken_mu;
  std::map<std::size_t, std::vector<double>> taken;
  auto model = [&](std::span<const int> in, std::span<int> out, tailbatch::HostLane&) {
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(nominal_cost(in.size()));
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = in[i];
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(taken_mu);
    taken[in.size()].push_back(took);
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
  // Every size seen often enough to have a typical cost, compared with the median time the
  // model really took at that size: the estimate is within 10 % of it on average over those
  // sizes, weighted by how often each ran. (Each size alone is a few noisy sleeps: a busy
  // machine oversleeps by milliseconds at random, so one size's median may stray past 10 %
  // while the fit over all of them does not. A model that learned nothing, or the nominal
  // cost instead of the taken one, misses by far more.)
  std::size_t checked = 0;
  double weighted_error = 0.0;
  double weight = 0.0;
  for (auto& [b, times] : taken) {
    if (times.size() < 5) continue;
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
    const double median = times[times.size() / 2];
    const double error = std::abs(policy.estimate_seconds(b) - median) / median;
    INFO("size " << b << ", " << times.size() << " batches, median " << median << " s, estimate "
                 << policy.estimate_seconds(b) << " s");
    CHECK(error < 0.5);  // no size is far off
    weighted_error += error * static_cast<double>(times.size());
    weight += static_cast<double>(times.size());
    ++checked;
  }
  REQUIRE(checked >= 1);
  INFO("mean relative error " << weighted_error / weight << " over " << checked << " sizes");
  CHECK(weighted_error / weight <= 0.10);
}
