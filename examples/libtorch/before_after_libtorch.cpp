// before_after_libtorch: batching off, on, and adaptive, for the libtorch encoder.
//
// The libtorch sibling of before_after_demo, with the same load machinery (open loop,
// Poisson arrivals, latency from each request's intended send time: tailbatch::run_load):
// the encoder of examples/libtorch/ behind a Pipeline, swept over offered rates three times,
// with batching off (TokenBudget max_batch 1, no window), on (TokenBudget with length
// buckets and a window), and adaptive (AdaptiveWindow, told only the SLO and the cap; it
// does not bucket by length). Per rate: p50/p95/p99, achieved throughput, process CPU per
// request, mean batch; per setup: the saturation point (the highest rate whose p95 meets
// the SLO with under 1 % errors, every lower rate meeting it too).
//
//   before_after_libtorch [--slo-p95-ms 100] [--window-ms 2] [--max-batch 32] [--lanes 1]
//   [--threads 1] before_after_libtorch --smoke         # two short rates per setup: a quick check
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <exception>
#include <optional>
#include <string>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/tools/load_generator.hpp>
#include <tailbatch/warmup.hpp>
#include <thread>
#include <vector>

#include "encoder_pipeline.hpp"

namespace tl = tailbatch_libtorch;
using namespace std::chrono;

namespace {

double ms(nanoseconds d) { return duration<double, std::milli>(d).count(); }

// CPU time of the whole process (every thread), seconds: std::clock on Linux.
double process_cpu_s() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

struct Point {
  double offered = 0;
  tailbatch::LoadResult r;
  double cpu_ms = 0;  // process CPU per completed request
  double mean_batch = 0;
  bool meets = false;
};

struct Sweep {
  std::string name;
  std::vector<Point> points;
  std::optional<std::size_t> saturation;
};

struct Options {
  double slo_ms = 100;
  double window_ms = 2;
  std::size_t max_batch = 32;
  std::size_t lanes = 1;
  std::size_t threads = 1;  // per lane: one served the most here (docs/performance.md)
  bool smoke = false;
  std::string weights = TAILBATCH_LIBTORCH_WEIGHTS;
};

// One setup: a fresh Pipeline with `policy` on fresh lanes, warmed up, then each rate in
// turn until one misses the SLO.
template <class Policy>
Sweep sweep(const std::string& name, Policy policy, const std::vector<double>& rates,
            const std::vector<tl::TokenizedText>& requests, const Options& o) {
  tl::TorchLanes lanes(o.lanes, o.weights);
  tailbatch::Pipeline<tl::TokenizedText, tl::Encoding, Policy, tl::TorchLanes> pipeline(
      tl::EncoderModel{}, std::move(policy), tl::encoder_pipeline_config(), lanes);
  (void)tailbatch::warmup(pipeline, std::span<const tl::TokenizedText>(requests.data(), 64));
  auto target = tailbatch::pipeline_target(
      pipeline, [&requests](std::uint64_t i) { return requests[i % requests.size()]; });
  Sweep s{name, {}, {}};
  const nanoseconds step = o.smoke ? milliseconds(700) : milliseconds(2500);
  for (std::size_t i = 0; i < rates.size(); ++i) {
    tailbatch::LoadConfig lc;
    lc.profile = tailbatch::LoadProfile::poisson(rates[i], step);
    lc.warmup = step / 5;
    lc.seed = 1000 + i;  // the same arrivals for every setup
    lc.drain_timeout = seconds(5);
    const double cpu0 = process_cpu_s();
    const auto stats0 = pipeline.stats();
    Point p;
    p.offered = rates[i];
    p.r = tailbatch::run_load(lc, target);
    const auto stats1 = pipeline.stats();
    const double completed = static_cast<double>(p.r.ok + p.r.warmup_requests);
    p.cpu_ms = completed > 0 ? (process_cpu_s() - cpu0) * 1000.0 / completed : 0.0;
    const auto batches = stats1.batches() - stats0.batches();
    p.mean_batch =
        batches ? static_cast<double>(stats1.batched_requests - stats0.batched_requests) / batches
                : 0.0;
    p.meets = p.r.error_rate() < 0.01 && p.r.ok > 0 && ms(p.r.p95) <= o.slo_ms;
    s.points.push_back(p);
    if (!p.meets) break;  // past saturation more load only queues
    s.saturation = i;
    std::this_thread::sleep_for(milliseconds(200));
  }
  return s;
}

void print(const Sweep& s) {
  fmt::print("  {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9} {:>6}\n", "offered", "achieved", "p50 ms",
             "p95 ms", "p99 ms", "errors", "CPU ms/", "mean");
  fmt::print("  {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9} {:>6}\n", "rps", "rps", "", "", "", "%",
             "request", "batch");
  for (std::size_t i = 0; i < s.points.size(); ++i) {
    const Point& p = s.points[i];
    fmt::print("  {:>8.0f} {:>9.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>9.3f} {:>6.1f}  {}{}\n",
               p.offered, p.r.throughput_rps, ms(p.r.p50), ms(p.r.p95), ms(p.r.p99),
               p.r.error_rate() * 100.0, p.cpu_ms, p.mean_batch, p.meets ? "ok" : "over SLO",
               s.saturation == i ? "   <- saturation" : "");
  }
}

// Requests per second of the module alone at batch 1 (the median of 41 calls after 20 to
// warm up), on a lane of its own.
double batch1_rate(const std::vector<tl::TokenizedText>& requests, const Options& o) {
  tl::TorchLanes lanes(1, o.weights);
  std::vector<tl::Encoding> out(1);
  std::vector<double> t;
  for (std::size_t i = 0; i < 61; ++i) {
    const auto t0 = steady_clock::now();
    tl::encode_batch(lanes.lane(0).module(), std::span(&requests[i], 1), out,
                     lanes.lane(0).scratch());
    if (i >= 20) t.push_back(duration<double>(steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 1.0 / t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "before_after_libtorch: the libtorch encoder behind a Pipeline, batching off vs on vs "
      "adaptive"};
  Options o;
  app.add_option("--weights", o.weights, "weights file (torch::save)")->capture_default_str();
  app.add_option("--slo-p95-ms", o.slo_ms, "p95 SLO in ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--window-ms", o.window_ms, "the window (max_wait), ms")->capture_default_str();
  app.add_option("--max-batch", o.max_batch, "max_batch with batching on")
      ->capture_default_str()
      ->check(CLI::Range(2, 256));
  app.add_option("--lanes", o.lanes, "lanes (a module each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  app.add_option("--threads", o.threads, "intra-op threads per lane (0: cores / lanes)")
      ->capture_default_str();
  app.add_flag("--smoke", o.smoke, "two short rates per setup: a quick check, not a measurement");
  CLI11_PARSE(app, argc, argv);

  try {
    const auto wall0 = steady_clock::now();
    const tl::ThreadPlan plan = tl::set_intra_op_threads(
        o.lanes, o.threads, 0, [](std::string_view l) { fmt::print("{}\n", l); });
    const tl::TextTokenizer tokenize{tl::load_encoder(o.weights)->config};
    std::vector<tl::TokenizedText> requests;
    for (const std::string& t : tl::sample_texts(4096))
      requests.push_back(tokenize(t, requests.size()));

    const auto window = duration_cast<nanoseconds>(duration<double, std::milli>(o.window_ms));
    const double r1 = batch1_rate(requests, o);
    std::vector<double> rates;
    const std::vector<double> fractions =
        o.smoke ? std::vector<double>{0.2, 0.4}
                : std::vector<double>{0.4, 0.7, 1.0, 1.3, 1.6, 2.0, 2.5};
    for (double f : fractions)
      rates.push_back(std::max(1.0, std::round(f * r1 * static_cast<double>(o.lanes))));

    fmt::print("tailbatch before/after: the libtorch encoder behind a Pipeline, on this machine\n");
    fmt::print(
        "{} lane{} x {} intra-op thread{} on {} cores; SLO p95 <= {} ms with errors < 1 %; Poisson "
        "arrivals\n",
        plan.lanes, plan.lanes == 1 ? "" : "s", plan.threads_per_lane,
        plan.threads_per_lane == 1 ? "" : "s", plan.cores, o.slo_ms);
    fmt::print(
        "the module alone at batch 1: {:.0f} requests/s a lane; rates {:.0f} to {:.0f} rps, {} s "
        "each\n",
        r1, rates.front(), rates.back(), o.smoke ? 0.7 : 2.5);

    tailbatch::AdaptiveWindowConfig ac;
    ac.slo_p95 = duration_cast<nanoseconds>(duration<double, std::milli>(o.slo_ms));
    ac.max_batch = o.max_batch;
    const Sweep off =
        sweep("batching off", tl::encoder_policy(1, nanoseconds(0)), rates, requests, o);
    const Sweep on =
        sweep("batching on", tl::encoder_policy(o.max_batch, window), rates, requests, o);
    const Sweep adaptive = sweep("adaptive", tailbatch::AdaptiveWindow(ac), rates, requests, o);

    fmt::print("\nBEFORE: batching off (TokenBudget max_batch 1, no window)\n");
    print(off);
    fmt::print(
        "\nAFTER: batching on (TokenBudget max_batch {}, window {} ms, length buckets "
        "8/16/32/64)\n",
        o.max_batch, o.window_ms);
    print(on);
    fmt::print("\nADAPTIVE: AdaptiveWindow (p95 target {} ms, max_batch {}; no length buckets)\n",
               o.slo_ms, o.max_batch);
    print(adaptive);
    fmt::print("\nsaturation (highest rate meeting the SLO, all lower ones too):\n");
    for (const Sweep* s : {&off, &on, &adaptive}) {
      fmt::print(
          "  {:<13} {}\n", s->name,
          s->saturation
              ? fmt::format("{:.0f} rps{}", s->points[*s->saturation].offered,
                            *s->saturation + 1 == rates.size() ? " (the highest rate tried)" : "")
              : std::string("none (the lowest rate missed the SLO)"));
    }
    fmt::print("\nfinished in {:.0f} s\n", duration<double>(steady_clock::now() - wall0).count());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "before_after_libtorch: {}\n", e.what());
    return 1;
  }
}
