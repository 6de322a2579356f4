// Static vs AIMD vs gradient concurrency limits reacting to a latency change.
//
// A simulation on a ManualClock (no real time passes, so the output is the same on every
// machine): a service with 8 parallel slots normally serves a request in 10 ms (capacity
// 800 requests/s). From t = 10 s to t = 20 s it slows to 30 ms per request (capacity
// 267/s: the model got heavier inputs, or a neighbour took the GPU), then recovers.
// Requests arrive at 600/s (Poisson) throughout. Each limiter sits in front of the same
// service and sees the same arrivals; every second the program prints, per limiter, the
// limit, the admitted requests' p95 latency and the share rejected.
//
// What to look for: the static limit (sized for the fast regime) keeps admitting as much
// work while the service is slow, so its p95 quadruples (about 15 -> 60 ms); the adaptive
// limits shrink during the slowdown, holding p95 near 40 ms for the same share of
// rejections, and grow back after it. The gradient limit's min-RTT probes (every 8 s plus
// jitter here, the limit pinned to 3 meanwhile) show as seconds with extra rejections;
// GradientLimitConfig::probe_concurrency = 0 probes live traffic instead.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <tailbatch/concurrency_limiter.hpp>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tailbatch::ConcurrencyLimiter;
using tailbatch::ManualClock;

constexpr int kSlots = 8;
constexpr double kOfferedPerSecond = 600;
constexpr int kSeconds = 30;

std::chrono::nanoseconds service_time(ManualClock::duration since_start) {
  return since_start >= 10s && since_start < 20s ? 30ms : 10ms;
}

struct Second {
  std::uint32_t limit = 0;
  int admitted = 0, rejected = 0;
  std::vector<std::chrono::nanoseconds> latencies;
  [[nodiscard]] double p95_ms() const {
    if (latencies.empty()) return 0;
    auto v = latencies;
    std::sort(v.begin(), v.end());
    return static_cast<double>(
               v[static_cast<std::size_t>(0.95 * static_cast<double>(v.size() - 1))].count()) /
           1e6;
  }
  [[nodiscard]] double rejected_pct() const {
    const int offered = admitted + rejected;
    return offered == 0 ? 0 : 100.0 * rejected / offered;
  }
};

// Runs the whole scenario against one limiter; returns per-second statistics.
template <class Algorithm>
std::vector<Second> simulate(Algorithm algorithm) {
  ManualClock clock;
  using Limiter = ConcurrencyLimiter<Algorithm, ManualClock>;
  Limiter limiter(std::move(algorithm), {}, clock);
  const auto start = clock.now();
  std::vector<Second> seconds(kSeconds);

  struct Job {
    typename Limiter::Permit permit;
    ManualClock::time_point arrived;
  };
  struct Running {
    ManualClock::time_point done;
    std::size_t job;
    bool operator>(const Running& o) const { return done > o.done; }
  };
  std::vector<Job> jobs;
  std::deque<std::size_t> waiting;  // the service's own queue, behind its 8 slots
  std::priority_queue<Running, std::vector<Running>, std::greater<>> running;
  auto begin = [&](std::size_t job) {
    running.push({clock.now() + service_time(clock.now() - start), job});
  };
  auto complete_until = [&](ManualClock::time_point t) {
    while (!running.empty() && running.top().done <= t) {
      const Running r = running.top();
      running.pop();
      clock.advance_to(r.done);
      Job& job = jobs[r.job];
      const auto second = static_cast<std::size_t>((job.arrived - start) / 1s);
      seconds[second].latencies.push_back(r.done - job.arrived);
      job.permit.success();  // the limiter learns this request's RTT
      if (!waiting.empty()) {
        begin(waiting.front());
        waiting.pop_front();
      }
    }
  };

  std::uint64_t rng = 42;  // the same arrivals for every limiter
  auto uniform = [&rng] {
    rng += 0x9E3779B97F4A7C15ULL;
    std::uint64_t z = rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) * 0x1.0p-53;
  };
  jobs.reserve(static_cast<std::size_t>(kOfferedPerSecond * kSeconds * 2));
  for (auto t = start; t < start + std::chrono::seconds(kSeconds);) {
    complete_until(t);
    clock.advance_to(t);
    Second& s = seconds[static_cast<std::size_t>((t - start) / 1s)];
    auto permit = limiter.try_acquire();
    if (permit.ok()) {
      ++s.admitted;
      jobs.push_back({std::move(permit).value(), t});
      if (running.size() < kSlots)
        begin(jobs.size() - 1);
      else
        waiting.push_back(jobs.size() - 1);
    } else {
      ++s.rejected;  // turned away at once: the caller can retry elsewhere
    }
    s.limit = limiter.limit();
    t += std::chrono::nanoseconds(
        static_cast<std::int64_t>(-std::log(uniform()) / kOfferedPerSecond * 1e9));
  }
  complete_until(ManualClock::time_point::max());
  return seconds;
}

}  // namespace

int main() {
  // Static: Little's law for the fast regime: 600/s x 10 ms = 6 in service; cap at 16.
  const auto fixed = simulate(tailbatch::StaticLimit{16});
  // AIMD: grow while p95 stays under 40 ms, back off when it does not.
  const auto aimd = simulate(tailbatch::AimdLimit(tailbatch::AimdLimitConfig{.initial_limit = 16,
                                                                        .min_limit = 2,
                                                                        .max_limit = 64,
                                                                        .latency_target = 40ms,
                                                                        .target_percentile = 95,
                                                                        .window = 250ms}));
  // Gradient: the limit follows min RTT / current RTT; seeded for a reproducible run.
  const auto gradient =
      simulate(tailbatch::GradientLimit(tailbatch::GradientLimitConfig{.initial_limit = 16,
                                                                  .min_limit = 2,
                                                                  .max_limit = 64,
                                                                  .sample_percentile = 90,
                                                                  .probe_interval = 8s,
                                                                  .seed = 7}));

  fmt::print("Concurrency limits under a latency change (ManualClock simulation).\n");
  fmt::print(
      "8 slots; 10 ms per request, 30 ms from t=10 s to t=20 s; 600 requests/s offered.\n\n");
  fmt::print("{:>4} | {:^22} | {:^22} | {:^22}\n", "t(s)", "static (16)", "AIMD (p95 target 40ms)",
             "gradient");
  fmt::print("{:>4} | {:>5} {:>8} {:>7} | {:>5} {:>8} {:>7} | {:>5} {:>8} {:>7}\n", "", "limit",
             "p95(ms)", "rej(%)", "limit", "p95(ms)", "rej(%)", "limit", "p95(ms)", "rej(%)");
  for (int i = 0; i < kSeconds; ++i) {
    const auto& a = fixed[static_cast<std::size_t>(i)];
    const auto& b = aimd[static_cast<std::size_t>(i)];
    const auto& c = gradient[static_cast<std::size_t>(i)];
    fmt::print(
        "{:>4} | {:>5} {:>8.1f} {:>7.1f} | {:>5} {:>8.1f} {:>7.1f} | {:>5} {:>8.1f} {:>7.1f}{}\n",
        i, a.limit, a.p95_ms(), a.rejected_pct(), b.limit, b.p95_ms(), b.rejected_pct(), c.limit,
        c.p95_ms(), c.rejected_pct(), i >= 10 && i < 20 ? "  <- slow" : "");
  }
  return 0;
}
