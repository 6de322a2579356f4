// Continuous (iteration-level) batching against static batching on the reference
// generator, measured in the same run:
//   BM_Generation_Continuous  ContinuousBatcher, max_active 16: a finished sequence's slot
//                             is refilled before the next step.
//   BM_Generation_Static      the baseline: take up to 16 waiting requests, run the batch
//                             until its longest sequence finishes, then take the next 16.
//                             Finished sequences leave the step (no padding), which is
//                             the most favourable static batcher.
// Both run the same Generator (vocab 2048, hidden 512: 6 MiB of weights read per step),
// prompts of 16 tokens, output lengths uniform in [8, 256], tokens streamed through a
// TokenStreamer each.
//
// /open_loop:0  all 256 requests arrive at once; items_per_second = generated tokens per
//               second of real time (the throughput comparison).
// /open_loop:1  120 requests arrive at a constant rate (one every 1/rate s) set to half of
//               the static batcher's capacity as calibrated at start-up (counter rate_rps);
//               counters ttft_p50_ms / ttft_p95_ms: time from submission to the first
//               token's emission.
// Counters: steps (decode steps run), ideal_ratio (E[longest of 16] / E[length] for the
// length distribution, exact), ideal_ratio_sample (the same for the very lengths drawn).
//
//   BM_Generation_Step/batch:N  one decode step of the generator over N sequences (the
//                               cost model both batchers rely on): flat from 1 to 16.
//
// What this does not show: a GPU (the step's cost here comes from a CPU lane-group kernel
// that is flat from 1 to 16 sequences, see docs/continuous-batching.md), preemption, or
// prompts long enough for chunked prefill to matter.
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/latency_histogram.hpp>
#include <tailbatch/reference/generator.hpp>
#include <tailbatch/token_streamer.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

using namespace tailbatch;
using reference::Generator;
using reference::GeneratorLane;
using reference::GeneratorState;

namespace {

constexpr std::size_t kBatch = 16;
constexpr std::size_t kPrompt = 16;
constexpr std::size_t kOffline = 256;
constexpr std::size_t kOpenLoop = 120;
constexpr std::size_t kMinLen = 8;
constexpr std::size_t kMaxLen = 256;

using Batcher = ContinuousBatcher<std::int32_t, GeneratorState>;
using Stream = TokenStreamer<std::int32_t>;

struct Job {
  std::vector<std::int32_t> prompt;
  std::size_t length = 0;
  std::uint64_t seed = 0;
};

std::vector<Job> make_jobs(std::size_t n, std::uint64_t seed, std::uint32_t vocab) {
  reference::OutputLengths lengths(kMinLen, kMaxLen, seed);
  std::vector<Job> jobs(n);
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < n; ++i) {
    jobs[i].length = lengths.next();
    jobs[i].seed = i;
    for (std::size_t k = 0; k < kPrompt; ++k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      jobs[i].prompt.push_back(static_cast<std::int32_t>((x >> 33) % vocab));
    }
  }
  return jobs;
}

Generator& generator() {
  static Generator g{reference::GeneratorConfig{}};
  return g;
}

double ideal_ratio_sample(const std::vector<Job>& jobs) {
  double longest = 0, total = 0;
  for (std::size_t b = 0; b < jobs.size(); b += kBatch) {
    std::size_t m = 0;
    for (std::size_t i = b; i < std::min(jobs.size(), b + kBatch); ++i) m = std::max(m, jobs[i].length);
    longest += static_cast<double>(m);
  }
  for (const auto& j : jobs) total += static_cast<double>(j.length);
  return longest / (total / kBatch);
}

// The static baseline: batches of up to kBatch waiting requests, each run to its longest.
class StaticBatcher {
 public:
  explicit StaticBatcher(Generator& g) : g_(g) {}

  struct Entry {
    Job job;
    std::shared_ptr<Stream> stream;
    GeneratorState state;
    std::size_t made = 0;
  };

  std::shared_ptr<Stream> submit(const Job& job) {
    auto s = std::make_shared<Stream>();
    {
      std::lock_guard lock(m_);
      waiting_.push_back(Entry{job, s, g_.new_state(job.seed), 0});
    }
    cv_.notify_one();
    return s;
  }

  // Runs one batch from whatever is waiting (up to kBatch) until its longest finishes.
  // Returns false if nothing was waiting.
  bool run_batch() {
    std::vector<Entry> batch;
    {
      std::lock_guard lock(m_);
      while (!waiting_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    if (batch.empty()) return false;
    std::vector<GeneratorLane> lanes;
    std::vector<Entry*> live;
    bool prefill = true;
    for (;;) {
      lanes.clear();
      live.clear();
      for (auto& e : batch) {
        if (e.made >= e.job.length) continue;
        GeneratorLane l;
        l.state = &e.state;
        l.feed = prefill ? std::span<const std::int32_t>(e.job.prompt)
                         : std::span<const std::int32_t>(&e.state.next_input, 1);
        lanes.push_back(l);
        live.push_back(&e);
      }
      if (lanes.empty()) break;
      g_.step(lanes, ws_);
      ++steps_;
      prefill = false;
      for (std::size_t i = 0; i < lanes.size(); ++i) {
        live[i]->stream->push(lanes[i].token);
        if (++live[i]->made == live[i]->job.length) live[i]->stream->close(Status::ok);
      }
    }
    return true;
  }

  // Threaded mode: a worker that runs batches until stop() and the queue is empty.
  void start() {
    worker_ = std::thread([this] {
      for (;;) {
        {
          std::unique_lock lock(m_);
          cv_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
          if (stop_ && waiting_.empty()) return;
        }
        (void)run_batch();
      }
    });
  }
  // Steps run so far; read it from the thread that ran the batches, or after stop().
  [[nodiscard]] std::size_t steps() const noexcept { return steps_; }

  void stop() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }

 private:
  Generator& g_;
  reference::GeneratorWorkspace ws_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Entry> waiting_;
  bool stop_ = false;
  std::size_t steps_ = 0;
  std::thread worker_;
};

// n fresh sequences, one decode lane each (every lane feeds its sequence's next input).
// The lanes point into the states: neither copyable nor movable.
struct DecodeLanes {
  std::vector<GeneratorState> states;
  std::vector<GeneratorLane> lanes;
  DecodeLanes(const Generator& g, std::size_t n) : states(n), lanes(n) {
    for (std::size_t i = 0; i < n; ++i) {
      states[i] = g.new_state(i);
      lanes[i].state = &states[i];
      lanes[i].feed = std::span<const std::int32_t>(&states[i].next_input, 1);
    }
  }
  DecodeLanes(const DecodeLanes&) = delete;
  DecodeLanes& operator=(const DecodeLanes&) = delete;
};

// The calibrated arrival rate: half the static batcher's capacity, kBatch sequences per
// E[longest] steps of a full lane group.
double open_loop_rate() {
  static const double rate = [] {
    auto& g = generator();
    DecodeLanes d(g, kBatch);
    reference::GeneratorWorkspace ws;
    for (int i = 0; i < 20; ++i) g.step(d.lanes, ws);
    const int reps = 100;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) g.step(d.lanes, ws);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    const reference::OutputLengths dist(kMinLen, kMaxLen, 0);
    return 0.5 * kBatch / (dist.expected_longest(kBatch) * step_s);
  }();
  return rate;
}

void report(benchmark::State& state, std::size_t tokens, std::size_t steps, const std::vector<Job>& jobs) {
  const reference::OutputLengths dist(kMinLen, kMaxLen, 0);
  state.SetItemsProcessed(static_cast<std::int64_t>(tokens));
  state.counters["steps"] = static_cast<double>(steps);
  state.counters["ideal_ratio"] = dist.expected_longest(kBatch) / dist.expected_mean();
  state.counters["ideal_ratio_sample"] = ideal_ratio_sample(jobs);
}

void report_ttft(benchmark::State& state, const std::vector<std::shared_ptr<Stream>>& streams, double rate) {
  LatencyHistogram ttft;
  for (const auto& s : streams) {
    auto t = s->times();
    if (t.first_token) ttft.record(*t.first_token - t.start);
  }
  auto snap = ttft.snapshot();
  state.counters["ttft_p50_ms"] = std::chrono::duration<double, std::milli>(snap.percentile(50)).count();
  state.counters["ttft_p95_ms"] = std::chrono::duration<double, std::milli>(snap.percentile(95)).count();
  state.counters["rate_rps"] = rate;
}

// Submits jobs at a constant rate from this thread.
template <class Submit>
std::vector<std::shared_ptr<Stream>> arrive(const std::vector<Job>& jobs, double rate, Submit&& submit) {
  std::vector<std::shared_ptr<Stream>> streams;
  const auto gap = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(1.0 / rate));
  auto next = std::chrono::steady_clock::now();
  for (const auto& job : jobs) {
    std::this_thread::sleep_until(next);
    streams.push_back(submit(job));
    next += gap;
  }
  return streams;
}

std::size_t wait_all(const std::vector<std::shared_ptr<Stream>>& streams) {
  std::size_t tokens = 0;
  for (const auto& s : streams) tokens += s->wait_end().tokens;
  return tokens;
}

// One generation benchmark: the offline (state.range(0) == 0) or open-loop job list, and per
// iteration `once(g, jobs, open_loop, rate, streams)` serving it all and returning the tokens
// and batch steps it took.
template <class Once>
void run_generation(benchmark::State& state, Once&& once) {
  const bool open_loop = state.range(0) != 0;
  auto& g = generator();
  const auto jobs = make_jobs(open_loop ? kOpenLoop : kOffline, 42, g.config().vocab_size);
  const double rate = open_loop ? open_loop_rate() : 0.0;
  std::size_t tokens = 0, steps = 0;
  std::vector<std::shared_ptr<Stream>> streams;
  for (auto _ : state) {
    const auto [t, s] = once(g, jobs, open_loop, rate, streams);
    tokens += t;
    steps = s;
  }
  report(state, tokens, steps, jobs);
  if (open_loop) report_ttft(state, streams, rate);
}

void BM_Generation_Continuous(benchmark::State& state) {
  run_generation(state, [](Generator& g, const std::vector<Job>& jobs, bool open_loop, double rate,
                           std::vector<std::shared_ptr<Stream>>& streams) {
    ContinuousBatcherConfig c;
    c.max_active = kBatch;
    c.queue_capacity = jobs.size();
    c.workers = open_loop ? 1 : 0;  // offline: stepped here by poll()
    Batcher b([&](std::span<Batcher::Sequence> batch) { g.step_sequences(batch); }, c);
    auto submit = [&](const Job& job) {
      Batcher::Request r;
      r.prompt = job.prompt;
      r.max_new_tokens = job.length;
      r.state = g.new_state(job.seed);
      return b.submit(std::move(r));
    };
    std::size_t tokens = 0;
    if (open_loop) {
      streams = arrive(jobs, rate, submit);
      tokens = wait_all(streams);
    } else {
      streams.clear();
      for (const auto& job : jobs) streams.push_back(submit(job));
      while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
      tokens = wait_all(streams);
    }
    b.shutdown();
    return std::pair(tokens, static_cast<std::size_t>(b.stats().steps));
  });
}

void BM_Generation_Static(benchmark::State& state) {
  run_generation(state, [](Generator& g, const std::vector<Job>& jobs, bool open_loop, double rate,
                           std::vector<std::shared_ptr<Stream>>& streams) {
    StaticBatcher b(g);
    std::size_t tokens = 0;
    if (open_loop) {
      b.start();
      streams = arrive(jobs, rate, [&](const Job& job) { return b.submit(job); });
      tokens = wait_all(streams);
      b.stop();
    } else {
      streams.clear();
      for (const auto& job : jobs) streams.push_back(b.submit(job));
      while (b.run_batch()) {
      }
      tokens = wait_all(streams);
    }
    return std::pair(tokens, static_cast<std::size_t>(b.steps()));
  });
}

void BM_Generation_Step(benchmark::State& state) {
  auto& g = generator();
  const auto n = static_cast<std::size_t>(state.range(0));
  DecodeLanes d(g, n);
  reference::GeneratorWorkspace ws;
  for (auto _ : state) g.step(d.lanes, ws);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["weight_MiB"] = static_cast<double>(g.weight_bytes_per_step()) / 1048576.0;
}

BENCHMARK(BM_Generation_Step)->ArgName("batch")->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Generation_Continuous)->ArgName("open_loop")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Generation_Static)->ArgName("open_loop")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
