// streaming_demo: streaming vs non-streaming on the reference generator, under load.
//
// The latency field guide's Example 2: an LLM that takes ~200 ms to its first token and then
// makes 50 tokens/s needs ~2.18 s for a 100-token answer; a client that waits for the whole
// answer perceives 2.18 s, a streaming client sees content after ~200 ms (that arithmetic is
// tailbatch::streaming_latency in planner.hpp). This demo measures the same two perceived
// latencies on a real decode loop: a ContinuousBatcher (its own decode
// thread, max_active 16) running the reference generator, fed by open-loop Poisson
// arrivals at 30 %, 60 % and 90 % of its capacity (measured first, by a run in which every
// request arrives at once), with output lengths uniform in [8, 256]. Each request has a client thread:
//   streaming      reads tokens as they are published; perceived latency = time to its
//                  first token (submission -> first token in the client's hands);
//   non-streaming  waits for the stream to close, then takes the whole answer; perceived
//                  latency = total generation time.
// It prints a table per load, the Example 2 arithmetic with its own measured time to first
// token and inter-token time (and what its non-streaming clients measured for answers of
// about 100 tokens), and writes an SVG plot (perceived latency against answer
// length for both kinds of client at 60 % load) to --out (default: streaming_demo.svg next
// to this program). Runs in a few seconds.
//
//   streaming_demo [--out PATH] [--requests N] [--seed S]
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/tools/planner.hpp>
#include <tailbatch/reference/generator.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace tailbatch;
using reference::Generator;
using reference::GeneratorState;
using Clock = std::chrono::steady_clock;

namespace {

using Batcher = ContinuousBatcher<std::int32_t, GeneratorState>;

constexpr std::size_t kMaxActive = 16;
constexpr std::size_t kPrompt = 16;
constexpr std::size_t kMinLen = 8;
constexpr std::size_t kMaxLen = 256;

struct Sample {
  std::size_t tokens = 0;
  double first_ms = 0;     // submission -> first token received by the client
  double total_ms = 0;     // submission -> whole answer received
  bool ok = false;
};

struct RunResult {
  double load = 0;
  double rate = 0;                 // offered requests/s (infinite: all at once)
  std::vector<Sample> streaming, waiting;
  double tokens_per_s = 0;
  double completed_per_s = 0;      // requests completed per second of the run
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// One decode step over a full lane group (for the header line).
double step_seconds(Generator& g) {
  std::vector<GeneratorState> states(kMaxActive);
  std::vector<reference::GeneratorLane> lanes(kMaxActive);
  for (std::size_t i = 0; i < kMaxActive; ++i) {
    states[i] = g.new_state(i);
    lanes[i].state = &states[i];
    lanes[i].feed = std::span<const std::int32_t>(&states[i].next_input, 1);
  }
  reference::GeneratorWorkspace ws;
  for (int i = 0; i < 20; ++i) g.step(lanes, ws);
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) g.step(lanes, ws);
  return std::chrono::duration<double>(Clock::now() - t0).count() / 100;
}

// Half the requests stream and half wait for the whole answer, interleaved, so both kinds
// of client see the same load.
RunResult run(Generator& g, double load, double rate, std::size_t requests, std::uint64_t seed) {
  RunResult result;
  result.load = load;
  result.rate = rate;
  ContinuousBatcherConfig config;
  config.max_active = kMaxActive;
  config.queue_capacity = requests;
  config.stream.capacity = kMaxLen;  // a waiting client may hold a whole answer
  // SteadyClock: the batcher starts its decode thread here (ContinuousBatcherConfig::workers).
  Batcher batcher([&](std::span<Batcher::Sequence> batch) { g.step_sequences(batch); }, config);

  reference::OutputLengths lengths(kMinLen, kMaxLen, seed);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto uniform = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
  };
  std::vector<Sample> samples(requests);
  std::vector<std::thread> clients;
  clients.reserve(requests);
  auto next = Clock::now();
  const auto begin = next;
  std::atomic<std::size_t> tokens{0};
  for (std::size_t i = 0; i < requests; ++i) {
    if (std::isfinite(rate)) {
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(-std::log(uniform()) / rate));
      std::this_thread::sleep_until(next);
    }
    Batcher::Request r;
    for (std::size_t k = 0; k < kPrompt; ++k) r.prompt.push_back(static_cast<std::int32_t>((i * 31 + k * 7) % 2048));
    r.max_new_tokens = lengths.next();
    r.state = g.new_state(i);
    const auto submitted = Clock::now();
    auto stream = batcher.submit(std::move(r));
    const bool streaming = i % 2 == 0;
    clients.emplace_back([stream, submitted, streaming, &sample = samples[i], &tokens] {
      std::vector<std::int32_t> answer;
      if (streaming) {
        while (stream->next_chunk_for(answer, std::chrono::seconds(30)) > 0) {
          if (sample.first_ms == 0) sample.first_ms = ms(Clock::now() - submitted);
        }
      } else {
        (void)stream->wait_end_for(std::chrono::seconds(30));
        while (stream->next_chunk_for(answer, std::chrono::seconds(30)) > 0) {
        }
        sample.first_ms = ms(Clock::now() - submitted);  // nothing is seen before the end
      }
      sample.total_ms = ms(Clock::now() - submitted);
      sample.tokens = answer.size();
      sample.ok = stream->done() && stream->end()->ok();
      tokens.fetch_add(answer.size());
    });
  }
  for (auto& c : clients) c.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
  batcher.shutdown();
  result.tokens_per_s = static_cast<double>(tokens.load()) / elapsed;
  result.completed_per_s = static_cast<double>(requests) / elapsed;
  for (std::size_t i = 0; i < requests; ++i) (i % 2 == 0 ? result.streaming : result.waiting).push_back(samples[i]);
  return result;
}

// ---- a tiny SVG scatter plot (self-contained: axes, ticks, units, legend) --------------

struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
};

std::string fmt_tick(double v) { return fmt::format("{:g}", v); }

bool write_svg(const std::filesystem::path& path, const std::string& title, const std::string& x_label,
               const std::string& y_label, const std::vector<Series>& series) {
  const double W = 760, H = 480, L = 80, R = 20, T = 50, B = 60;
  double x_max = 0, y_min = 1e300, y_max = 0;
  for (const auto& s : series) {
    for (auto [x, y] : s.points) {
      x_max = std::max(x_max, x);
      if (y > 0) {
        y_min = std::min(y_min, y);
        y_max = std::max(y_max, y);
      }
    }
  }
  if (y_max <= 0) return false;
  // Log y axis over whole decades; linear x axis from 0.
  const double lo = std::floor(std::log10(y_min)), hi = std::ceil(std::log10(y_max));
  const double x_top = std::ceil(x_max / 50.0) * 50.0;
  auto px = [&](double x) { return L + (W - L - R) * x / x_top; };
  auto py = [&](double y) { return H - B - (H - T - B) * (std::log10(y) - lo) / (hi - lo); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  svg += fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n", W / 2, title);
  for (double e = lo; e <= hi; ++e) {
    for (int m : {1, 2, 5}) {
      const double v = m * std::pow(10.0, e);
      if (std::log10(v) > hi + 1e-9) break;
      const double y = py(v);
      svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>\n", L, y, W - R, y);
      svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6, y + 4, fmt_tick(v));
    }
  }
  for (double x = 0; x <= x_top + 1e-9; x += 50) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>\n", px(x), T, H - B);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", px(x), H - B + 18, x);
  }
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", L, T, H - B);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", L, H - B, W - R);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2, H - 18, x_label);
  svg += fmt::format("<text transform=\"translate(22,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
                     (T + H - B) / 2, y_label);
  for (const auto& s : series) {
    for (auto [x, y] : s.points) {
      if (y <= 0) continue;
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\" fill-opacity=\"0.75\"/>\n", px(x),
                         py(y), s.color);
    }
  }
  double ly = T + 14;
  for (const auto& s : series) {
    svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{}\"/>\n", L + 18, ly - 4, s.color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", L + 30, ly, s.name);
    ly += 18;
  }
  svg += "</svg>\n";
  std::ofstream out(path);
  out << svg;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path out = std::filesystem::path(argv[0]).parent_path() / "streaming_demo.svg";
  std::size_t requests = 120;
  std::uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--requests" && i + 1 < argc) {
      requests = std::max<std::size_t>(2, std::strtoull(argv[++i], nullptr, 10));
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      fmt::print(stderr, "usage: {} [--out PATH] [--requests N] [--seed S]\n", argv[0]);
      return 2;
    }
  }

  Generator g{reference::GeneratorConfig{}};
  const double step_s = step_seconds(g);
  fmt::print("reference generator: vocab {}, hidden {}, {:.1f} MiB of weights per step, {} kernel; "
             "a decode step over {} sequences takes {:.2f} ms alone\n",
             g.config().vocab_size, g.config().hidden_dim, g.weight_bytes_per_step() / 1048576.0,
             reference::to_string(g.kernel()), kMaxActive, step_s * 1e3);
  // Capacity: every request at once, clients attached, as in the loaded runs.
  const RunResult saturated = run(g, 1.0, std::numeric_limits<double>::infinity(), requests, seed + 1);
  const double capacity = saturated.completed_per_s;
  fmt::print("capacity, all {} requests at once: {:.0f} requests/s, {:.0f} tokens/s "
             "(output lengths uniform in [{}, {}], prompts of {} tokens, max_active {})\n\n",
             requests, capacity, saturated.tokens_per_s, kMinLen, kMaxLen, kPrompt, kMaxActive);

  std::vector<RunResult> runs;
  for (double load : {0.3, 0.6, 0.9}) runs.push_back(run(g, load, load * capacity, requests, seed));

  fmt::print("{:>5} {:>8} | {:>22} | {:>22} | {:>9} | {:>9}\n", "load", "req/s", "streaming: first token",
             "non-streaming: answer", "p50 ratio", "tokens/s");
  fmt::print("{:>5} {:>8} | {:>10} {:>11} | {:>10} {:>11} | {:>9} | {:>9}\n", "", "", "p50 ms", "p95 ms", "p50 ms",
             "p95 ms", "", "");
  bool all_ok = true;
  for (const auto& r : runs) {
    std::vector<double> first, total;
    for (const auto& s : r.streaming) {
      first.push_back(s.first_ms);
      all_ok = all_ok && s.ok;
    }
    for (const auto& s : r.waiting) {
      total.push_back(s.total_ms);
      all_ok = all_ok && s.ok;
    }
    fmt::print("{:>4.0f}% {:>8.0f} | {:>10.2f} {:>11.2f} | {:>10.2f} {:>11.2f} | {:>8.1f}x | {:>9.0f}\n", r.load * 100,
               r.rate, percentile(first, 50), percentile(first, 95), percentile(total, 50), percentile(total, 95),
               percentile(total, 50) / percentile(first, 50), r.tokens_per_s);
  }

  // The latency field guide's Example 2 arithmetic (tailbatch::streaming_latency, tested
  // against the latency field guide's own figures in tests/test_planner.cpp) with this run's numbers:
  // a 100-token answer is perceived after the time to first token + 99 inter-token times.
  const auto& mid = runs[1];
  std::vector<double> first, itl;
  for (const auto& s : mid.streaming) {
    first.push_back(s.first_ms);
    if (s.tokens > 1) itl.push_back((s.total_ms - s.first_ms) / static_cast<double>(s.tokens - 1));
  }
  const double f = percentile(first, 50), t = percentile(itl, 50);
  constexpr std::int64_t kAnswer = 100;
  const StreamingLatency est =
      streaming_latency(GenerationProfile{.prefill_ms = 0.0, .first_token_ms = f, .tokens_per_s = 1000.0 / t}, kAnswer);
  fmt::print("\nAt 60% load, streaming clients: first token p50 {:.2f} ms, then {:.3f} ms per token p50 "
             "({:.0f} tokens/s per sequence).\n",
             f, t, 1000.0 / t);
  fmt::print("The latency field guide's Example 2 arithmetic with these numbers: a {}-token answer is perceived "
             "after {:.1f} ms without streaming, {:.2f} ms with it ({:.1f}x sooner).\n",
             kAnswer, est.total_ms, est.time_to_first_token_ms, est.streaming_speedup);
  // What the non-streaming clients of the same run actually waited for answers near that length.
  std::vector<double> near;
  for (const auto& s : mid.waiting) {
    if (s.tokens >= 80 && s.tokens <= 120) near.push_back(s.total_ms);
  }
  if (!near.empty()) {
    fmt::print("Measured: {} non-streaming clients with answers of 80-120 tokens waited p50 {:.1f} ms for them.\n",
               near.size(), percentile(near, 50));
  }
  fmt::print("Both kinds of client share each run: the same work and tokens/s; streaming changes only what "
             "the client waits for.\n");

  std::vector<Series> series(2);
  series[0].name = "non-streaming: whole answer (total generation time)";
  series[0].color = "#d62728";
  series[1].name = "streaming: time to first token";
  series[1].color = "#1f77b4";
  for (const auto& s : mid.waiting) series[0].points.emplace_back(static_cast<double>(s.tokens), s.total_ms);
  for (const auto& s : mid.streaming) series[1].points.emplace_back(static_cast<double>(s.tokens), s.first_ms);
  const std::string title =
      fmt::format("Perceived latency, streaming vs not (reference generator, {:.0f} req/s, 60% load)", mid.rate);
  if (!write_svg(out, title, "answer length (tokens)", "perceived latency (ms, log scale)", series)) {
    fmt::print(stderr, "could not write {}\n", out.string());
    return 1;
  }
  fmt::print("\nplot written to {}\n", std::filesystem::absolute(out).lexically_normal().string());
  if (!all_ok) {
    fmt::print(stderr, "some requests did not complete ok\n");
    return 1;
  }
  return 0;
}
