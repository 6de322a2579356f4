// tailbatch-load: open-loop load tests and QPS sweeps against a model behind a Pipeline.
//
// The model is synthetic: a batch of b requests takes L(b) = base + per_item × (b − 1) on
// its lane (it sleeps, like a call to a device), so the tool shows what batching, windows,
// lanes and in-flight caps do without a model of your own. Examples:
//
//   tailbatch-load --rate 300 --duration 10                      one run, p95 over time
//   tailbatch-load --sweep 100,200,300,400,500 --slo-p95-ms 100  find the saturation point
//   tailbatch-load --steps 100:5,400:3,100:5                     a spike
//   tailbatch-load --max-batch 1 --window-ms 0 --sweep 20,40,80  batching off
//   tailbatch-load --sweep 100,200,300,400 --simulate           the same, predicted by the
//                                                              simulator in milliseconds
//   tailbatch-load --simulate --policy adaptive --slo-p95-ms 150 --max-batch 64 --rate 450
//                                                              the SLO-aimed AdaptiveWindow
//   tailbatch-load --simulate --policy best-static --rate 450   the best FixedWindow of a grid
//   tailbatch-load --simulate --model generator --kv-blocks 192 --output-len geometric:128
//       --max-tokens 512 --sweep 100,200,300                   continuous batching with a KV
//                                                              cache, simulated (generation_load.hpp)
//
// Policies: fixed (FixedWindow(--max-batch, --window-ms)), adaptive (AdaptiveWindow with
// --slo-p95-ms as its target and --max-batch as its hard cap), best-static (simulation
// only: every window of {0, 0.5, 1, 2, 3, 5, 8, 10, 15, 20} ms with every max batch of
// {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64} up to --max-batch, simulated on the same
// arrivals; the one with the lowest p95 is reported).
//
// Prints the results as a table and writes SVG plots to --out (paths printed last), or,
// with --json, one JSON object per run on stdout (a line each; paths then go to stderr).
// Progress lines go to stderr (--quiet turns them off). Exit status: 0 on success, 1 for
// bad arguments (with a message saying which), 2 if writing the plots failed.
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/concurrency_limiter.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/policy_variant.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/corpus.hpp>
#include <tailbatch/tools/load_generator.hpp>
#include <tailbatch/tools/simulator.hpp>
#include <tailbatch/tools/trace.hpp>
#include <tailbatch/queue_policy.hpp>
#include <tailbatch/tenants.hpp>

#include "tenant_mix.hpp"  // --tenant-mix
#include "generation_load.hpp"  // --model generator, --output-len, --shared-prefix, --kv-*
#ifdef TAILBATCH_LOAD_HTTP
#include "http_load.hpp"  // --url: HTTP load (Boost.Beast/Asio)
#endif

#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono;

struct Options {
  double base_ms = 20.0, per_item_ms = 3.0;
  std::size_t lanes = 2;
  std::size_t max_batch = 16;
  double window_ms = 8.0;
  std::size_t max_in_flight = 0;
  std::size_t queue_capacity = 4096;
  std::string arrivals = "poisson";
  double rate = 0.0;
  std::vector<double> sweep;
  std::string steps;
  double duration_s = 10.0, warmup_s = 2.0;
  double slo_p95_ms = 100.0;
  std::string out = "tailbatch-load-out";
  std::uint64_t seed = 42;
  bool quiet = false;
  bool simulate = false;
  std::string policy = "fixed";
  double network_ms = 0.0;
  bool json = false;
  std::string model = "sleep";
  std::string record;  // --record FILE: write the live run's trace
  std::string replay;  // --replay FILE: with --simulate, replay a trace
  // Tenants (tenant_mix.hpp) and the queue's overload policy.
  std::string tenant_mix;  // --tenant-mix a:300,b:50:2
  std::vector<tailbatch_load::TenantSpec> tenants;  // parsed from it
  std::string scheduling = "fifo";
  std::string queue_policy = "reject-newest";
  double codel_target_ms = 5;     // --codel-target-ms
  double codel_interval_ms = 100;  // --codel-interval-ms
  std::size_t tenant_max_queued = 0;  // --tenant-max-queued: every tenant's quota; 0: none
  double request_timeout_ms = 0;      // --request-timeout-ms: each request's deadline; 0: none
};

// The Pipeline's tenants configuration for --tenant-mix and --scheduling: tenant i of the
// mix is TenantId i + 1, with its weight.
tailbatch::TenantsConfig tenants_config(const Options& o) {
  tailbatch::TenantsConfig c;
  c.scheduling = *tailbatch::parse_scheduling(o.scheduling);
  c.defaults.max_queued = o.tenant_max_queued;
  for (std::size_t i = 0; i < o.tenants.size(); ++i)
    c.tenants.emplace_back(static_cast<tailbatch::TenantId>(i + 1),
                           tailbatch::TenantQuota{o.tenants[i].weight, o.tenant_max_queued, 0});
  return c;
}

tailbatch::QueuePolicyConfig queue_config(const Options& o) {
  tailbatch::QueuePolicyConfig q;
  q.policy = *tailbatch::parse_queue_policy(o.queue_policy);
  q.codel_target = std::chrono::duration_cast<tailbatch::BatchDuration>(
      std::chrono::duration<double, std::milli>(o.codel_target_ms));
  q.codel_interval = std::chrono::duration_cast<tailbatch::BatchDuration>(
      std::chrono::duration<double, std::milli>(o.codel_interval_ms));
  return q;
}

// The batch policy a run uses, chosen at run time: a FixedWindow or an AdaptiveWindow
// behind one type (tailbatch::PolicyVariant), so that one Pipeline instantiation serves
// both; executed-batch reports reach the adaptive window.
using AnyPolicy = tailbatch::PolicyVariant<tailbatch::FixedWindow, tailbatch::AdaptiveWindow>;
static_assert(tailbatch::BatchFeedbackPolicy<AnyPolicy>);
// The live Pipeline's policy: AnyPolicy, telling the --record trace of each batch.
using LivePolicy = tailbatch::RecordingPolicy<AnyPolicy>;

// One run's figures: a JSON object, a line of the --json output.
struct RunRecord {
  std::string mode;  // "simulate" or "live"
  std::string policy;
  double offered_rps = 0, achieved_rps = 0, p50_ms = 0, p95_ms = 0, p99_ms = 0, mean_batch = 0;
  std::uint64_t errors = 0;
  double window_ms = -1;  // fixed and best-static only
  std::size_t max_batch = 0;
  double goodput_rps = 0;  // ok within --slo-p95-ms, per second
  std::vector<tailbatch_load::TenantRow> tenants;  // --tenant-mix
};

std::string to_json(const RunRecord& r) {
  std::string out = fmt::format(
      "{{\"mode\": \"{}\", \"policy\": \"{}\", \"offered_rps\": {:.3f}, \"achieved_rps\": {:.3f}, "
      "\"p50_ms\": {:.3f}, \"p95_ms\": {:.3f}, \"p99_ms\": {:.3f}, \"mean_batch\": {:.3f}, "
      "\"errors\": {}",
      r.mode, r.policy, r.offered_rps, r.achieved_rps, r.p50_ms, r.p95_ms, r.p99_ms, r.mean_batch,
      r.errors);
  if (r.policy != "adaptive")
    out += fmt::format(", \"window_ms\": {}, \"max_batch\": {}", r.window_ms, r.max_batch);
  out += fmt::format(", \"goodput_rps\": {:.3f}, \"tenants\": {}", r.goodput_rps,
                     tailbatch_load::tenants_json(r.tenants));
  return out + "}";
}

// A CLI11 check: a finite number, > lo (strict) or >= lo. Says "not a number" for what
// does not parse, and the bound for what is out of range.
CLI::Validator number_check(double lo, bool strict) {
  return CLI::Validator(
      [lo, strict](std::string& text) -> std::string {
        double v = 0.0;
        std::size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(v))
          return "\"" + text + "\" is not a number";
        if (strict ? !(v > lo) : !(v >= lo))
          return fmt::format("must be {} {}, got {}", strict ? ">" : ">=", lo, text);
        return {};
      },
      strict ? "NUMBER > 0" : "NUMBER >= 0");
}

using tailbatch_load::count_check;  // a whole number in [lo, hi] (generation_load.hpp)

struct Request {
  std::uint64_t id = 0;
};
struct Response {
  std::uint64_t id = 0;
};

nanoseconds from_ms(double v) {
  return duration_cast<nanoseconds>(duration<double, std::milli>(v));
}
nanoseconds from_s(double v) { return duration_cast<nanoseconds>(duration<double>(v)); }

tailbatch::LoadProfile parse_steps(const std::string& text, tailbatch::ArrivalProcess process) {
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw std::invalid_argument("--steps: empty; give RATE:SECONDS phases, as in 100:5,400:3");
  std::vector<tailbatch::LoadPhase> phases;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const std::size_t colon = item.find(':');
    double rate = 0, secs = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument(item);
      std::size_t used = 0;
      rate = std::stod(item.substr(0, colon), &used);
      if (used != colon) throw std::invalid_argument(item);
      secs = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::invalid_argument("--steps: cannot read \"" + item +
                                  "\": expected RATE:SECONDS, as in 100:5");
    }
    if (!std::isfinite(rate) || rate < 0.0 || !std::isfinite(secs) || secs <= 0.0 || secs > 1e6)
      throw std::invalid_argument("--steps: \"" + item +
                                  "\": RATE must be >= 0 and SECONDS in (0, 1e6]");
    phases.push_back({from_s(secs), rate});
    pos = end + 1;
  }
  return tailbatch::LoadProfile::steps(process, std::move(phases));
}

std::string policy_text(const Options& o) {
  if (o.policy == "adaptive")
    return fmt::format("adaptive window, p95 target {} ms, max_batch {}", o.slo_p95_ms,
                       o.max_batch);
  if (o.policy == "best-static")
    return fmt::format("best static window (grid search), max_batch <= {}", o.max_batch);
  return fmt::format("max_batch {}, window {} ms", o.max_batch, o.window_ms);
}

std::string model_text(const Options& o) {
  if (o.model == "classifier") return "the reference classifier (CPU)";
  return fmt::format("synthetic model L(b) = {} ms + {} ms x (b-1)", o.base_ms, o.per_item_ms);
}

std::string subtitle(const Options& o) {
  return fmt::format(
      "{}; {} lanes; {}{}{}; {} arrivals", model_text(o), o.lanes, policy_text(o),
      o.max_in_flight ? fmt::format("; max in-flight {}", o.max_in_flight) : std::string(),
      o.network_ms > 0 ? fmt::format("; network {} ms", o.network_ms) : std::string(), o.arrivals);
}

AnyPolicy make_policy(const Options& o, std::size_t max_batch, double window_ms) {
  if (o.policy == "adaptive") {
    tailbatch::AdaptiveWindowConfig c;
    c.slo_p95 = from_ms(o.slo_p95_ms);
    c.max_batch = max_batch;
    return AnyPolicy(tailbatch::AdaptiveWindow(c));
  }
  return AnyPolicy(tailbatch::FixedWindow(max_batch, from_ms(window_ms)));
}

double ms_of(nanoseconds d) { return duration<double, std::milli>(d).count(); }

RunRecord record_of(const tailbatch::SimulationResult& s, const std::string& policy,
                    double window_ms, std::size_t max_batch) {
  RunRecord r;
  r.mode = "simulate";
  r.policy = policy;
  r.offered_rps = s.offered_rps;
  r.achieved_rps = s.throughput_rps;
  r.p50_ms = ms_of(s.p50);
  r.p95_ms = ms_of(s.p95);
  r.p99_ms = ms_of(s.p99);
  r.mean_batch = s.mean_batch_size;
  r.errors = s.arrivals - s.ok;
  r.window_ms = window_ms;
  r.max_batch = max_batch;
  r.goodput_rps = s.goodput_rps;
  return r;
}

// The simulation's per-tenant results as --tenant-mix rows (tenant i is TenantId i + 1).
std::vector<tailbatch_load::TenantRow> tenant_rows(const tailbatch::SimulationResult& s,
                                                   const Options& o) {
  std::vector<tailbatch_load::TenantRow> rows;
  const double offered_s = std::max(o.duration_s - o.warmup_s, 1e-9);
  const double window_s =
      s.throughput_rps > 0 ? static_cast<double>(s.ok) / s.throughput_rps : offered_s;
  for (std::size_t i = 0; i < o.tenants.size(); ++i) {
    tailbatch_load::TenantRow row;
    row.name = o.tenants[i].name;
    for (const auto& t : s.tenants) {
      if (t.tenant != i + 1) continue;
      row.offered = t.arrivals;
      row.ok = t.ok;
      row.good = t.good;
      row.errors = t.arrivals - t.ok;
      row.offered_rps = static_cast<double>(t.arrivals) / offered_s;
      row.achieved_rps = static_cast<double>(t.ok) / window_s;
      row.goodput_rps = static_cast<double>(t.good) / window_s;
      row.p50_ms = ms_of(t.p50);
      row.p95_ms = ms_of(t.p95);
      row.p99_ms = ms_of(t.p99);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

RunRecord record_of(const tailbatch::LoadResult& l, const std::string& policy, double window_ms,
                    std::size_t max_batch, double mean_batch) {
  RunRecord r;
  r.mode = "live";
  r.policy = policy;
  r.offered_rps = l.offered_rps;
  r.achieved_rps = l.throughput_rps;
  r.p50_ms = ms_of(l.p50);
  r.p95_ms = ms_of(l.p95);
  r.p99_ms = ms_of(l.p99);
  r.mean_batch = mean_batch;
  r.errors = l.failed + l.timed_out + l.dropped;
  r.window_ms = window_ms;
  r.max_batch = max_batch;
  return r;
}

// The grid best-static searches.
constexpr double static_windows_ms[] = {0, 0.5, 1, 2, 3, 5, 8, 10, 15, 20};
constexpr std::size_t static_batches[] = {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64};

// The simulator's answer in the load generator's terms, so that tables and plots are shared.
tailbatch::LoadResult as_load_result(const tailbatch::SimulationResult& s) {
  tailbatch::LoadResult r;
  r.offered_rps = s.offered_rps;
  r.throughput_rps = s.throughput_rps;
  r.due = s.arrivals;
  r.sent = s.arrivals;
  r.ok = s.ok;
  r.failed = s.arrivals - s.ok;
  r.warmup_requests = s.warmup_arrivals;
  for (std::size_t i = 0; i < 5; ++i) r.by_status[i] = s.by_status[i];
  r.latency = s.latency;
  r.p50 = s.p50;
  r.p95 = s.p95;
  r.p99 = s.p99;
  r.p999 = s.latency.percentile(99.9);
  r.max = s.max;
  r.mean = s.mean;
  return r;
}

int run_simulated(const Options& o) {
  const auto process = o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant
                                                : tailbatch::ArrivalProcess::poisson;
  auto simulate_with = [&](const tailbatch::LoadProfile& profile, nanoseconds warmup,
                           std::size_t max_batch, double window_ms) {
    tailbatch::SimulationConfig c;
    c.arrivals = profile;
    c.warmup = warmup;
    c.seed = o.seed;
    c.lanes = o.lanes;
    c.service_time = tailbatch::LinearCost{from_ms(o.base_ms), from_ms(o.per_item_ms)};
    c.network = from_ms(o.network_ms);
    c.queue_capacity = o.queue_capacity;
    c.tenants = tenants_config(o);
    c.queue = queue_config(o);
    c.goodput_within = from_ms(o.slo_p95_ms);
    c.request_timeout = from_ms(o.request_timeout_ms);
    if (!o.tenants.empty()) {
      c.tenant = [split = tailbatch_load::TenantSplit(o.tenants, o.seed)](std::uint64_t i) {
        return static_cast<tailbatch::TenantId>(split.tenant_of(i) + 1);
      };
    }
    const AnyPolicy policy = make_policy(o, max_batch, window_ms);
    if (o.max_in_flight > 0) {
      tailbatch::ConcurrencyLimiter<tailbatch::StaticLimit, tailbatch::ManualClock> limiter(
          tailbatch::StaticLimit(static_cast<std::uint32_t>(o.max_in_flight)), {}, c.clock);
      return tailbatch::simulate(c, policy, limiter);
    }
    return tailbatch::simulate(c, policy);
  };
  // One run of the chosen policy; best-static runs the grid on the same arrivals and keeps
  // the lowest p95 among the configurations that completed every request (or, if none
  // did, among those with the fewest errors).
  auto run_at = [&](const tailbatch::LoadProfile& profile, nanoseconds warmup) {
    if (o.policy != "best-static") {
      auto sim = simulate_with(profile, warmup, o.max_batch, o.window_ms);
      return std::pair{sim, record_of(sim, o.policy, o.window_ms, o.max_batch)};
    }
    std::optional<std::pair<tailbatch::SimulationResult, RunRecord>> best;
    for (const double w : static_windows_ms) {
      for (const std::size_t b : static_batches) {
        if (b > o.max_batch) continue;
        auto sim = simulate_with(profile, warmup, b, w);
        const std::uint64_t errors = sim.arrivals - sim.ok;
        if (!best || errors < best->second.errors ||
            (errors == best->second.errors && sim.p95 < best->first.p95)) {
          best.emplace(sim, record_of(sim, "best-static", w, b));
        }
      }
    }
    return *best;
  };
  std::filesystem::create_directories(o.out);
  const std::string sub = "simulated: " + subtitle(o);
  std::vector<std::string> written;
  if (!o.sweep.empty()) {
    tailbatch::SweepResult sweep;
    sweep.slo_p95_ms = o.slo_p95_ms;
    std::vector<double> rates = o.sweep;
    std::sort(rates.begin(), rates.end());
    bool all_ok = true;
    for (std::size_t i = 0; i < rates.size(); ++i) {
      const auto [sim, rec] =
          run_at(tailbatch::LoadProfile::steady(process, rates[i], from_s(o.duration_s)),
                 from_s(o.warmup_s));
      if (o.json) fmt::print("{}\n", to_json(rec));
      tailbatch::SweepPoint p;
      p.offered_rps = rates[i];
      p.result = as_load_result(sim);
      p.verdict =
          tailbatch::tools::detail::sweep_verdict(p.result, o.slo_p95_ms, 0.01, p.meets_slo);
      p.verdict += fmt::format(" (mean batch {:.1f})", sim.mean_batch_size);
      if (o.policy == "best-static")
        p.verdict += fmt::format(" [window {} ms, max_batch {}]", rec.window_ms, rec.max_batch);
      sweep.points.push_back(std::move(p));
      if (sweep.points.back().meets_slo && all_ok) sweep.saturation = i;
      if (!sweep.points.back().meets_slo) all_ok = false;
    }
    if (!o.json) fmt::print("{}\n\n{}", sub, tailbatch::format_sweep_table(sweep));
    const std::string lat = (std::filesystem::path(o.out) / "latency_vs_load.svg").string();
    tailbatch::write_svg(
        lat, tailbatch::latency_vs_load_plot(sweep, "Latency vs offered load (simulated)", sub));
    written.push_back(lat);
  } else {
    const auto profile = o.steps.empty()
                             ? tailbatch::LoadProfile::steady(process, o.rate, from_s(o.duration_s))
                             : parse_steps(o.steps, process);
    const auto warmup =
        from_s(o.warmup_s) < profile.duration() ? from_s(o.warmup_s) : nanoseconds(0);
    auto [sim, rec] = run_at(profile, warmup);
    rec.tenants = tenant_rows(sim, o);
    if (o.json) {
      fmt::print("{}\n", to_json(rec));
    } else {
      fmt::print("{}\n\n{}", sub, tailbatch::format_load_result(as_load_result(sim)));
      if (o.policy == "best-static")
        fmt::print("best static: window {} ms, max_batch {} (lowest p95 of the grid)\n",
                   rec.window_ms, rec.max_batch);
      fmt::print(
          "mean batch {:.1f}; lanes busy {:.0f} % of the time; {:.1f} requests in flight on "
          "average (at most {})\n",
          sim.mean_batch_size, sim.lane_utilization * 100.0, sim.mean_in_flight, sim.max_in_flight);
      fmt::print("p95 {} the SLO of {} ms; goodput (ok within it) {:.1f} requests/s\n",
                 ms_of(sim.p95) <= o.slo_p95_ms ? "meets" : "misses", o.slo_p95_ms,
                 sim.goodput_rps);
      if (!o.tenants.empty())
        fmt::print("{}", tailbatch_load::tenants_table(rec.tenants, o.slo_p95_ms));
    }
  }
  if (!written.empty()) {
    if (o.json) {
      for (const auto& w : written) fmt::print(stderr, "plot: {}\n", w);
    } else {
      fmt::print("\nplots:\n");
      for (const auto& w : written) fmt::print("  {}\n", w);
    }
  }
  return 0;
}

// How a run was made, as a trace's setup records it (and a replay reads it back).
std::map<std::string, std::string> trace_setup(const Options& o) {
  std::map<std::string, std::string> s;
  s["policy"] = o.policy;
  s["lanes"] = std::to_string(o.lanes);
  s["max_batch"] = std::to_string(o.max_batch);
  s["window_ms"] = fmt::format("{}", o.window_ms);
  s["slo_p95_ms"] = fmt::format("{}", o.slo_p95_ms);
  s["queue"] = std::to_string(o.queue_capacity);
  s["model"] = o.model;
  if (o.model == "sleep") {
    s["base_ms"] = fmt::format("{}", o.base_ms);
    s["per_item_ms"] = fmt::format("{}", o.per_item_ms);
  }
  s["arrivals"] = o.arrivals;
  if (!o.steps.empty()) {
    std::string steps = o.steps;
    steps.erase(
        std::remove_if(steps.begin(), steps.end(), [](char c) { return c == ' ' || c == '\t'; }),
        steps.end());
    s["steps"] = steps;
  } else {
    s["rate"] = fmt::format("{}", o.rate);
  }
  s["duration_s"] = fmt::format("{}", o.duration_s);
  s["warmup_s"] = fmt::format("{}", o.warmup_s);
  s["seed"] = std::to_string(o.seed);
  return s;
}

// --simulate --replay FILE: the trace's arrivals through the simulator under the recorded
// policy and the recorded costs, predicted against measured; and the simulator alone (the
// recorded median cost per size, arrivals at the intended times, nothing else put back).
int run_replay(const Options& o) {
  std::ifstream f(o.replay);
  if (!f) throw std::invalid_argument("--replay: cannot open " + o.replay);
  const tailbatch::LoadTrace t = tailbatch::read_trace(f);
  Options rec = o;
  rec.policy = t.text("policy", "fixed");
  if (rec.policy != "fixed" && rec.policy != "adaptive")
    throw std::invalid_argument("--replay: the trace's policy \"" + rec.policy +
                                "\" cannot be replayed (fixed or adaptive)");
  rec.max_batch = static_cast<std::size_t>(std::max(1.0, t.number("max_batch", 1.0)));
  rec.window_ms = t.number("window_ms", 0.0);
  rec.slo_p95_ms = t.number("slo_p95_ms", o.slo_p95_ms);
  rec.lanes = static_cast<std::size_t>(std::max(1.0, t.number("lanes", 1.0)));
  tailbatch::ReplayConfig full;
  full.seed = o.seed;
  const auto rr = tailbatch::replay_trace(t, make_policy(rec, rec.max_batch, rec.window_ms), full);
  tailbatch::ReplayConfig plain{false, false, false, false, o.seed};
  const auto bare =
      tailbatch::replay_trace(t, make_policy(rec, rec.max_batch, rec.window_ms), plain);
  const tailbatch::TraceBreakdown bd = tailbatch::trace_breakdown(t);
  if (o.json) {
    fmt::print(
        "{{\"policy\": \"{}\", \"model\": \"{}\", \"offered_rps\": {:.3f}, \"requests\": {}, "
        "\"batches\": {}, "
        "\"measured_p50_ms\": {:.3f}, \"measured_p95_ms\": {:.3f}, \"measured_p99_ms\": {:.3f}, "
        "\"predicted_p50_ms\": {:.3f}, \"predicted_p95_ms\": {:.3f}, \"predicted_p99_ms\": {:.3f}, "
        "\"plain_p50_ms\": {:.3f}, \"plain_p95_ms\": {:.3f}, \"plain_p99_ms\": {:.3f}}}\n",
        rec.policy, t.text("model", "?"), rr.predicted.offered_rps, rr.measured_ok,
        t.batches.size(), rr.measured_p50_ms, rr.measured_p95_ms, rr.measured_p99_ms,
        rr.predicted_p50_ms, rr.predicted_p95_ms, rr.predicted_p99_ms, bare.predicted_p50_ms,
        bare.predicted_p95_ms, bare.predicted_p99_ms);
    return 0;
  }
  fmt::print(
      "replay of {}: {} policy ({}), {} lane{}, model {}; {} measured requests, {} batches, {:.0f} "
      "rps offered\n\n",
      o.replay, rec.policy, policy_text(rec), rec.lanes, rec.lanes == 1 ? "" : "s",
      t.text("model", "?"), rr.measured_ok, t.batches.size(), rr.predicted.offered_rps);
  auto err = [](double p, double m) {
    return m > 0 ? fmt::format("{:+.0f} %", (p - m) / m * 100.0) : std::string("-");
  };
  fmt::print("  {:>4} {:>10} {:>10} {:>7} {:>10} {:>7}\n", "", "measured", "predicted", "error",
             "simulator", "error");
  fmt::print("  {:>4} {:>10} {:>10} {:>7} {:>10} {:>7}\n", "", "ms", "ms", "", "alone, ms", "");
  const double m[] = {rr.measured_p50_ms, rr.measured_p95_ms, rr.measured_p99_ms};
  const double p[] = {rr.predicted_p50_ms, rr.predicted_p95_ms, rr.predicted_p99_ms};
  const double b[] = {bare.predicted_p50_ms, bare.predicted_p95_ms, bare.predicted_p99_ms};
  const char* names[] = {"p50", "p95", "p99"};
  for (int i = 0; i < 3; ++i)
    fmt::print("  {:>4} {:>10.3f} {:>10.3f} {:>7} {:>10.3f} {:>7}\n", names[i], m[i], p[i],
               err(p[i], m[i]), b[i], err(b[i], m[i]));
  fmt::print(
      "\n(predicted: recorded model times drawn per batch size, with the close-to-start, delivery "
      "and send lags\n"
      " measured in the trace put back; simulator alone: the median recorded time per size, "
      "nothing else)\n");
  fmt::print(
      "\nwhere the measured latency went (ms, per measured request){}\n",
      bd.matched ? "" : ": the batches do not account for the requests (not FIFO?); total only");
  fmt::print("  {:<32} {:>8} {:>8} {:>8} {:>8}\n", "part", "p50", "p95", "p99", "mean");
  auto row = [](const char* name, const tailbatch::TracePart& x) {
    fmt::print("  {:<32} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}\n", name, x.p50_ms, x.p95_ms, x.p99_ms,
               x.mean_ms);
  };
  row("total (intended -> completed)", bd.total);
  if (bd.matched) {
    row("send (intended -> submitted)", bd.send);
    row("queue (submitted -> closed)", bd.queue);
    row("dispatch (closed -> model call)", bd.dispatch);
    row("model call", bd.model);
    row("delivery (model end -> outcome)", bd.delivery);
    if (rec.policy == "fixed") row("window closes: past the window", bd.window_lateness);
  }
  return 0;
}

template <class PipelineT>
int run(const Options& o, PipelineT& pipeline, tailbatch::TraceRecorder* recorder) {
  const auto process = o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant
                                                : tailbatch::ArrivalProcess::poisson;
  // Per-tenant (and, without --tenant-mix, whole-run) outcomes of the current run: replaced
  // per run, held by each callback so that a late completion finds it alive.
  const std::size_t tenant_count = std::max<std::size_t>(1, o.tenants.size());
  const tailbatch_load::TenantSplit split(o.tenants, o.seed);
  std::shared_ptr<tailbatch_load::TenantTally> tally;
  auto new_tally = [&] {
    tally = std::make_shared<tailbatch_load::TenantTally>(tenant_count, from_ms(o.slo_p95_ms));
  };
  new_tally();
  // Submits request i; with --record, notes when it was meant to go, went, and came back.
  auto target = [&pipeline, recorder, &tally, &split, &o](std::uint64_t i,
                                                          tailbatch::LoadCompletion done) {
    if (recorder != nullptr)
      recorder->submitted(i, done.intended(), steady_clock::now(), done.measured());
    const std::size_t t = o.tenants.empty() ? 0 : split.tenant_of(i);
    tailbatch::SubmitOptions so;
    so.tenant = o.tenants.empty() ? 0 : static_cast<tailbatch::TenantId>(t + 1);
    so.timeout = from_ms(o.request_timeout_ms);
    pipeline.submit(Request{i}, so, [done, recorder, i, t, tal = tally](auto&& outcome) noexcept {
      const tailbatch::Status s = outcome.status();
      if (recorder != nullptr) recorder->completed(i, s, steady_clock::now());
      if (done.measured()) tal->record(t, s, steady_clock::now() - done.intended());
      done(s);
    });
  };
  // The goodput and the tenants' rows of the run just ended.
  auto finish_record = [&](RunRecord rec, const tailbatch::LoadResult& r) {
    const double window_s = duration<double>(r.measured_window).count();
    rec.goodput_rps = window_s > 0 ? static_cast<double>(tally->good()) / window_s : 0.0;
    if (!o.tenants.empty())
      rec.tenants = tally->rows(o.tenants, std::max(o.duration_s - o.warmup_s, 1e-9), window_s);
    return rec;
  };
  tailbatch::LoadConfig base;
  base.warmup = from_s(o.warmup_s);
  base.seed = o.seed;
  base.drain_timeout = seconds(10);
  if (!o.quiet) {
    base.progress = tailbatch::progress_to(std::cerr);
    // A line a second; at least two per run on short runs.
    base.progress_interval = std::min<nanoseconds>(seconds(1), from_s(o.duration_s / 2.0));
  }
  // Requests per batch over one run, from the Pipeline's counters (warm-up included).
  auto mean_batch_since = [&](const tailbatch::PipelineStats& before) {
    const tailbatch::PipelineStats now = pipeline.stats();
    const std::uint64_t batches = now.batches() - before.batches();
    return batches ? static_cast<double>(now.batched_requests - before.batched_requests) /
                         static_cast<double>(batches)
                   : 0.0;
  };
  std::filesystem::create_directories(o.out);
  std::vector<std::string> written;

  if (!o.sweep.empty()) {
    // One rate at a time, as run_sweep runs them (ascending, the seed plus the rate's index,
    // stopping after the first rate that fails, a pause between), so that each rate's
    // batches are counted on their own.
    tailbatch::SweepResult sweep;
    sweep.slo_p95_ms = o.slo_p95_ms;
    std::vector<double> rates = o.sweep;
    std::sort(rates.begin(), rates.end());
    for (std::size_t i = 0; i < rates.size(); ++i) {
      tailbatch::LoadConfig one = base;
      one.profile = tailbatch::LoadProfile::steady(process, rates[i], from_s(o.duration_s));
      one.seed = o.seed + i;
      one.label = fmt::format("load {:.0f} rps {}/{}", rates[i], i + 1, rates.size());
      const tailbatch::PipelineStats before = pipeline.stats();
      tailbatch::SweepPoint p;
      p.offered_rps = rates[i];
      new_tally();
      p.result = tailbatch::run_load(one, target);
      p.verdict =
          tailbatch::tools::detail::sweep_verdict(p.result, o.slo_p95_ms, 0.01, p.meets_slo);
      if (o.json)
        fmt::print("{}\n", to_json(finish_record(record_of(p.result, o.policy, o.window_ms,
                                                           o.max_batch, mean_batch_since(before)),
                                                 p.result)));
      const bool met = p.meets_slo;
      sweep.points.push_back(std::move(p));
      if (met && (i == 0 || sweep.saturation == i - 1)) sweep.saturation = i;
      if (!met) break;
      if (i + 1 < rates.size()) std::this_thread::sleep_for(milliseconds(200));
    }
    if (!o.json) fmt::print("{}\n\n{}", subtitle(o), tailbatch::format_sweep_table(sweep));
    const std::string lat = (std::filesystem::path(o.out) / "latency_vs_load.svg").string();
    tailbatch::write_svg(
        lat, tailbatch::latency_vs_load_plot(sweep, "Latency vs offered load", subtitle(o)));
    written.push_back(lat);
    const std::string thr = (std::filesystem::path(o.out) / "throughput_vs_load.svg").string();
    tailbatch::write_svg(
        thr, tailbatch::throughput_vs_load_plot({&sweep}, {"achieved"},
                                                "Throughput vs offered load", subtitle(o)));
    written.push_back(thr);
    // p95 over time at the saturation point (or the lowest rate when none met the SLO).
    const auto& shown = sweep.saturation_point() ? *sweep.saturation_point() : sweep.points.front();
    const std::string over = (std::filesystem::path(o.out) / "p95_over_time.svg").string();
    tailbatch::write_svg(
        over, tailbatch::latency_over_time_plot(
                  shown.result, o.slo_p95_ms,
                  fmt::format("Latency over time at {:.0f} rps offered", shown.offered_rps),
                  subtitle(o)));
    written.push_back(over);
  } else {
    tailbatch::LoadConfig one = base;
    one.profile = o.steps.empty()
                      ? tailbatch::LoadProfile::steady(process, o.rate, from_s(o.duration_s))
                      : parse_steps(o.steps, process);
    if (one.warmup >= one.profile.duration()) one.warmup = nanoseconds(0);
    const tailbatch::PipelineStats before = pipeline.stats();
    auto r = tailbatch::run_load(one, target);
    if (recorder != nullptr) {
      std::ofstream f(o.record);
      write_trace(f, recorder->take(trace_setup(o)));
      f.close();
      if (!f) throw std::runtime_error("--record: cannot write " + o.record);
      fmt::print(stderr, "trace: {}\n", o.record);
    }
    const RunRecord rec = finish_record(
        record_of(r, o.policy, o.window_ms, o.max_batch, mean_batch_since(before)), r);
    if (o.json) {
      fmt::print("{}\n", to_json(rec));
    } else {
      fmt::print("{}\n\n{}", subtitle(o), tailbatch::format_load_result(r));
      fmt::print("p95 {} the SLO of {} ms; goodput (ok within it) {:.1f} requests/s\n",
                 ms_of(r.p95) <= o.slo_p95_ms ? "meets" : "misses", o.slo_p95_ms,
                 rec.goodput_rps);
      if (!o.tenants.empty())
        fmt::print("{}", tailbatch_load::tenants_table(rec.tenants, o.slo_p95_ms));
    }
    const std::string over = (std::filesystem::path(o.out) / "p95_over_time.svg").string();
    tailbatch::write_svg(
        over, tailbatch::latency_over_time_plot(r, o.slo_p95_ms, "Latency over time", subtitle(o)));
    written.push_back(over);
  }
  if (o.json) {
    for (const auto& w : written) fmt::print(stderr, "plot: {}\n", w);
  } else {
    fmt::print("\nplots:\n");
    for (const auto& w : written) fmt::print("  {}\n", w);
  }
  return 0;
}

// --model generator and the generation workload flags: what is wrong with them for this run
// ("" when nothing).
std::string generation_check(const Options& o, const tailbatch_load::GenerationCli& gen, bool url,
                             bool mix_replay_or_record) {
  const bool generator = o.model == "generator";
  if (generator && !o.simulate && !url)
    return "--model generator is simulated: add --simulate (or load tailbatch-serve's "
           "/v1/completions with --url and --output-len, --prompt-len, --shared-prefix)";
  if (generator && o.simulate && mix_replay_or_record)
    return "--model generator: --tenant-mix, --replay and --record are not supported with it";
  return tailbatch_load::generation_flags_error(gen, generator && o.simulate, url);
}

// Whether --url was given (false in a build without the HTTP mode).
bool http_url_given([[maybe_unused]] const CLI::App& app) {
#ifdef TAILBATCH_LOAD_HTTP
  return app.get_option("--url")->count() > 0;
#else
  return false;
#endif
}

// The arrivals a run is expected to send: the profile's mean count with room for Poisson
// spread (the --url bodies to draw; they are cycled past it).
std::size_t expected_requests(const Options& o) {
  const auto process = o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant
                                                : tailbatch::ArrivalProcess::poisson;
  double n = 0;
  if (!o.steps.empty()) {
    const auto p = parse_steps(o.steps, process);
    n = p.expected_arrivals(nanoseconds(0), p.duration());
  } else {
    for (const double r : o.sweep.empty() ? std::vector<double>{o.rate} : o.sweep)
      n = std::max(n, r * o.duration_s);
  }
  return static_cast<std::size_t>(std::clamp(n * 1.1 + 16.0, 16.0, 20000.0));
}

// --simulate --model generator: a sweep's rates, or one run (--rate, --steps).
int run_generation(const Options& o, const tailbatch_load::GenerationCli& gen) {
  const auto process = o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant
                                                : tailbatch::ArrivalProcess::poisson;
  std::vector<tailbatch::LoadProfile> profiles;
  if (!o.sweep.empty()) {
    std::vector<double> rates = o.sweep;
    std::sort(rates.begin(), rates.end());
    for (const double r : rates)
      profiles.push_back(tailbatch::LoadProfile::steady(process, r, from_s(o.duration_s)));
  } else if (!o.steps.empty()) {
    profiles.push_back(parse_steps(o.steps, process));
  } else {
    profiles.push_back(tailbatch::LoadProfile::steady(process, o.rate, from_s(o.duration_s)));
  }
  return tailbatch_load::run_generation_simulated(gen, profiles, o.seed, o.slo_p95_ms, o.json);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tailbatch-load: open-loop load (Poisson or constant arrivals) against a synthetic model "
      "behind a tailbatch Pipeline; latency from each request's intended send time."};
  Options o;
  const CLI::Validator positive = number_check(0.0, true);
  const CLI::Validator non_negative = number_check(0.0, false);
  app.add_option("--base-ms", o.base_ms, "model time for a batch of 1, ms")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--per-item-ms", o.per_item_ms, "model time per extra item, ms")
      ->capture_default_str()
      ->check(non_negative);
  app.add_option("--lanes", o.lanes, "lanes (streams) running batches at once")
      ->capture_default_str()
      ->check(count_check(1, 64));
  app.add_option("--max-batch", o.max_batch,
                 "max_batch (fixed), hard cap (adaptive), largest size searched (best-static); 1: "
                 "batching off")
      ->capture_default_str()
      ->check(count_check(1, 4096));
  app.add_option("--window-ms", o.window_ms, "FixedWindow max_wait, ms (policy fixed)")
      ->capture_default_str()
      ->check(non_negative);
  app.add_option("--policy", o.policy,
                 "batch policy: fixed, adaptive, or best-static (with --simulate)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fixed", "adaptive", "best-static"}));
  app.add_option("--network-ms", o.network_ms,
                 "fixed delay added to every request's latency, holding no lane (--simulate)")
      ->capture_default_str()
      ->check(non_negative);
  app.add_option("--max-in-flight", o.max_in_flight, "static concurrency cap (0: none)")
      ->capture_default_str()
      ->check(count_check(0, 1000000));
  app.add_option("--queue", o.queue_capacity, "the Pipeline's queue capacity")
      ->capture_default_str()
      ->check(count_check(1, 100000000));
  app.add_option("--arrivals", o.arrivals, "arrival process")
      ->capture_default_str()
      ->check(CLI::IsMember({"poisson", "constant"}));
  auto* rate =
      app.add_option("--rate", o.rate, "one run at this offered rate, requests/s")->check(positive);
  auto* sweep = app.add_option("--sweep", o.sweep, "a QPS sweep over these rates, e.g. 100,200,300")
                    ->delimiter(',')
                    ->check(positive);
  auto* steps = app.add_option("--steps", o.steps,
                               "one run of rate phases RATE:SECONDS,..., e.g. 100:5,400:3,100:5");
  app.add_option("--duration", o.duration_s, "seconds per run (per sweep rate), warm-up included")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--warmup", o.warmup_s, "seconds of warm-up not counted")
      ->capture_default_str()
      ->check(non_negative);
  app.add_option("--slo-p95-ms", o.slo_p95_ms, "p95 SLO, ms (and the adaptive policy's target)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--out", o.out, "directory for the SVG plots")->capture_default_str();
  app.add_option("--seed", o.seed, "arrival seed")->capture_default_str();
  app.add_flag("--quiet", o.quiet, "no progress lines on stderr");
  app.add_flag("--json", o.json, "one JSON object per run on stdout instead of the tables");
  app.add_flag(
      "--simulate", o.simulate,
      "predict instead of measuring: the same Pipeline and window, simulated on a modelled clock");
  app.add_option("--model", o.model,
                 "live model: sleep (L(b) from --base-ms, --per-item-ms) or classifier (the "
                 "reference classifier, real CPU work); with --simulate, generator: continuous "
                 "batching of generation with a KV cache (--kv-*, --output-len, --shared-prefix)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sleep", "classifier", "generator"}));
  auto* record =
      app.add_option("--record", o.record,
                     "live --rate or --steps run: write its trace (requests and batches) to FILE");
  auto* replay =
      app.add_option("--replay", o.replay,
                     "with --simulate: replay a trace written by --record, predicted vs measured");
  auto* mix = app.add_option(
      "--tenant-mix", o.tenant_mix,
      "tenants offering load at once, NAME:RATE[:WEIGHT],..., e.g. a:300,b:50,c:50 (the run's "
      "rate is their sum; each request's tenant is drawn by rate); reports each tenant's "
      "p50/p95/p99 and goodput");
  app.add_option("--scheduling", o.scheduling,
                 "how the Pipeline picks the next request across tenants: fifo or fair (virtual "
                 "counters, by weight); in-process and --simulate")
      ->capture_default_str()
      ->check(CLI::IsMember({"fifo", "fair"}));
  app.add_option("--queue-policy", o.queue_policy,
                 "the Pipeline queue under overload: reject-newest, shed-oldest, adaptive-lifo or "
                 "codel; in-process and --simulate")
      ->capture_default_str()
      ->check(CLI::IsMember({"reject-newest", "shed-oldest", "adaptive-lifo", "codel"}));
  app.add_option("--codel-target-ms", o.codel_target_ms,
                 "codel: the standing queue wait it keeps below (sheds what waited twice this); "
                 "adaptive-lifo: the wait past which a queue has formed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--codel-interval-ms", o.codel_interval_ms,
                 "codel: the window over which the minimum wait is taken (> the target)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tenant-max-queued", o.tenant_max_queued,
                 "every tenant's quota of requests waiting in the queue (more: quota_exceeded, "
                 "429); 0: none; in-process and --simulate")
      ->capture_default_str()
      ->check(count_check(0, 100000000));
  app.add_option("--request-timeout-ms", o.request_timeout_ms,
                 "each request's deadline, ms after its arrival (a client that gives up): not "
                 "started by then, it completes deadline_exceeded; 0: none; in-process and "
                 "--simulate")
      ->capture_default_str()
      ->check(non_negative);
  tailbatch_load::GenerationCli gen;  // --model generator and the generation workload flags
  tailbatch_load::add_generation_options(app, gen);
  rate->excludes(sweep)->excludes(steps);
  sweep->excludes(steps);
  mix->excludes(rate)->excludes(sweep)->excludes(steps);
#ifdef TAILBATCH_LOAD_HTTP
  tailbatch_load_http::HttpCli http;
  app.add_option("--url", http.url,
                 "HTTP mode: open-loop load against http://HOST:PORT/PATH (loopback only unless "
                 "--allow-remote)");
  app.add_option("--method", http.method, "HTTP mode: request method")->capture_default_str();
  app.add_option("--body", http.body, "HTTP mode: request body");
  app.add_option("--body-file", http.body_file,
                 "HTTP mode: a file of bodies, one per line, cycled");
  app.add_option("--header", http.headers,
                 "HTTP mode: a request header \"Name: value\" (repeatable)");
  app.add_option("--connections", http.connections, "HTTP mode: at most this many open connections")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option(
         "--timeout-s", http.timeout_s,
         "HTTP mode: a request unanswered this long after its intended send time is a timeout")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--allow-remote", http.allow_remote,
               "HTTP mode: allow a host that is not a loopback address");
#else
  app.footer(
      "This build has no --url (HTTP) mode: Boost (Beast/Asio) was not found when it was "
      "configured.");
#endif

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }
  if (const std::string why = generation_check(o, gen, http_url_given(app), *mix || *replay || *record);
      !why.empty()) {
    fmt::print(stderr, "tailbatch-load: error: {}\n", why);
    return 1;
  }
  if (*replay && !o.simulate) {
    fmt::print(stderr, "tailbatch-load: error: --replay runs the simulator: add --simulate\n");
    return 1;
  }
  if (*record && (o.simulate || *sweep)) {
    fmt::print(stderr,
               "tailbatch-load: error: --record records one live run: give --rate or --steps, "
               "without --simulate\n");
    return 1;
  }
  if (o.simulate && *replay) {
    try {
      return run_replay(o);
    } catch (const std::invalid_argument& e) {
      fmt::print(stderr, "tailbatch-load: error: {}\n", e.what());
      return 1;
    }
  }
  if (*mix) {
    try {
      o.tenants = tailbatch_load::parse_tenant_mix(o.tenant_mix);
    } catch (const std::invalid_argument& e) {
      fmt::print(stderr, "tailbatch-load: error: {}\n", e.what());
      return 1;
    }
    o.rate = tailbatch_load::TenantSplit(o.tenants, o.seed).total_rate();
  }
  if (!*rate && !*sweep && !*steps && !*mix) {
    fmt::print(stderr,
               "tailbatch-load: error: give --rate, --sweep or --steps\nRun with --help for more "
               "information.\n");
    return 1;
  }
  if (o.policy == "best-static" && !o.simulate) {
    fmt::print(
        stderr,
        "tailbatch-load: error: --policy best-static searches by simulation: add --simulate\n");
    return 1;
  }
  if (o.network_ms > 0 && !o.simulate) {
    fmt::print(
        stderr,
        "tailbatch-load: error: --network-ms is modelled by the simulator only: add --simulate\n");
    return 1;
  }
  if (*steps && o.steps.find_first_not_of(" \t") == std::string::npos) {
    fmt::print(
        stderr,
        "tailbatch-load: error: --steps: empty; give RATE:SECONDS phases, as in 100:5,400:3\n");
    return 1;
  }
  if (o.warmup_s >= o.duration_s && (*rate || *sweep || *mix) &&
      !(o.simulate && o.model == "generator")) {  // the generation simulator has no warm-up
    fmt::print(stderr,
               "tailbatch-load: error: --warmup ({} s) must be shorter than --duration ({} s)\n",
               o.warmup_s, o.duration_s);
    return 1;
  }

  try {
#ifdef TAILBATCH_LOAD_HTTP
    if (!http.url.empty()) {
      if (!o.record.empty())
        throw std::invalid_argument(
            "--record with --url: not supported yet (the server's batches are not visible to the "
            "client)");
      tailbatch_load_http::CommonRun c{o.rate,     o.sweep,      std::nullopt, o.duration_s,
                                       o.warmup_s, o.slo_p95_ms, o.arrivals,   o.seed,
                                       o.out,      o.quiet,      o.json,       o.tenants};
      if (!o.steps.empty())
        c.steps =
            parse_steps(o.steps, o.arrivals == "constant" ? tailbatch::ArrivalProcess::constant
                                                          : tailbatch::ArrivalProcess::poisson);
      if (gen.workload_given())
        http.generated_bodies = tailbatch_load::completion_bodies(gen, o.seed, expected_requests(o));
      return tailbatch_load_http::run_http(http, c);
    }
#endif
    if (o.simulate && o.model == "generator") return run_generation(o, gen);
    if (o.simulate) return run_simulated(o);
    const tailbatch::LinearCost cost{from_ms(o.base_ms), from_ms(o.per_item_ms)};
    // --model classifier: the reference classifier on the reviews of a fixed corpus.
    struct Classifier {
      tailbatch::reference::Classifier clf;
      tailbatch::reference::ClassifierModel model{clf};
      std::vector<std::string> corpus = tailbatch::reference::review_corpus(4096);
    };
    std::shared_ptr<const Classifier> classifier;
    if (o.model == "classifier") classifier = std::make_shared<const Classifier>();
    auto model = [cost, classifier](std::span<const Request> reqs, std::span<Response> resps,
                                    tailbatch::HostLane&) {
      if (classifier) {
        std::vector<std::string> texts;
        texts.reserve(reqs.size());
        for (const Request& r : reqs)
          texts.push_back(classifier->corpus[r.id % classifier->corpus.size()]);
        std::vector<tailbatch::reference::Prediction> out(reqs.size());
        classifier->model.run_on_cpu(texts, out);
      } else {
        std::this_thread::sleep_for(cost(reqs.size()));
      }
      for (std::size_t i = 0; i < reqs.size(); ++i) resps[i].id = reqs[i].id;
    };
    std::unique_ptr<tailbatch::TraceRecorder> recorder;
    if (!o.record.empty()) recorder = std::make_unique<tailbatch::TraceRecorder>();
    const LivePolicy policy(make_policy(o, o.max_batch, o.window_ms), recorder.get());
    tailbatch::PipelineConfig<Request> pc;
    pc.queue_capacity = o.queue_capacity;
    pc.tenants = tenants_config(o);
    pc.queue = queue_config(o);
    tailbatch::HostLanes lanes(o.lanes);
    if (o.max_in_flight > 0) {
      tailbatch::ConcurrencyLimiter<tailbatch::StaticLimit> limiter{
          tailbatch::StaticLimit(static_cast<std::uint32_t>(o.max_in_flight))};
      tailbatch::Pipeline<Request, Response, LivePolicy, tailbatch::HostLanes,
                          tailbatch::ConcurrencyLimiter<tailbatch::StaticLimit>>
          pipeline(model, policy, pc, lanes, limiter);
      return run(o, pipeline, recorder.get());
    }
    tailbatch::Pipeline<Request, Response, LivePolicy, tailbatch::HostLanes> pipeline(model, policy,
                                                                                      pc, lanes);
    return run(o, pipeline, recorder.get());
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "tailbatch-load: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tailbatch-load: error: {}\n", e.what());
    return 2;
  }
}
