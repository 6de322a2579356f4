// before_after_demo: dynamic batching, before and after, on a real model on this machine.
//
// The reference text classifier (tailbatch/reference) runs behind a tailbatch Pipeline.
// The demo sweeps the offered load (open loop, Poisson arrivals, latency from each
// request's intended send time) with three setups: batching off (max_batch 1, no window),
// a fixed dynamic window, and the AdaptiveWindow (told only the SLO and the max batch),
// interleaved: at each rate the three run back to back (the fixed and the adaptive window
// taking turns to go first), so that the machine's drift falls on them alike; each setup's
// sweep stops at its own first rate over the SLO. It says where adaptive met or missed the
// fixed window it ran beside. For each rate
// it prints p50/p95/p99, the achieved throughput and the cost (process CPU milliseconds per
// completed request), finds each setup's saturation point, and answers the latency field guide's
// practical project ("show p50/p95 before and after") and mini challenge ("reduce p95 by 20 %
// without increasing cost per request") with a verdict computed from these measurements. It writes
// SVG plots and prints their paths.
//
//   before_after_demo [--out DIR] [--quick] [--slo-p95-ms 50] [--window-ms 0.5] [--max-batch 32]
//                     [--rates 800,1600,...] [--results FILE] [--adaptive-first]
//                     [--step-s 2.5] [--control]
//
// --control runs a second fixed window (the same max_batch and window) in the adaptive
// window's place: an A/A run, whose "met/missed" line shows how far two runs of one setup
// differ on this machine, the noise floor under the adaptive window's goals.
//
// Under the adaptive window's table, "planner vs measured" shows at each rate the plan in
// force at the step's end (the rate it was made for, its batch size and window) and the
// p95 its planner predicted for it and for the fixed window at that rate
// (AdaptiveWindow::plan and predict), beside the p95 each measured. --results FILE
// writes one JSON object per rate (the fixed and the adaptive window's p95, CPU per
// request, mean batch and whether each met the SLO, and these planner figures with the
// cost of a batch of one it had learned, null under --control), then one with both
// saturation rates; benchmarks/adaptive/live.sh and live_bands.py read it.
//
// The window: the latency field guide's 2-10 ms is for a model that takes ~20 ms per batch; the
// reference classifier takes ~1 ms at batch 1 on a CPU, so the demo scales the window down with it.
//
// It takes about a minute and a half (up to three on a busy 2-core machine); --quick
// takes ~25 s.
#include <fmt/core.h>
#include <sys/resource.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tailbatch/adaptive_window.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/policy_variant.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/corpus.hpp>
#include <tailbatch/tools/load_generator.hpp>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono;
using tailbatch::reference::Classifier;
using tailbatch::reference::ClassifierModel;
using tailbatch::reference::Prediction;

double ms(nanoseconds d) { return duration<double, std::milli>(d).count(); }

// CPU time of the whole process (every thread: load generator, Pipeline, model), seconds.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// CPU time of the calling thread, nanoseconds.
std::int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One measured rate of one setup.
struct Row {
  double offered = 0.0;
  tailbatch::LoadResult result;
  double cpu_ms_per_req = 0.0;        // process CPU per ok request
  double model_cpu_ms_per_req = 0.0;  // the model's threads only
  double mean_batch = 0.0;
  // The adaptive window's setup only, read at the end of the step: the plan in force and
  // what the planner predicts for the fixed window it is compared with, at the step's rate
  // (AdaptiveWindow::plan and predict): how far its model of the lanes is from the live run.
  std::optional<tailbatch::AdaptivePlan> plan;
  double predicted_fixed_p95_ms = 0.0;
  double learned_l1_ms = 0.0;  // the cost of a batch of one the planner had learned
  bool meets = false;
  std::string verdict;
};

struct Setup {
  std::string name;
  std::size_t max_batch = 1;
  nanoseconds window{0};
  std::vector<Row> rows;
  std::optional<std::size_t> saturation;
  // Set: the AdaptiveWindow (p95 target and cap) instead of a FixedWindow.
  std::optional<tailbatch::AdaptiveWindow> adaptive{};
  // With adaptive: the fixed window it is compared with (its predictions for it are kept).
  nanoseconds compared_window{0};
};

// A FixedWindow or an AdaptiveWindow behind one type (tailbatch::PolicyVariant): one
// Pipeline type serves every setup, and executed-batch reports reach the adaptive window.
using DemoPolicy = tailbatch::PolicyVariant<tailbatch::FixedWindow, tailbatch::AdaptiveWindow>;

DemoPolicy policy_of(const Setup& s) {
  if (s.adaptive) return *s.adaptive;
  return tailbatch::FixedWindow(s.max_batch, s.window);
}

// The model's time for a batch of b alone on this machine (median of a few calls), ms.
double time_batch(const ClassifierModel& model, const std::vector<std::string>& corpus,
                  std::size_t b, int reps) {
  std::vector<Prediction> out(b);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = steady_clock::now();
    model.run_on_cpu(std::span<const std::string>(corpus.data() + (i * b) % (corpus.size() - b), b),
                     out);
    t.push_back(duration<double, std::milli>(steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// What a setup completes per second when n requests arrive at once: its capacity through
// the whole Pipeline (queue, workers, completions) on this machine as it is right now.
double burst_capacity(const ClassifierModel& model, const std::vector<std::string>& corpus,
                      std::size_t lanes_n, std::size_t max_batch, nanoseconds window,
                      std::size_t n) {
  tailbatch::HostLanes lanes(lanes_n);
  tailbatch::PipelineConfig<std::string> pc;
  pc.queue_capacity = n + 1;
  tailbatch::Pipeline<std::string, Prediction> pipeline(
      model, tailbatch::FixedWindow(max_batch, window), pc, lanes);
  std::atomic<std::size_t> done{0};
  const auto t0 = steady_clock::now();
  for (std::size_t i = 0; i < n; ++i)
    pipeline.submit(corpus[i % corpus.size()],
                    [&done](tailbatch::Outcome<Prediction>&&) noexcept { ++done; });
  while (done.load() < n && steady_clock::now() - t0 < seconds(30))
    std::this_thread::sleep_for(milliseconds(1));
  return static_cast<double>(done.load()) / duration<double>(steady_clock::now() - t0).count();
}

// One setup's Pipeline, kept from the first rate to the last (the AdaptiveWindow carries
// what it learned from one rate to the next, as it would in a server), and its measured
// steps. Held by pointer: the model wrapper refers to the counters by address.
class SetupRun {
 public:
  SetupRun(Setup& setup, const ClassifierModel& model, const std::vector<std::string>& corpus,
           std::size_t lanes_n)
      : setup_(setup),
        corpus_(corpus),
        lanes_(lanes_n),
        pipeline_(
            [this, &model](std::span<const std::string> texts, std::span<Prediction> out,
                           tailbatch::HostLane& lane) {
              const std::int64_t t0 = thread_cpu_ns();
              model(texts, out, lane);
              model_cpu_ns_.fetch_add(thread_cpu_ns() - t0, std::memory_order_relaxed);
              batches_.fetch_add(1, std::memory_order_relaxed);
              batched_.fetch_add(texts.size(), std::memory_order_relaxed);
            },
            policy_of(setup), config(), lanes_) {}

  Setup& setup() noexcept { return setup_; }
  // Still in the sweep: no rate has missed the SLO (twice) yet.
  bool running() const noexcept { return !stopped_; }

  // Runs rates[i] (confirmed once on a miss), appends its row, and stops this setup's
  // sweep at its first rate over the SLO.
  void run_rate(const std::vector<double>& rates, std::size_t i, double slo_ms, nanoseconds step,
                nanoseconds warmup) {
    Row row = measure(rates, i, 0, slo_ms, step, warmup);
    if (!row.meets) {
      // On a shared machine a neighbour's burst can spoil one step: a rate fails only if
      // it misses the SLO twice. The table keeps the run that passed, or the second miss.
      Row again = measure(rates, i, 1, slo_ms, step, warmup);
      again.verdict += again.meets ? " (on a second run; the first missed)" : " (twice)";
      row = std::move(again);
    }
    setup_.rows.push_back(std::move(row));
    if (setup_.rows.back().meets) {
      setup_.saturation = i;
    } else {
      stopped_ = true;  // past saturation more load only queues
    }
  }

 private:
  static tailbatch::PipelineConfig<std::string> config() {
    tailbatch::PipelineConfig<std::string> pc;
    pc.queue_capacity = 4096;
    return pc;
  }

  // One measured step at rates[i]; `attempt` > 0 marks a confirmation run.
  Row measure(const std::vector<double>& rates, std::size_t i, int attempt, double slo_ms,
              nanoseconds step, nanoseconds warmup) {
    auto target = tailbatch::pipeline_target(
        pipeline_, [this](std::uint64_t k) { return corpus_[k % corpus_.size()]; });
    tailbatch::LoadConfig o;
    o.profile = tailbatch::LoadProfile::poisson(rates[i], step);
    o.warmup = warmup;
    o.seed =
        1000 + i + 100 * static_cast<std::uint64_t>(attempt);  // the same arrivals for every setup
    o.drain_timeout = seconds(5);
    o.progress = tailbatch::progress_to(std::cerr);
    o.progress_interval = std::min<nanoseconds>(seconds(1), step / 2);
    o.label = fmt::format("{} {:.0f} rps {}/{}{}", setup_.name, rates[i], i + 1, rates.size(),
                          attempt > 0 ? " (again)" : "");
    const double cpu0 = process_cpu_s();
    const std::int64_t m0 = model_cpu_ns_.load();
    const std::uint64_t b0 = batches_.load(), n0 = batched_.load();
    Row row;
    row.offered = rates[i];
    row.result = tailbatch::run_load(o, target);
    const double cpu = process_cpu_s() - cpu0;
    // Warm-up requests cost CPU too: charge the step's CPU to everything it completed.
    const double completed = static_cast<double>(row.result.ok + row.result.warmup_requests);
    row.cpu_ms_per_req = completed > 0 ? cpu * 1000.0 / completed : 0.0;
    row.model_cpu_ms_per_req =
        completed > 0 ? static_cast<double>(model_cpu_ns_.load() - m0) / 1e6 / completed : 0.0;
    const auto nb = batches_.load() - b0;
    row.mean_batch = nb ? static_cast<double>(batched_.load() - n0) / static_cast<double>(nb) : 0.0;
    if (setup_.adaptive) {
      row.plan = setup_.adaptive->plan();
      row.learned_l1_ms = setup_.adaptive->estimate_seconds(1) * 1000.0;
      row.predicted_fixed_p95_ms =
          setup_.adaptive->predict(rates[i], lanes_.size(), setup_.max_batch, setup_.compared_window)
              .predicted_p95_s *
          1000.0;
    }
    if (row.result.error_rate() >= 0.01) {
      row.verdict = fmt::format("errors {:.1f} %", row.result.error_rate() * 100.0);
    } else if (ms(row.result.p95) > slo_ms) {
      row.verdict = "p95 over SLO";
    } else {
      row.meets = true;
      row.verdict = "ok";
    }
    std::this_thread::sleep_for(milliseconds(200));
    return row;
  }

  Setup& setup_;
  const std::vector<std::string>& corpus_;
  std::atomic<std::int64_t> model_cpu_ns_{0};
  std::atomic<std::uint64_t> batches_{0}, batched_{0};
  bool stopped_ = false;
  tailbatch::HostLanes lanes_;
  tailbatch::Pipeline<std::string, Prediction, DemoPolicy> pipeline_;
};

// The sweep, interleaved: at each rate every setup still in its sweep runs once, back to
// back (batching off, then the fixed window and the adaptive window, which of the two
// first alternating from rate to rate), so that a drift of the machine's speed over the
// demo falls on the setups it compares alike. Each setup still stops at its own first
// rate over the SLO, so each one's saturation is found as in a sweep of its own.
void run_interleaved(Setup& before, Setup& after, Setup& adaptive, const std::vector<double>& rates,
                     const ClassifierModel& model, const std::vector<std::string>& corpus,
                     std::size_t lanes_n, double slo_ms, nanoseconds step, nanoseconds warmup,
                     bool adaptive_first) {
  auto run_before = std::make_unique<SetupRun>(before, model, corpus, lanes_n);
  auto run_after = std::make_unique<SetupRun>(after, model, corpus, lanes_n);
  auto run_adaptive = std::make_unique<SetupRun>(adaptive, model, corpus, lanes_n);
  for (std::size_t i = 0; i < rates.size(); ++i) {
    const bool swap = (i % 2 == 1) != adaptive_first;
    SetupRun* order[] = {run_before.get(), swap ? run_adaptive.get() : run_after.get(),
                         swap ? run_after.get() : run_adaptive.get()};
    bool any = false;
    for (SetupRun* r : order) {
      if (!r->running()) continue;
      any = true;
      r->run_rate(rates, i, slo_ms, step, warmup);
    }
    if (!any) break;
  }
}

void print_setup(const Setup& s) {
  fmt::print("  {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>6}  {}\n", "offered", "achieved",
             "p50", "p95", "p99", "errors", "CPU ms", "model CPU", "mean", "verdict");
  fmt::print("  {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>6}\n", "rps", "rps", "ms", "ms",
             "ms", "%", "/request", "ms/req", "batch");
  for (std::size_t i = 0; i < s.rows.size(); ++i) {
    const auto& r = s.rows[i];
    fmt::print(
        "  {:>8.0f} {:>9.1f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>9.3f} {:>9.3f} {:>6.1f}  "
        "{}{}\n",
        r.offered, r.result.throughput_rps, ms(r.result.p50), ms(r.result.p95), ms(r.result.p99),
        r.result.error_rate() * 100.0, r.cpu_ms_per_req, r.model_cpu_ms_per_req, r.mean_batch,
        r.verdict, s.saturation && *s.saturation == i ? "   <- saturation" : "");
  }
}

tailbatch::SweepResult as_sweep(const Setup& s, double slo) {
  tailbatch::SweepResult out;
  out.slo_p95_ms = slo;
  for (const auto& r : s.rows) out.points.push_back({r.offered, r.result, r.meets, r.verdict});
  out.saturation = s.saturation;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "before_after_demo: the reference classifier behind a tailbatch Pipeline, batching off vs "
      "on"};
  std::string out_dir =
      (std::filesystem::path(argv[0]).parent_path() / "before_after_plots").string();
  bool quick = false;
  double slo_ms = 50.0, window_ms = 0.5;
  std::size_t max_batch = 32, lanes_n = 1;
  app.add_option("--out", out_dir, "directory for the SVG plots")->capture_default_str();
  app.add_flag("--quick", quick, "a shorter run (about 15 s): fewer rates, 1 s each");
  app.add_option("--slo-p95-ms", slo_ms, "p95 SLO in ms")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--window-ms", window_ms, "the dynamic window (max_wait), ms")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-batch", max_batch, "the dynamic window's max_batch")
      ->capture_default_str()
      ->check(CLI::Range(2, 256));
  std::vector<double> fixed_rates;
  std::string results_path;
  app.add_option("--rates", fixed_rates,
                 "offered rates to run, e.g. 800,1600,3200 (default: from the measured capacity)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--results", results_path,
                 "also write the fixed window's and the adaptive window's figures per rate to "
                 "FILE, one JSON object a line");
  bool adaptive_first = false;
  app.add_flag("--adaptive-first", adaptive_first,
               "at the first rate (and every other one) run the adaptive window before the "
               "fixed one (default: the fixed one first; they alternate from rate to rate)");
  double step_s = 0.0;
  app.add_option("--step-s", step_s,
                 "seconds each measured step runs (default 2.5, 1.2 with --quick); longer steps "
                 "give steadier p95s")
      ->check(CLI::Range(0.5, 120.0));
  bool control = false;
  app.add_flag("--control", control,
               "an A/A run: a second fixed window in the adaptive window's place, to measure how "
               "far two runs of one setup differ on this machine");
  app.add_option("--lanes", lanes_n, "host lanes (worker threads running the model)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  CLI11_PARSE(app, argc, argv);
  // Opened now, so that a path that cannot be written fails before minutes of measuring.
  struct CloseFile {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, CloseFile> results;
  if (!results_path.empty()) {
    results.reset(std::fopen(results_path.c_str(), "w"));
    if (results == nullptr) {
      fmt::print(stderr, "before_after_demo: --results: cannot write {}\n", results_path);
      return 2;
    }
  }

  const auto wall0 = steady_clock::now();
  const Classifier clf;
  const ClassifierModel model(clf);
  const std::vector<std::string> corpus = tailbatch::reference::review_corpus(4096);

  // Profile the model alone: the time of one batch of b, and what batching could buy.
  for (int i = 0; i < 20; ++i) (void)time_batch(model, corpus, 8, 1);  // warm caches
  const double t1 = time_batch(model, corpus, 1, 41);
  const double t8 = time_batch(model, corpus, 8, 15);
  const double tb = time_batch(model, corpus, max_batch, 9);
  const nanoseconds window = duration_cast<nanoseconds>(duration<double, std::milli>(window_ms));
  const std::size_t burst = quick ? 1500 : 4000;
  const double cap1 = burst_capacity(model, corpus, lanes_n, 1, nanoseconds(0), burst);
  const double capb = burst_capacity(model, corpus, lanes_n, max_batch, window, burst);

  // Rates: fractions of each setup's burst capacity, so that both sweeps have points on
  // the way up to their own saturation (each sweep stops at its first rate over the SLO).
  std::vector<double> fractions_before =
      quick ? std::vector<double>{0.4, 0.8, 1.2}
            : std::vector<double>{0.25, 0.45, 0.65, 0.85, 1.05, 1.3};
  std::vector<double> fractions_after =
      quick ? std::vector<double>{0.5, 1.0, 1.5}
            : std::vector<double>{0.3, 0.45, 0.6, 0.8, 1.0, 1.25, 1.6, 2.0, 2.5};
  std::vector<double> raw;
  for (double f : fractions_before) raw.push_back(f * cap1);
  for (double f : fractions_after) raw.push_back(f * std::max(capb, cap1));
  std::sort(raw.begin(), raw.end());
  std::vector<double> rates;
  for (double r : raw) {
    if (!fixed_rates.empty()) break;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(r, 1.0))) - 1);
    r = std::max(1.0, std::round(r / mag) * mag);                      // two significant digits
    if (rates.empty() || r > rates.back() * 1.12) rates.push_back(r);  // merge near neighbours
  }
  if (!fixed_rates.empty()) {
    rates = fixed_rates;
    std::sort(rates.begin(), rates.end());
  }
  const nanoseconds step = step_s > 0
                               ? duration_cast<nanoseconds>(duration<double>(step_s))
                               : nanoseconds(quick ? milliseconds(1200) : milliseconds(2500));
  const nanoseconds warmup = quick ? milliseconds(300) : milliseconds(500);

  fmt::print(
      "tailbatch before/after: the reference classifier behind a Pipeline, on this machine\n");
  fmt::print("model: reference classifier (embed {}, hidden {}, {} kernel), {} lane{}\n",
             clf.config().embed_dim, clf.config().hidden_dim,
             tailbatch::reference::to_string(clf.kernel()), lanes_n, lanes_n == 1 ? "" : "s");
  fmt::print(
      "the model alone: batch 1 {:.2f} ms, batch 8 {:.2f} ms, batch {} {:.2f} ms ({:.1f}x the "
      "requests per "
      "second of batch 1)\n",
      t1, t8, max_batch, tb, t1 * static_cast<double>(max_batch) / tb);
  fmt::print(
      "through the Pipeline, {} requests at once: {:.0f} rps with batching off, {:.0f} rps with "
      "the window\n",
      burst, cap1, capb);
  fmt::print(
      "SLO: p95 <= {} ms with errors < 1 %; open-loop Poisson arrivals; {} rates from {:.0f} to "
      "{:.0f} rps, "
      "{:.1f} s each ({:.1f} s warm-up)\n\n",
      slo_ms, rates.size(), rates.front(), rates.back(), duration<double>(step).count(),
      duration<double>(warmup).count());

  Setup before{"batch 1", 1, nanoseconds(0), {}, {}, {}};
  Setup after{fmt::format("window {} ms", window_ms), max_batch, window, {}, {}, {}};
  tailbatch::AdaptiveWindowConfig ac;
  ac.slo_p95 = duration_cast<nanoseconds>(duration<double, std::milli>(slo_ms));
  ac.max_batch = max_batch;
  Setup adaptive{"adaptive", max_batch, nanoseconds(0), {}, {}, tailbatch::AdaptiveWindow(ac), window};
  if (control) adaptive = Setup{"control", max_batch, window, {}, {}, {}};
  run_interleaved(before, after, adaptive, rates, model, corpus, lanes_n, slo_ms, step, warmup,
                  adaptive_first);

  fmt::print("\nBEFORE: batching off (FixedWindow max_batch 1, no window)\n");
  print_setup(before);
  fmt::print("\nAFTER: dynamic batching (FixedWindow max_batch {}, window {} ms)\n", max_batch,
             window_ms);
  print_setup(after);
  if (control) {
    fmt::print(
        "\nCONTROL: a second FixedWindow (max_batch {}, window {} ms), in the adaptive "
        "window's place\n",
        max_batch, window_ms);
  } else {
    fmt::print("\nADAPTIVE: AdaptiveWindow (p95 target {} ms, max_batch {}; nothing else set)\n",
               slo_ms, max_batch);
  }
  print_setup(adaptive);
  if (adaptive.adaptive) {
    const tailbatch::AdaptiveCostModel learned = adaptive.adaptive->cost_model();
    const tailbatch::AdaptivePlan plan = adaptive.adaptive->plan();
    if (learned.samples == 0) {
      fmt::print(
          "  (this Pipeline reported no executed batches to the policy, so it stayed at its cold "
          "start: a zero window with the cap)\n");
    } else {
      fmt::print(
          "  learned from {} batches: L(b) = {:.3f} ms + {:.4f} ms x b; last plan: window {:.2f} "
          "ms, batch {}, for {:.0f} rps\n",
          learned.samples, learned.intercept_s * 1e3, learned.slope_s * 1e3,
          duration<double, std::milli>(plan.window).count(), plan.batch, plan.rate_rps);
      // The planner against the live run: the plan in force at each step's end, its predicted
      // p95 and the one the planner predicts for the fixed window at that rate, beside what
      // the two measured. Where they part, the planner chose with a wrong picture of the lanes.
      fmt::print(
          "  planner vs measured at each rate (the plan in force at the step's end; p95 in ms):\n"
          "  {:>8} {:>9} {:>6} {:>10} {:>15} {:>9} {:>16} {:>9}\n",
          "offered", "plan rps", "batch", "window ms", "adapt predicted", "measured",
          "fixed predicted", "measured");
      for (std::size_t i = 0; i < adaptive.rows.size(); ++i) {
        const Row& r = adaptive.rows[i];
        if (!r.plan) continue;
        fmt::print("  {:>8.0f} {:>9.0f} {:>6} {:>10.3f} {:>15.2f} {:>9.2f} {:>16.2f} {:>9}\n",
                   r.offered, r.plan->rate_rps, r.plan->batch, ms(r.plan->window),
                   r.plan->predicted_p95_s * 1000.0, ms(r.result.p95), r.predicted_fixed_p95_ms,
                   i < after.rows.size() ? fmt::format("{:.2f}", ms(after.rows[i].result.p95))
                                         : std::string("-"));
      }
    }
  }

  // Before vs after at each rate both ran, each judged against the latency field guide's mini
  // challenge: p95 down by at least 20 %, cost per request not up, and the SLO still met.
  auto change = [](double a, double b) { return a > 0 ? (b - a) / a * 100.0 : 0.0; };
  const std::size_t common = std::min(before.rows.size(), after.rows.size());
  std::vector<bool> met(common, false);
  fmt::print(
      "\nBEFORE vs AFTER at the same offered load (p50/p95 in ms, cost in process CPU ms per "
      "request)\n");
  fmt::print("  {:>8} {:>16} {:>18} {:>8} {:>16} {:>8} {:>13}  {}\n", "offered", "p50 before/after",
             "p95 before/after", "p95", "cost before/after", "cost", adaptive.name + " p95",
             "mini challenge");
  for (std::size_t i = 0; i < common; ++i) {
    const auto& b = before.rows[i];
    const auto& a = after.rows[i];
    const double dp = change(ms(b.result.p95), ms(a.result.p95));
    const double dc = change(b.cpu_ms_per_req, a.cpu_ms_per_req);
    met[i] = dp <= -20.0 && a.cpu_ms_per_req <= b.cpu_ms_per_req && a.meets;
    const std::string why = met[i]       ? "met"
                            : !a.meets   ? "not met: SLO missed"
                            : dp > -20.0 ? fmt::format("not met: p95 {:+.0f} %", dp)
                                         : "not met: cost rose";
    const std::string ad =
        i < adaptive.rows.size() ? fmt::format("{:.2f}", ms(adaptive.rows[i].result.p95)) : "-";
    fmt::print(
        "  {:>8.0f} {:>7.2f} / {:<7.2f} {:>8.2f} / {:<7.2f} {:>+7.0f}% {:>7.3f} / {:<7.3f} "
        "{:>+7.0f}% {:>13}  {}\n",
        b.offered, ms(b.result.p50), ms(a.result.p50), ms(b.result.p95), ms(a.result.p95), dp,
        b.cpu_ms_per_req, a.cpu_ms_per_req, dc, ad, why);
  }

  // Saturation points.
  const double sat_b = before.saturation ? before.rows[*before.saturation].offered : 0.0;
  const double sat_a = after.saturation ? after.rows[*after.saturation].offered : 0.0;
  fmt::print("\nsaturation point (highest offered rate with p95 <= {} ms and errors < 1 %):\n",
             slo_ms);
  fmt::print("  before: {}\n", before.saturation
                                   ? fmt::format("{:.0f} rps", sat_b)
                                   : std::string("none (even the lowest rate missed the SLO)"));
  const bool after_open =
      after.saturation && *after.saturation + 1 == rates.size();  // never failed
  fmt::print("  after:  {}{}{}\n", after_open ? "at least " : "",
             after.saturation ? fmt::format("{:.0f} rps", sat_a)
                              : std::string("none (even the lowest rate missed the SLO)"),
             before.saturation && after.saturation
                 ? fmt::format(" ({}{:.1f}x the load within the SLO)",
                               after_open ? "at least " : "", sat_a / sat_b)
                 : std::string());
  if (after_open)
    fmt::print(
        "          (the highest rate tried; the window's real saturation point lies above it)\n");
  const double sat_ad = adaptive.saturation ? adaptive.rows[*adaptive.saturation].offered : 0.0;
  fmt::print("  {}: {}\n", adaptive.name,
             adaptive.saturation ? fmt::format("{:.0f} rps", sat_ad)
                                 : std::string("none (even the lowest rate missed the SLO)"));

  // Adaptive against the fixed window it ran beside, rate by rate, held to the goals of
  // docs/adaptive-window.md: where both meet the SLO, p95 within 10 % of the fixed
  // window's (or lower); at every rate both ran, CPU per request within 5 %.
  if (control) {
    fmt::print(
        "\ncontrol (a second fixed window) vs the fixed window, held to the adaptive window's "
        "goals: ");
  } else {
    fmt::print("\nadaptive vs the fixed window (the best fixed setting this demo ran): ");
  }
  {
    std::vector<std::string> missed;
    std::size_t compared = 0, met_n = 0;
    for (std::size_t i = 0; i < std::min(after.rows.size(), adaptive.rows.size()); ++i) {
      const auto& f = after.rows[i];
      const auto& d = adaptive.rows[i];
      const bool both = f.meets && d.meets;
      if (!f.meets && !d.meets) continue;
      ++compared;
      const double fp = ms(f.result.p95), dp = ms(d.result.p95);
      const bool p95_ok = both ? dp <= 1.10 * fp : d.meets;
      const bool cpu_ok = d.cpu_ms_per_req <= 1.05 * f.cpu_ms_per_req;
      if (p95_ok && cpu_ok) {
        ++met_n;
      } else {
        missed.push_back(
            fmt::format("{:.0f} rps ({}{}{})", f.offered,
                        p95_ok ? std::string() : fmt::format("p95 {:.2f} vs {:.2f} ms", dp, fp),
                        !p95_ok && !cpu_ok ? "; " : "",
                        cpu_ok ? std::string()
                               : fmt::format("CPU {:.3f} vs {:.3f} ms/request", d.cpu_ms_per_req,
                                             f.cpu_ms_per_req)));
      }
    }
    if (compared == 0) {
      fmt::print("nothing to compare (neither met the SLO at any rate both ran).\n");
    } else if (missed.empty()) {
      fmt::print(
          "MET at all {} rates (p95 within 10 % where both meet the SLO, CPU per request within 5 "
          "%).\n",
          compared);
    } else {
      std::string list;
      for (const auto& m : missed) list += (list.empty() ? "" : ", ") + m;
      fmt::print("met at {} of {} rates; MISSED at {}.\n", met_n, compared, list);
    }
    fmt::print("  saturation: {} {}, fixed window {}{}.\n", adaptive.name,
               adaptive.saturation ? fmt::format("{:.0f} rps", sat_ad) : std::string("none"),
               after.saturation ? fmt::format("{:.0f} rps", sat_a) : std::string("none"),
               adaptive.saturation && after.saturation
                   ? (sat_ad >= sat_a ? fmt::format(" ({} met or exceeded it)", adaptive.name)
                                      : fmt::format(" ({} missed it)", adaptive.name))
                   : std::string());
  }
  if (results != nullptr) {
    std::FILE* out = results.get();
    auto num = [](const std::vector<Row>& rows, std::size_t i, auto f) {
      return i < rows.size() ? fmt::format("{:.4f}", f(rows[i])) : std::string("null");
    };
    // The adaptive window's plan figures (null for the control, or a rate it did not run).
    auto planned = [&](std::size_t i, auto f) {
      return i < adaptive.rows.size() && adaptive.rows[i].plan ? fmt::format("{:.4f}", f(adaptive.rows[i]))
                                                               : std::string("null");
    };
    for (std::size_t i = 0; i < rates.size(); ++i) {
      fmt::print(out,
                 "{{\"rate\": {:.0f}, \"fixed_p95_ms\": {}, \"adaptive_p95_ms\": {}, "
                 "\"fixed_cpu_ms_per_request\": {}, "
                 "\"adaptive_cpu_ms_per_request\": {}, \"fixed_ok\": {}, \"adaptive_ok\": {}, "
                 "\"fixed_mean_batch\": {}, "
                 "\"adaptive_mean_batch\": {}, \"adaptive_plan_rate_rps\": {}, "
                 "\"adaptive_plan_batch\": {}, \"adaptive_plan_window_ms\": {}, "
                 "\"adaptive_predicted_p95_ms\": {}, \"predicted_fixed_p95_ms\": {}, "
                 "\"adaptive_learned_l1_ms\": {}}}\n",
                 rates[i], num(after.rows, i, [](const Row& r) { return ms(r.result.p95); }),
                 num(adaptive.rows, i, [](const Row& r) { return ms(r.result.p95); }),
                 num(after.rows, i, [](const Row& r) { return r.cpu_ms_per_req; }),
                 num(adaptive.rows, i, [](const Row& r) { return r.cpu_ms_per_req; }),
                 i < after.rows.size() && after.rows[i].meets,
                 i < adaptive.rows.size() && adaptive.rows[i].meets,
                 num(after.rows, i, [](const Row& r) { return r.mean_batch; }),
                 num(adaptive.rows, i, [](const Row& r) { return r.mean_batch; }),
                 planned(i, [](const Row& r) { return r.plan->rate_rps; }),
                 planned(i, [](const Row& r) { return static_cast<double>(r.plan->batch); }),
                 planned(i, [](const Row& r) { return ms(r.plan->window); }),
                 planned(i, [](const Row& r) { return r.plan->predicted_p95_s * 1000.0; }),
                 planned(i, [](const Row& r) { return r.predicted_fixed_p95_ms; }),
                 planned(i, [](const Row& r) { return r.learned_l1_ms; }));
    }
    fmt::print(out, "{{\"fixed_saturation_rps\": {:.0f}, \"adaptive_saturation_rps\": {:.0f}}}\n",
               sat_a, sat_ad);
    results.reset();
  }

  fmt::print(
      "\npractical project (show p50/p95 before and after): the tables above, and "
      "latency_vs_load.svg\n");
  fmt::print("mini challenge (reduce p95 by 20 % without increasing cost per request): ");
  // Headline: the busiest load at which it was met while batching off still met the SLO
  // (a fair fight), else the busiest load at which it was met at all.
  std::optional<std::size_t> best, best_fair;
  for (std::size_t i = 0; i < common; ++i) {
    if (!met[i]) continue;
    best = i;
    if (before.rows[i].meets) best_fair = i;
  }
  if (best_fair) best = best_fair;
  if (best) {
    const auto& b = before.rows[*best];
    const auto& a = after.rows[*best];
    std::size_t n_met = 0;
    for (bool m : met) n_met += m ? 1 : 0;
    fmt::print(
        "MET at {:.0f} rps{}: p95 {:.2f} -> {:.2f} ms ({:+.0f} %), cost {:.3f} -> {:.3f} CPU ms "
        "per request "
        "({:+.0f} %); met at {} of the {} loads both setups ran.\n",
        b.offered,
        b.meets ? " (batching off still within its SLO there)"
                : " (where batching off missed its SLO)",
        ms(b.result.p95), ms(a.result.p95), change(ms(b.result.p95), ms(a.result.p95)),
        b.cpu_ms_per_req, a.cpu_ms_per_req, change(b.cpu_ms_per_req, a.cpu_ms_per_req), n_met,
        common);
  } else {
    fmt::print("NOT MET at any of the {} loads both setups ran (see the table above).\n", common);
  }
  if (common > 0 && !met[0] && ms(after.rows[0].result.p50) > ms(before.rows[0].result.p50)) {
    const auto& b = before.rows[0];
    const auto& a = after.rows[0];
    fmt::print(
        "  at the lightest load ({:.0f} rps) p50 went {:.2f} -> {:.2f} ms and p95 {:.2f} -> {:.2f} "
        "ms: with "
        "little traffic a batch waits out its window, so batching pays where the load is high; "
        "keep the "
        "window short, well under the SLO.\n",
        b.offered, ms(b.result.p50), ms(a.result.p50), ms(b.result.p95), ms(a.result.p95));
  }

  // Plots.
  std::filesystem::create_directories(out_dir);
  const std::string sub = fmt::format(
      "reference classifier, {} lane{}, Poisson arrivals; SLO p95 {} ms; before_after_demo",
      lanes_n, lanes_n == 1 ? "" : "s", slo_ms);
  const auto sb = as_sweep(before, slo_ms), sa = as_sweep(after, slo_ms);
  tailbatch::LinePlot lat;
  lat.title = "p50 and p95 before and after dynamic batching";
  lat.subtitle = sub;
  lat.x_label = "offered load (requests/s)";
  lat.y_label = "latency from intended send (ms)";
  lat.y_scale = tailbatch::AxisScale::log;
  lat.x_min = 0.0;
  tailbatch::add_sweep_latency_series(lat, sb, "batch 1", "#d62728", true, false);
  tailbatch::add_sweep_latency_series(lat, sa, fmt::format("window {} ms", window_ms), "#1f77b4",
                                      true, false);
  const auto sad = as_sweep(adaptive, slo_ms);
  tailbatch::add_sweep_latency_series(lat, sad, adaptive.name, "#2ca02c", true, false);
  lat.horizontal.push_back({slo_ms, fmt::format("SLO p95 {} ms", slo_ms), "#b22222"});
  if (before.saturation)
    lat.vertical.push_back({sat_b, fmt::format("batch 1 saturates: {:.0f} rps", sat_b), "#d62728"});
  if (after.saturation)
    lat.vertical.push_back({sat_a, fmt::format("window saturates: {:.0f} rps", sat_a), "#1f77b4"});
  if (adaptive.saturation)
    lat.vertical.push_back(
        {sat_ad, fmt::format("{} saturates: {:.0f} rps", adaptive.name, sat_ad), "#2ca02c"});
  tailbatch::LinePlot cost;
  cost.title = "Cost per request before and after dynamic batching";
  cost.subtitle = sub;
  cost.x_label = "offered load (requests/s)";
  cost.y_label = "process CPU per request (ms)";
  cost.x_min = 0.0;
  for (const auto* s : {&before, &after, &adaptive}) {
    tailbatch::PlotSeries ps;
    ps.name = s == &before  ? "batch 1"
              : s == &after ? fmt::format("window {} ms", window_ms)
                            : adaptive.name;
    ps.color = s == &before ? "#d62728" : s == &after ? "#1f77b4" : "#2ca02c";
    for (const auto& r : s->rows) ps.points.push_back({r.offered, r.cpu_ms_per_req});
    cost.series.push_back(ps);
  }
  auto thr = tailbatch::throughput_vs_load_plot(
      {&sb, &sa, &sad}, {"batch 1", fmt::format("window {} ms", window_ms), adaptive.name},
      "Throughput before and after dynamic batching", sub);
  thr.series[0].color = "#d62728";
  thr.series[1].color = "#1f77b4";
  if (thr.series.size() > 2) thr.series[2].color = "#2ca02c";
  std::vector<std::string> paths;
  try {
    for (auto& [name, plot] : std::vector<std::pair<std::string, tailbatch::LinePlot*>>{
             {"latency_vs_load.svg", &lat},
             {"cost_vs_load.svg", &cost},
             {"throughput_vs_load.svg", &thr}}) {
      const std::string p = (std::filesystem::path(out_dir) / name).string();
      tailbatch::write_svg(p, *plot);
      paths.push_back(p);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "before_after_demo: {}\n", e.what());
    return 2;
  }
  fmt::print("\nplots:\n");
  for (const auto& p : paths) fmt::print("  {}\n", p);
  fmt::print("\nfinished in {:.0f} s\n", duration<double>(steady_clock::now() - wall0).count());
  return 0;
}
