// What warmup buys: the latency of the first requests a fresh server answers, with and
// without warming up first, on the reference classifier.
//
// Each run is a fresh process (this program starts itself with --mode), so that nothing
// is warm that a newly started server would not have warm: the classifier's weights are
// generated (as a server would load them) and then the run starts at once, with the
// per-batch workspaces not yet allocated (first-touch page faults on the hidden
// activations, n x hidden_dim floats per batch size), no scratch per lane, and caches and
// predictors cold. In "warmup" runs, warmup() first runs every batch size the policy forms
// (1, 2, 4, ... max_batch) on both lanes; in "no warmup" runs, the first users pay it.
//
// Cold weights: with --weights-file PATH the weights are written to PATH once (by this
// parent process, then fdatasync()ed) and every run maps them read-only from the file
// (weights_file.hpp), as a real server maps its checkpoint. With --cold as well, each run
// first drops the file's pages from the page cache (fdatasync, then
// posix_fadvise(POSIX_FADV_DONTNEED): no root needed for clean pages) and checks with
// mincore() how much of the file is still in memory, so the weights come from the disk on
// first touch: in "no warmup" runs the first users' batches fault them in, in "warmup"
// runs warmup() does. The resident fractions are printed under the table; if the drop did
// not take (more than 5 % resident at the start of a run) the output says so.
//
// The load: --requests requests (1000) at a constant --rate (open loop, 400/s), latency
// counted from each request's intended send time (no coordinated omission). Printed: per
// mode, the median over --runs runs of the first request's latency, p99 of the first 100,
// p50, p99 and max of the first --requests requests, and how long warmup took.
//
//   warmup_demo                      # the table (2 runs per mode, alternating)
//   warmup_demo --runs 3 --rate 600
//   warmup_demo --weights-file /var/tmp/clf.weights --cold --hidden 131072   # 256 MiB w1, cold
//   warmup_demo --smoke              # a small model and 100 requests: a quick check
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <tailbatch/batch_window.hpp>
#include <tailbatch/lanes.hpp>
#include <tailbatch/pipeline.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>
#include <tailbatch/reference/weights_file.hpp>
#include <tailbatch/warmup.hpp>

namespace tb = tailbatch;
namespace ref = tailbatch::reference;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string mode;  // "", "cold" or "warm"
  int requests = 1000;
  double rate = 400.0;
  int runs = 2;
  std::uint32_t hidden = 16384;
  bool smoke = false;
  std::string weights_file;  // map the weights from this file (written by the parent)
  bool cold = false;         // drop the file's pages from the page cache before each run
};

// Above this fraction of the weights resident at the start of a --cold run, the page-cache
// drop did not take and the run is not cold.
constexpr double cold_limit = 0.05;

struct RunResult {
  double warmup_ms = 0;
  double first_ms = 0;
  double p99_first100_ms = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
  int ok = 0;
  double resident_start = -1;  // fraction of the weights file in memory at start (-1: no file)
  double resident_first = -1;  // ... just before the first request (after warmup, if any)
};

const std::vector<std::string> texts = {
    "a great, moving film",         "awful, boring plot",
    "Superb acting and a brilliant script!", "What a waste of time: dull and predictable.",
    "The package arrived on Tuesday.", "An excellent, charming little book.",
    "terrible service, rude staff", "we watched it on a rainy sunday afternoon",
    "I loved every minute of it",   "The worst phone I ever owned",
};

double percentile_ms(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  auto i = static_cast<std::size_t>(q * static_cast<double>(v.size()));
  if (i > 0 && static_cast<double>(i) == q * static_cast<double>(v.size())) --i;
  return v[std::min(i, v.size() - 1)];
}

// One fresh server: build, optionally warm up, then serve the first requests.
RunResult run_once(const Options& o, bool warm) {
  RunResult r;
  std::shared_ptr<const ref::WeightsFile> file;
  if (!o.weights_file.empty()) {
    file = std::make_shared<const ref::WeightsFile>(o.weights_file);
    if (o.cold) file->drop_page_cache();
    r.resident_start = file->resident_fraction();
  }
  ref::ClassifierConfig cc;
  cc.hidden_dim = o.hidden;
  const ref::Classifier clf = file ? ref::load_classifier(file) : ref::Classifier(cc);
  const ref::ClassifierModel model(clf);
  tb::HostLanes lanes(2);
  tb::Pipeline<std::string, ref::Prediction, tb::FixedWindow> pipeline(model, tb::FixedWindow(32, 2ms), {}, lanes);

  if (warm) {
    const tb::WarmupReport w = tb::warmup(pipeline, texts);
    r.warmup_ms = std::chrono::duration<double, std::milli>(w.elapsed).count();
    if (!w.ok()) std::fprintf(stderr, "warmup did not complete: %s\n", w.first_error.c_str());
  }
  if (file) r.resident_first = file->resident_fraction();

  const int n = o.requests;
  std::vector<double> latency_ms(static_cast<std::size_t>(n), 0.0);
  std::atomic<int> done{0};
  std::atomic<int> ok{0};
  const auto interval = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / o.rate));
  const Clock::time_point start = Clock::now() + 1ms;
  for (int i = 0; i < n; ++i) {
    const Clock::time_point intended = start + interval * i;
    std::this_thread::sleep_until(intended);
    std::string text = texts[static_cast<std::size_t>(i) % texts.size()] + " #" + std::to_string(i);
    pipeline.submit(std::move(text), [&, i, intended](tb::Outcome<ref::Prediction>&& out) {
      latency_ms[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::milli>(Clock::now() - intended).count();
      if (out.ok()) ok.fetch_add(1, std::memory_order_relaxed);
      done.fetch_add(1, std::memory_order_release);
    });
  }
  while (done.load(std::memory_order_acquire) < n) std::this_thread::sleep_for(1ms);
  pipeline.shutdown();
  r.ok = ok.load();
  r.first_ms = latency_ms.front();
  r.p99_first100_ms = percentile_ms({latency_ms.begin(), latency_ms.begin() + std::min(n, 100)}, 0.99);
  r.p50_ms = percentile_ms(latency_ms, 0.50);
  r.p99_ms = percentile_ms(latency_ms, 0.99);
  r.max_ms = *std::max_element(latency_ms.begin(), latency_ms.end());
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--smoke") {
      o.smoke = true;
    } else if (a == "--mode" && (v = next())) {
      o.mode = v;
    } else if (a == "--requests" && (v = next())) {
      o.requests = std::atoi(v);
    } else if (a == "--rate" && (v = next())) {
      o.rate = std::atof(v);
    } else if (a == "--runs" && (v = next())) {
      o.runs = std::atoi(v);
    } else if (a == "--hidden" && (v = next())) {
      o.hidden = static_cast<std::uint32_t>(std::atoi(v));
    } else if (a == "--weights-file" && (v = next())) {
      o.weights_file = v;
    } else if (a == "--cold") {
      o.cold = true;
    } else {
      std::fprintf(stderr,
                   "usage: warmup_demo [--requests N] [--rate R] [--runs K] [--hidden H] [--weights-file PATH [--cold]] "
                   "[--smoke]\n");
      return false;
    }
  }
  if (o.smoke) {
    o.requests = 100;
    o.runs = 1;
    o.hidden = 1024;
  }
  if (o.requests < 1 || !(o.rate > 0.0) || o.runs < 1 || o.hidden < 32 || o.hidden % 32 != 0 ||
      (o.mode != "" && o.mode != "cold" && o.mode != "warm")) {
    std::fprintf(stderr, "warmup_demo: bad arguments (requests >= 1, rate > 0, runs >= 1, hidden a multiple of 32)\n");
    return false;
  }
  if (o.cold && o.weights_file.empty()) {
    std::fprintf(stderr, "warmup_demo: --cold needs --weights-file PATH\n");
    return false;
  }
#if !TAILBATCH_REFERENCE_HAS_WEIGHTS_FILE
  if (!o.weights_file.empty()) {
    std::fprintf(stderr, "warmup_demo: --weights-file needs a POSIX system (mmap)\n");
    return false;
  }
#endif
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 2;

  if (!o.mode.empty()) {  // a child: one run, one line
    const RunResult r = run_once(o, o.mode == "warm");
    std::printf("RESULT %d %.3f %.3f %.3f %.3f %.3f %.3f %.6f %.6f\n", r.ok, r.warmup_ms, r.first_ms,
                r.p99_first100_ms, r.p50_ms, r.p99_ms, r.max_ms, r.resident_start, r.resident_first);
    return r.ok == o.requests ? 0 : 1;
  }

  // The parent: fresh processes, alternating modes so that drift in the machine's load
  // falls on both.
  std::string file_args;
  if (!o.weights_file.empty()) {
    ref::ClassifierConfig cc;
    cc.hidden_dim = o.hidden;
    ref::write_weights_file(ref::Classifier(cc), o.weights_file);
    file_args = " --weights-file \"" + o.weights_file + "\"" + (o.cold ? " --cold" : "");
  }
  std::vector<RunResult> results[2];
  for (int run = 0; run < o.runs; ++run) {
    for (int warm = 0; warm < 2; ++warm) {
      const std::string cmd = std::string("\"") + argv[0] + "\" --mode " + (warm ? "warm" : "cold") +
                              " --requests " + std::to_string(o.requests) + " --rate " + std::to_string(o.rate) +
                              " --hidden " + std::to_string(o.hidden) + file_args;
      FILE* child = popen(cmd.c_str(), "r");
      if (child == nullptr) {
        std::perror("warmup_demo: popen");
        return 1;
      }
      RunResult r;
      char line[256];
      bool got = false;
      while (std::fgets(line, sizeof line, child) != nullptr) {
        got = got || std::sscanf(line, "RESULT %d %lf %lf %lf %lf %lf %lf %lf %lf", &r.ok, &r.warmup_ms, &r.first_ms,
                                 &r.p99_first100_ms, &r.p50_ms, &r.p99_ms, &r.max_ms, &r.resident_start,
                                 &r.resident_first) == 9;
      }
      const int status = pclose(child);
      if (!got || status != 0) {
        std::fprintf(stderr, "warmup_demo: a %s run failed\n", warm ? "warmup" : "no-warmup");
        return 1;
      }
      results[warm].push_back(r);
    }
  }

  std::printf("reference classifier (hidden %u), 2 host lanes, FixedWindow(32, 2 ms); first %d requests at %.0f/s\n",
              o.hidden, o.requests, o.rate);
  std::printf("median of %d fresh process(es) per mode\n\n", o.runs);
  std::printf("%-10s %10s %9s %16s %9s %9s %9s\n", "mode", "warmup_ms", "first_ms", "p99_first100_ms", "p50_ms",
              "p99_ms", "max_ms");
  for (int warm = 0; warm < 2; ++warm) {
    auto stat = [&](double RunResult::*f) {
      std::vector<double> v;
      for (const RunResult& r : results[warm]) v.push_back(r.*f);
      return median(v);
    };
    std::printf("%-10s %10.1f %9.2f %16.2f %9.2f %9.2f %9.2f\n", warm ? "warmup" : "no warmup",
                stat(&RunResult::warmup_ms), stat(&RunResult::first_ms), stat(&RunResult::p99_first100_ms),
                stat(&RunResult::p50_ms), stat(&RunResult::p99_ms), stat(&RunResult::max_ms));
  }

  if (!o.weights_file.empty()) {
    auto resident = [&](int warm, double RunResult::*f, bool highest) {
      double v = highest ? 0.0 : 1.0;
      for (const RunResult& r : results[warm]) v = highest ? std::max(v, r.*f) : std::min(v, r.*f);
      return 100.0 * v;
    };
    std::printf("\nweights mapped from %s (%.1f MiB)%s\n", o.weights_file.c_str(),
                static_cast<double>(std::filesystem::file_size(o.weights_file)) / (1024.0 * 1024.0),
                o.cold ? ", dropped from the page cache before each run" : ", page cache left as it was");
    std::printf("weights resident at start (lowest-highest over runs): no warmup %.1f-%.1f %%, warmup %.1f-%.1f %%\n",
                resident(0, &RunResult::resident_start, false), resident(0, &RunResult::resident_start, true),
                resident(1, &RunResult::resident_start, false), resident(1, &RunResult::resident_start, true));
    std::printf("weights resident before first request: no warmup %.1f %%, warmup %.1f %% (highest over runs)\n",
                resident(0, &RunResult::resident_first, true), resident(1, &RunResult::resident_first, true));
    const double worst = std::max(resident(0, &RunResult::resident_start, true), resident(1, &RunResult::resident_start, true));
    if (o.cold && worst > 100.0 * cold_limit) {
      std::printf("the page-cache drop did NOT take: up to %.1f %% of the weights were resident at the start of a run "
                  "(limit %.0f %%), so these runs are not cold\n",
                  worst, 100.0 * cold_limit);
    }
  }
  return 0;
}
