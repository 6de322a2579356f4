// A noisy neighbour, with FIFO and with fair scheduling; then the four queue policies at
// twice the capacity.
//
// A simulation on a ManualClock (no real time passes: the output is the same on every
// machine). A Pipeline serves one request per 10 ms (capacity 100/s). Part 1: tenant A
// offers 120/s, four times its fair share of a third; tenants B and C offer 20/s each.
// With FIFO, B's and C's requests queue behind A's flood and wait as long as A's do; with
// fair scheduling (TenantsConfig, virtual counters) they are served ahead of A's backlog,
// and A, the tenant over its share, is the one that waits; but with reject-newest A's
// backlog still fills the queue and B's and C's newcomers are refused at the door. With
// shed-oldest as well, the full queue sheds A's requests (the tenant that would be served
// last) and B and C lose none. (Answered counts include what shutdown drains.) Part 2: one tenant
// at 200/s for 5 s against the four queue policies (queue capacity 256): reject-newest keeps a full
// queue and its wait; shed-oldest keeps the newest; adaptive LIFO serves the newest first once a
// queue has formed; CoDel sheds until the head's wait falls back near its 5 ms target. Each row
// shows the requests answered within 150 ms (goodput) and the p99 wait of the answered ones.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <tailbatch/pipeline.hpp>
#include <utility>
#include <vector>

namespace tb = tailbatch;
using namespace std::chrono_literals;

namespace {

using Pipe = tb::Pipeline<int, int, tb::FixedWindow, tb::HostLanes, tb::AdmitAll, tb::ManualClock>;

struct Result {
  std::map<tb::TenantId, std::vector<double>> waits_ms;  // answered requests' end-to-end times
  std::map<tb::TenantId, int> refused;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

// Runs `seconds` of arrivals (tenant -> requests per second, evenly spaced) through a
// Pipeline serving one request per 10 ms.
Result simulate(tb::Scheduling scheduling, tb::QueuePolicy policy,
                const std::map<tb::TenantId, int>& rates, int seconds) {
  tb::ManualClock clock;
  Result r;
  tb::PipelineConfig<int> c;
  c.queue_capacity = 256;
  c.tenants.scheduling = scheduling;
  c.queue.policy = policy;
  Pipe p([&](std::span<const int>, std::span<int>, tb::HostLane&) { clock.advance(10ms); },
         tb::FixedWindow{1, 0ms}, c, clock);
  const auto step = 1ms;
  for (int ms = 0; ms < seconds * 1000; ++ms) {
    for (const auto& [tenant, rate] : rates) {
      // rate per second: one every 1000 / rate ms.
      if ((ms * rate) / 1000 == ((ms + 1) * rate) / 1000) continue;
      tb::SubmitOptions o;
      o.tenant = tenant;
      const auto submitted = clock.now();
      p.submit(0, o, [&r, &clock, tenant, submitted](tb::Outcome<int> out) {
        if (out.ok()) {
          r.waits_ms[tenant].push_back(
              std::chrono::duration<double, std::milli>(clock.now() - submitted).count());
        } else {
          ++r.refused[tenant];
        }
      });
    }
    // Serve while the server is free: the model advances the clock 10 ms per request.
    while (clock.now() < tb::ManualClock::start() + (ms + 1) * step) {
      if (p.poll(1).batches == 0) break;
    }
    if (clock.now() < tb::ManualClock::start() + (ms + 1) * step)
      clock.advance(tb::ManualClock::start() + (ms + 1) * step - clock.now());
  }
  p.shutdown();
  return r;
}

}  // namespace

int main() {
  fmt::print("Part 1: a noisy neighbour (capacity 100/s; A offers 120/s, B and C 20/s each)\n");
  fmt::print("{:<20} {:>6} {:>9} {:>8} {:>8} {:>8}\n", "scheduling / queue", "tenant", "answered",
             "refused", "p50 ms", "p95 ms");
  const std::pair<tb::Scheduling, tb::QueuePolicy> setups[] = {
      {tb::Scheduling::fifo, tb::QueuePolicy::reject_newest},
      {tb::Scheduling::fair, tb::QueuePolicy::reject_newest},
      {tb::Scheduling::fair, tb::QueuePolicy::shed_oldest}};
  for (const auto& [scheduling, policy] : setups) {
    const Result r = simulate(scheduling, policy, {{1, 120}, {2, 20}, {3, 20}}, 5);
    for (tb::TenantId t = 1; t <= 3; ++t) {
      const auto it = r.waits_ms.find(t);
      const std::vector<double> w = it == r.waits_ms.end() ? std::vector<double>{} : it->second;
      const std::string setup =
          std::string(tb::to_string(scheduling)) + " / " + std::string(tb::to_string(policy));
      fmt::print("{:<20} {:>6} {:>9} {:>8} {:>8.1f} {:>8.1f}\n", setup, "ABC"[t - 1], w.size(),
                 r.refused.count(t) ? r.refused.at(t) : 0, percentile(w, 0.5), percentile(w, 0.95));
    }
  }
  fmt::print("\nPart 2: one tenant at 200/s, twice the capacity, for 5 s (queue capacity 256)\n");
  fmt::print("{:<14} {:>10} {:>14} {:>10} {:>12}\n", "policy", "answered", "within 150ms",
             "refused", "p99 ms");
  for (const auto policy : {tb::QueuePolicy::reject_newest, tb::QueuePolicy::shed_oldest,
                            tb::QueuePolicy::adaptive_lifo, tb::QueuePolicy::codel}) {
    const Result r = simulate(tb::Scheduling::fifo, policy, {{1, 200}}, 5);
    const std::vector<double> w = r.waits_ms.count(1) ? r.waits_ms.at(1) : std::vector<double>{};
    const auto good = std::count_if(w.begin(), w.end(), [](double x) { return x <= 150.0; });
    fmt::print("{:<14} {:>10} {:>14} {:>10} {:>12.1f}\n", tb::to_string(policy), w.size(), good,
               r.refused.count(1) ? r.refused.at(1) : 0, percentile(w, 0.99));
  }
}
