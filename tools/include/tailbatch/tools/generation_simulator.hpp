// Generation simulator: predicts what a ContinuousBatcher with a KV block pool does under a
// generation workload (tokens/s, time to first token, end-to-end latency, preemptions,
// recompute, prefix-cache hits) in milliseconds of CPU, before an engine is run.
//
// It is a discrete-event simulation on the ManualClock that drives the real thing, as the
// Pipeline's simulator (simulator.hpp) does: the same ContinuousBatcher
// (continuous_batcher.hpp), stepped by poll(), with the same KV scheduling
// (ContinuousKvConfig: grow with watermark and preemption of the newest admitted sequence
// by recompute, or reserve of prompt + max_tokens at admission) over the same KvBlockPool
// (prefix reuse of full blocks, LRU eviction of unreferenced cached blocks). Nothing of
// the scheduling is re-implemented. Only the engine is modelled:
//
//   * a step's time: GenerationStepCost, base + per_prefill_token x the prefill tokens it
//     computes + per_sequence x the sequences that emit a token in it (decoding ones, and
//     those whose prefill ends in it). Prefill tokens found in the prefix cache, and the
//     ones a preempted sequence recomputes, cost what the step really computes.
//   * each request's real output length: drawn from an OutputLengthDistribution (fixed or
//     geometric), capped at max_tokens; the modelled engine ends the sequence there, as an
//     end-of-sequence token would.
//
// Requests arrive by a LoadProfile (Poisson or constant, steady or stepped), the same
// ArrivalSchedule the load generator and the Pipeline's simulator use. A request's prompt
// is the workload's shared prefix (the same tokens for every request) followed by its own
// random tokens. Time to first token and end-to-end latency run from the request's
// arrival; tokens/s is every emitted token over the time from the first arrival slot (the
// profile's start) to the last sequence's end, as benchmarks/kv_cache measures live.
//
// simulate_generation() is single-threaded and owns no threads. Its results are exactly
// reproducible for the same configuration and seed (with the same standard library: the
// Poisson gaps come from <random>'s exponential distribution).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/clock.hpp>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/kv_block_pool.hpp>
#include <tailbatch/submit_options.hpp>
#include <tailbatch/token_streamer.hpp>
#include <tailbatch/tools/load_profile.hpp>
#include <vector>

namespace tailbatch {

namespace tools::detail {

// splitmix64: the simulator's own stream for prompts and output lengths, identical on
// every standard library.
[[nodiscard]] inline std::uint64_t gensim_next(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1), never 0 or 1.
[[nodiscard]] inline double gensim_uniform(std::uint64_t& state) noexcept {
  return (static_cast<double>(gensim_next(state) >> 11) + 0.5) / 9007199254740992.0;
}

// Reads a finite number from all of `text` into out; false when it is not one.
[[nodiscard]] inline bool gensim_parse_number(std::string_view text, double& out) {
  if (text.empty()) return false;
  const std::string s(text);
  std::size_t used = 0;
  try {
    out = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size() && std::isfinite(out);
}

}  // namespace tools::detail

// How long real outputs run, before max_tokens caps them. A value type; thread-safe to
// share.
//   fixed(n)         every output is n tokens (n >= 1)
//   geometric(mean)  lengths 1, 2, 3, ... with P(L = k) = p (1 - p)^(k - 1), p = 1 / mean
//                    (mean >= 1): most outputs short, a long tail, as chat replies are
class OutputLengthDistribution {
 public:
  enum class Kind : std::uint8_t { fixed, geometric };

  // Every output n tokens. Throws std::invalid_argument unless n >= 1.
  [[nodiscard]] static OutputLengthDistribution fixed(std::size_t n) {
    if (n < 1)
      tailbatch::detail::throw_invalid_argument(
          "OutputLengthDistribution: fixed length must be >= 1");
    return OutputLengthDistribution(Kind::fixed, static_cast<double>(n));
  }
  // Geometric lengths of the given mean. Throws std::invalid_argument unless mean is finite
  // and >= 1.
  [[nodiscard]] static OutputLengthDistribution geometric(double mean) {
    if (!(std::isfinite(mean) && mean >= 1.0))
      tailbatch::detail::throw_invalid_argument(
          "OutputLengthDistribution: geometric mean must be >= 1");
    return OutputLengthDistribution(Kind::geometric, mean);
  }

  [[nodiscard]] Kind kind() const noexcept { return kind_; }
  // The mean length before any cap (fixed: the length). Thread-safe.
  [[nodiscard]] double mean() const noexcept { return mean_; }
  // The mean length once capped at max_tokens: E[min(L, max_tokens)]. Thread-safe.
  [[nodiscard]] double capped_mean(std::size_t max_tokens) const noexcept {
    const double m = static_cast<double>(max_tokens);
    if (kind_ == Kind::fixed || mean_ <= 1.0) return std::min(mean_, m);
    // E[min(L, m)] = sum_{k=1..m} P(L >= k) = (1 - q^m) / p, q = 1 - p.
    const double p = 1.0 / mean_;
    return (1.0 - std::pow(1.0 - p, m)) / p;
  }
  // One length (>= 1, uncapped), advancing `state` (a splitmix64 stream). Never allocates.
  // Not thread-safe: one stream per caller.
  [[nodiscard]] std::size_t sample(std::uint64_t& state) const noexcept {
    if (kind_ == Kind::fixed) return static_cast<std::size_t>(mean_);
    if (mean_ <= 1.0) return 1;
    const double p = 1.0 / mean_;
    // Inversion: 1 + floor(ln U / ln(1 - p)) is geometric on {1, 2, ...}.
    const double k = std::floor(std::log(tools::detail::gensim_uniform(state)) / std::log1p(-p));
    if (!(k < 1e15)) return static_cast<std::size_t>(1e15);
    return 1 + static_cast<std::size_t>(k);
  }
  // "fixed:N" or "geometric:MEAN", as parse_output_lengths() reads it. Allocates.
  [[nodiscard]] std::string to_string() const {
    std::string n = std::to_string(mean_);
    n.erase(n.find_last_not_of('0') + 1);
    if (!n.empty() && n.back() == '.') n.pop_back();
    return (kind_ == Kind::fixed ? "fixed:" : "geometric:") + n;
  }

 private:
  OutputLengthDistribution(Kind k, double mean) noexcept : kind_(k), mean_(mean) {}
  Kind kind_;
  double mean_;
};

// Reads "fixed:N" (N a whole number >= 1) or "geometric:MEAN" (MEAN a number >= 1).
// Throws std::invalid_argument with a message that quotes the text and says what was
// expected. Allocates. Thread-safe.
[[nodiscard]] inline OutputLengthDistribution parse_output_lengths(std::string_view text) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  const auto colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view value =
      colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  double v = 0;
  if (kind == "fixed") {
    if (!tools::detail::gensim_parse_number(value, v) || v < 1 || v > 1e9 || v != std::floor(v))
      tailbatch::detail::throw_invalid_argument(
          quoted + ": fixed:N needs a whole number N >= 1 (the output length)");
    return OutputLengthDistribution::fixed(static_cast<std::size_t>(v));
  }
  if (kind == "geometric") {
    if (!tools::detail::gensim_parse_number(value, v) || v < 1 || v > 1e9)
      tailbatch::detail::throw_invalid_argument(
          quoted + ": geometric:MEAN needs a number MEAN >= 1 (the mean length)");
    return OutputLengthDistribution::geometric(v);
  }
  tailbatch::detail::throw_invalid_argument(
      quoted + ": expected fixed:N or geometric:MEAN, as in fixed:128 or geometric:128");
}

// What each request asks for. A plain aggregate; simulate_generation() validates it.
struct GenerationWorkload {
  LoadProfile arrivals = LoadProfile::poisson(10.0, std::chrono::seconds(10));
  // Seeds the arrivals, the prompts and the output lengths.
  std::uint64_t seed = 42;
  // Tokens of each request's own prompt (random, so unique to it), after the shared prefix.
  std::size_t prompt_tokens = 64;
  // Tokens every request's prompt starts with (one fixed random sequence: a system prompt, a
  // few-shot header); 0: none. The prompt is shared_prefix_tokens + prompt_tokens long, and
  // must hold at least one token.
  std::size_t shared_prefix_tokens = 0;
  // Each request's max_tokens (max_new_tokens): what reserve mode books, and where an output
  // is cut. >= 1.
  std::size_t max_tokens = 512;
  // Real output lengths, capped at max_tokens.
  OutputLengthDistribution output_lengths = OutputLengthDistribution::fixed(128);
  // Prompt tokens are drawn from [1, vocab_size). >= 2.
  std::uint32_t vocab_size = 2048;
};

// The modelled engine's time for one step. The defaults are fitted to the reference
// generator (512 wide, 2 048 tokens, CPU) behind a ContinuousBatcher with a KV pool on a
// 2-core x86-64 machine (docs/performance.md, "KV-cache scheduling"): a step streams the
// weights once, so its base dominates and each sequence adds little.
struct GenerationStepCost {
  std::chrono::nanoseconds base{std::chrono::microseconds(290)};
  std::chrono::nanoseconds per_prefill_token{std::chrono::nanoseconds(5000)};
  // Per sequence that emits a token in the step (decoding, or ending its prefill): the
  // token fed and the logits over the vocabulary.
  std::chrono::nanoseconds per_sequence{std::chrono::microseconds(17)};

  // The time of a step that computes `prefill_tokens` prompt tokens and emits for
  // `sequences` sequences. Never allocates. Thread-safe.
  [[nodiscard]] std::chrono::nanoseconds operator()(std::size_t prefill_tokens,
                                                    std::size_t sequences) const noexcept {
    return base + per_prefill_token * static_cast<std::int64_t>(prefill_tokens) +
           per_sequence * static_cast<std::int64_t>(sequences);
  }
};

// What to simulate. A plain aggregate; simulate_generation() validates it and throws
// std::invalid_argument naming the field.
struct GenerationSimConfig {
  GenerationWorkload workload{};
  GenerationStepCost cost{};
  // The ContinuousBatcher's scheduling, as a server would configure it (its config's
  // fields of the same names): the decode batch, the KV pool (mode off: the token budget),
  // chunked prefill.
  std::size_t max_active = 16;
  ContinuousKvConfig kv{KvMode::grow, 16, 256, 0, true};
  std::size_t token_budget = 65536;  // KvMode::off only
  std::size_t max_step_tokens = 0;
  std::size_t prefill_chunk = 0;
  // The waiting queue: arrivals beyond it are rejected (queue_full). Open-loop load past
  // capacity grows the queue for as long as the profile lasts.
  std::size_t queue_capacity = 1'000'000;
};

// What the simulation predicts. Latencies run from each request's arrival on the modelled
// clock; percentiles are nearest-rank over every request that reached that point.
struct GenerationSimResult {
  std::uint64_t requests = 0;  // arrivals submitted
  std::uint64_t ok = 0;        // ended Status::ok
  std::uint64_t errors = 0;    // ended otherwise (rejected: queue_full, too_large)
  std::uint64_t tokens = 0;    // emitted
  std::uint64_t steps = 0;
  double offered_rps = 0.0;   // requests / the profile's duration
  double achieved_rps = 0.0;  // ok / makespan
  double tokens_per_s = 0.0;  // tokens / makespan
  // From the profile's start to the last sequence's end.
  std::chrono::nanoseconds makespan{0};
  std::chrono::nanoseconds ttft_p50{0}, ttft_p95{0}, ttft_p99{0};
  std::chrono::nanoseconds e2e_p50{0}, e2e_p95{0}, e2e_p99{0};  // ok requests
  std::uint64_t preemptions = 0;
  std::uint64_t recomputed_tokens = 0;  // KV computed again after a preemption
  std::uint64_t prompt_tokens = 0;      // prompt tokens submitted
  std::uint64_t prefill_tokens = 0;     // prefill tokens the steps computed (recompute included)
  double prefix_hit_rate = 0.0;         // prompt tokens found cached / looked up
  double mean_sequences_per_step = 0.0;
  double mean_output_tokens = 0.0;  // tokens / ok
  KvBlockPoolStats kv{};            // the pool at the end
};

// Runs the simulation: every arrival of the profile, then until every sequence has ended.
// Throws std::invalid_argument naming a bad field (config.workload.*, config.cost.*, and
// what the ContinuousBatcher's constructor checks); std::bad_alloc. Owns no threads.
// Thread-safe (a call shares nothing with another).
[[nodiscard]] inline GenerationSimResult simulate_generation(const GenerationSimConfig& config) {
  using namespace std::chrono;
  const GenerationWorkload& w = config.workload;
  if (w.prompt_tokens + w.shared_prefix_tokens < 1)
    tailbatch::detail::throw_invalid_argument(
        "GenerationSimConfig: workload.prompt_tokens + workload.shared_prefix_tokens must be >= 1");
  if (w.max_tokens < 1)
    tailbatch::detail::throw_invalid_argument(
        "GenerationSimConfig: workload.max_tokens must be >= 1");
  if (w.vocab_size < 2)
    tailbatch::detail::throw_invalid_argument(
        "GenerationSimConfig: workload.vocab_size must be >= 2");
  if (config.cost.base < nanoseconds::zero() ||
      config.cost.per_prefill_token < nanoseconds::zero() ||
      config.cost.per_sequence < nanoseconds::zero())
    tailbatch::detail::throw_invalid_argument("GenerationSimConfig: cost fields must be >= 0");
  if (config.cost(1, 1) <= nanoseconds::zero())
    tailbatch::detail::throw_invalid_argument(
        "GenerationSimConfig: cost must make a step take time");

  // The modelled engine keeps each sequence's real output length.
  struct Length {
    std::size_t tokens = 0;
  };
  using Batcher = ContinuousBatcher<std::int32_t, Length, ManualClock>;
  using Seq = Batcher::Sequence;

  ManualClock clock;
  const ManualClock::time_point origin = clock.now();
  GenerationSimResult r;
  std::uint64_t prefill_computed = 0, sequences_stepped = 0;

  ContinuousBatcherConfig bc;
  bc.max_active = config.max_active;
  bc.token_budget = config.token_budget;
  bc.queue_capacity = config.queue_capacity;
  bc.max_step_tokens = config.max_step_tokens;
  bc.prefill_chunk = config.prefill_chunk;
  bc.kv = config.kv;
  bc.workers = 0;
  const std::int32_t vocab =
      static_cast<std::int32_t>(std::min<std::uint32_t>(w.vocab_size, 1u << 30));
  Batcher batcher(
      [&](std::span<Seq> batch) {
        std::size_t prefill = 0, emitting = 0;
        for (const Seq& s : batch) {
          if (!s.decoding()) prefill += s.prefill_chunk().size();
          if (s.emits()) ++emitting;
        }
        prefill_computed += prefill;
        sequences_stepped += batch.size();
        clock.advance(config.cost(prefill, emitting));  // the tokens exist when the step ends
        for (Seq& s : batch) {
          if (!s.emits()) continue;
          // A token of its own: generated blocks committed for reuse never match another's.
          const auto token = static_cast<std::int32_t>(
              1 + (s.id() * 7919 + s.generated()) % static_cast<std::uint64_t>(vocab - 1));
          (void)s.emit(token);
          if (s.generated() >= s.state().tokens) s.finish();
        }
      },
      bc, clock);

  std::uint64_t content = w.seed ^ 0x5DEECE66Dull;  // prompts and output lengths
  auto random_token = [&] {
    return static_cast<std::int32_t>(1 + tools::detail::gensim_next(content) %
                                             static_cast<std::uint64_t>(vocab - 1));
  };
  std::vector<std::int32_t> prefix(w.shared_prefix_tokens);
  for (auto& t : prefix) t = random_token();

  std::vector<nanoseconds> arrival;  // per request, from origin
  std::vector<nanoseconds> ttft, e2e;
  std::vector<bool> seen_first;
  std::uint64_t ended = 0;
  nanoseconds last_end{0};
  auto since_origin = [&] { return duration_cast<nanoseconds>(clock.now() - origin); };

  ArrivalSchedule schedule(w.arrivals, w.seed);
  std::optional<nanoseconds> next = schedule.next();
  auto submit = [&](nanoseconds at) {
    const std::size_t i = arrival.size();
    arrival.push_back(at);
    seen_first.push_back(false);
    Batcher::Request req;
    req.prompt.reserve(prefix.size() + w.prompt_tokens);
    req.prompt = prefix;
    for (std::size_t k = 0; k < w.prompt_tokens; ++k) req.prompt.push_back(random_token());
    req.max_new_tokens = w.max_tokens;
    req.state.tokens = std::min(w.output_lengths.sample(content), w.max_tokens);
    r.prompt_tokens += req.prompt.size();
    SubmitOptions options;
    options.arrival = origin + at;
    StreamCallbacks<std::int32_t> cb;
    cb.on_tokens = [&, i](std::span<const std::int32_t>) {
      if (seen_first[i]) return;
      seen_first[i] = true;
      ttft.push_back(since_origin() - arrival[i]);
    };
    cb.on_end = [&, i](const StreamEnd& end) {
      ++ended;
      last_end = std::max(last_end, since_origin());
      if (end.ok()) {
        ++r.ok;
        e2e.push_back(since_origin() - arrival[i]);
      } else {
        ++r.errors;
      }
    };
    (void)batcher.submit(std::move(req), options, std::move(cb));
  };

  for (;;) {
    while (next && *next <= since_origin()) {
      submit(*next);
      next = schedule.next();
    }
    const ContinuousBatcherPollResult turn = batcher.poll();
    if (turn.stepped) continue;
    if (next) {
      clock.advance_to(origin + *next);  // idle until the next arrival
    } else if (ended == arrival.size() || (turn.admitted == 0 && turn.completed == 0)) {
      break;  // everything ended (or nothing can move any more: shutdown() below ends it)
    }
  }
  batcher.shutdown();
  const ContinuousBatcherStats stats = batcher.stats();

  r.requests = arrival.size();
  r.tokens = stats.tokens;
  r.steps = stats.steps;
  r.preemptions = stats.preemptions;
  r.recomputed_tokens = stats.recomputed_tokens;
  r.prefill_tokens = prefill_computed;
  r.kv = stats.kv;
  r.prefix_hit_rate = stats.kv.prefix_hit_rate();
  r.makespan = last_end;
  const double profile_s = duration<double>(w.arrivals.duration()).count();
  const double makespan_s = duration<double>(last_end).count();
  r.offered_rps = profile_s > 0 ? static_cast<double>(r.requests) / profile_s : 0.0;
  r.achieved_rps = makespan_s > 0 ? static_cast<double>(r.ok) / makespan_s : 0.0;
  r.tokens_per_s = makespan_s > 0 ? static_cast<double>(r.tokens) / makespan_s : 0.0;
  r.mean_sequences_per_step =
      r.steps > 0 ? static_cast<double>(sequences_stepped) / static_cast<double>(r.steps) : 0.0;
  r.mean_output_tokens = r.ok > 0 ? static_cast<double>(r.tokens) / static_cast<double>(r.ok) : 0.0;
  auto rank = [](std::vector<nanoseconds>& v, double q) {
    if (v.empty()) return nanoseconds{0};
    const auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::min(i == 0 ? 0 : i - 1, v.size() - 1)];
  };
  std::sort(ttft.begin(), ttft.end());
  std::sort(e2e.begin(), e2e.end());
  r.ttft_p50 = rank(ttft, 0.50);
  r.ttft_p95 = rank(ttft, 0.95);
  r.ttft_p99 = rank(ttft, 0.99);
  r.e2e_p50 = rank(e2e, 0.50);
  r.e2e_p95 = rank(e2e, 0.95);
  r.e2e_p99 = rank(e2e, 0.99);
  return r;
}

}  // namespace tailbatch
