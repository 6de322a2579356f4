// tailbatch-load's generation workloads: output-length distributions and shared-prefix
// prompts, simulated (--simulate --model generator: tailbatch::simulate_generation,
// a ContinuousBatcher with a KV block pool on a modelled clock) or sent to tailbatch-serve's
// /v1/completions (--url: one body per request, max_tokens drawn from the distribution,
// the prompt the shared prefix followed by words of its own).
//
// Flags (add_generation_options()): --output-len, --max-tokens, --prompt-len,
// --shared-prefix (the workload); --kv-blocks, --kv-block-size, --kv-mode (as
// tailbatch-serve's), --kv-watermark, --prefix-caching, --gen-max-active (the scheduler);
// --step-base-us, --prefill-token-us, --sequence-us (the modelled engine).
#pragma once

#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tailbatch/tools/generation_simulator.hpp>
#include <tailbatch/tools/load_profile.hpp>
#include <utility>
#include <vector>

namespace tailbatch_load {

// A CLI11 check: a whole number in [lo, hi] (tailbatch-load's count flags use it too).
inline CLI::Validator count_check(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        long long v = 0;
        std::size_t used = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::out_of_range&) {
          return fmt::format("must be in [{}, {}], got {}", lo, hi, text);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "\"" + text + "\" is not a whole number";
        if (v < lo || v > hi) return fmt::format("must be in [{}, {}], got {}", lo, hi, text);
        return {};
      },
      fmt::format("INTEGER in [{}, {}]", lo, hi));
}

// The generation flags, as parsed.
struct GenerationCli {
  std::string output_len = "fixed:128";
  std::size_t max_tokens = 512;
  std::size_t prompt_len = 64;
  std::size_t shared_prefix = 0;
  std::size_t kv_blocks = 256;
  std::size_t kv_block_size = 16;
  std::string kv_mode = "grow";
  std::size_t kv_watermark = 0;
  std::string prefix_caching = "on";
  std::size_t max_active = 16;
  double step_base_us = 290.0;
  double prefill_token_us = 5.0;
  double sequence_us = 17.0;
  // The workload flags given on the command line (they shape --url bodies), and the
  // simulation-only ones.
  std::vector<CLI::Option*> workload_flags;
  std::vector<CLI::Option*> simulation_flags;

  [[nodiscard]] bool workload_given() const {
    return std::any_of(workload_flags.begin(), workload_flags.end(),
                       [](const CLI::Option* o) { return o->count() > 0; });
  }
  [[nodiscard]] const CLI::Option* simulation_flag_given() const {
    for (const CLI::Option* o : simulation_flags)
      if (o->count() > 0) return o;
    return nullptr;
  }
};

// Registers the generation flags on tailbatch-load's app.
inline void add_generation_options(CLI::App& app, GenerationCli& g) {
  const CLI::Validator lengths(
      [](std::string& text) -> std::string {
        try {
          (void)tailbatch::parse_output_lengths(text);
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
        return {};
      },
      "fixed:N|geometric:MEAN");
  const CLI::Validator cost(
      [](std::string& text) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(v))
          return "\"" + text + "\" is not a number";
        if (v < 0) return "must be >= 0, got " + text;
        return {};
      },
      "MICROSECONDS >= 0");
  g.workload_flags = {
      app.add_option(
             "--output-len", g.output_len,
             "generation: real output lengths, fixed:N or geometric:MEAN (capped at --max-tokens; "
             "with --url each body's max_tokens is drawn from it)")
          ->capture_default_str()
          ->check(lengths),
      app.add_option("--max-tokens", g.max_tokens,
                     "generation: each request's max_tokens (what --kv-mode reserve books)")
          ->capture_default_str()
          ->check(count_check(1, 1 << 20)),
      app.add_option(
             "--prompt-len", g.prompt_len,
             "generation: tokens of each request's own prompt, after the shared prefix (with "
             "--url: words, one token each for the reference tokenizer)")
          ->capture_default_str()
          ->check(count_check(0, 1 << 20)),
      app.add_option("--shared-prefix", g.shared_prefix,
                     "generation: tokens of a prefix every request's prompt starts with (a system "
                     "prompt); 0: none")
          ->capture_default_str()
          ->check(count_check(0, 1 << 20)),
  };
  g.simulation_flags = {
      app.add_option("--kv-blocks", g.kv_blocks, "--model generator: blocks in the KV cache")
          ->capture_default_str()
          ->check(count_check(1, 1 << 24)),
      app.add_option("--kv-block-size", g.kv_block_size, "--model generator: tokens per KV block")
          ->capture_default_str()
          ->check(count_check(1, 1024)),
      app.add_option(
             "--kv-mode", g.kv_mode,
             "--model generator: grow (blocks as sequences grow, preempting the newest when the "
             "cache is full) or reserve (prompt + max_tokens booked at admission)")
          ->capture_default_str()
          ->check(CLI::IsMember({"grow", "reserve"})),
      app.add_option("--kv-watermark", g.kv_watermark,
                     "--model generator, grow: blocks kept free when admitting (room to grow)")
          ->capture_default_str()
          ->check(count_check(0, 1 << 24)),
      app.add_option(
             "--prefix-caching", g.prefix_caching,
             "--model generator: share full prompt blocks between requests (on) or not (off)")
          ->capture_default_str()
          ->check(CLI::IsMember({"on", "off"})),
      app.add_option("--gen-max-active", g.max_active,
                     "--model generator: sequences decoded together")
          ->capture_default_str()
          ->check(count_check(1, 4096)),
      app.add_option(
             "--step-base-us", g.step_base_us,
             "--model generator: a step's fixed time, us (default: the reference generator's)")
          ->capture_default_str()
          ->check(cost),
      app.add_option("--prefill-token-us", g.prefill_token_us,
                     "--model generator: a step's time per prompt token it computes, us")
          ->capture_default_str()
          ->check(cost),
      app.add_option("--sequence-us", g.sequence_us,
                     "--model generator: a step's time per sequence that emits a token in it, us")
          ->capture_default_str()
          ->check(cost),
  };
}

// The simulator's configuration from the flags (workload arrivals and seed left to the
// caller).
[[nodiscard]] inline tailbatch::GenerationSimConfig generation_config(
    const GenerationCli& g) {
  using namespace std::chrono;
  tailbatch::GenerationSimConfig c;
  c.workload.prompt_tokens = g.prompt_len;
  c.workload.shared_prefix_tokens = g.shared_prefix;
  c.workload.max_tokens = g.max_tokens;
  c.workload.output_lengths = tailbatch::parse_output_lengths(g.output_len);
  c.max_active = g.max_active;
  c.kv.mode = g.kv_mode == "reserve" ? tailbatch::KvMode::reserve : tailbatch::KvMode::grow;
  c.kv.block_size = g.kv_block_size;
  c.kv.total_blocks = g.kv_blocks;
  c.kv.watermark_blocks = g.kv_watermark;
  c.kv.prefix_caching = g.prefix_caching == "on";
  auto us = [](double v) { return duration_cast<nanoseconds>(duration<double, std::micro>(v)); };
  c.cost = {us(g.step_base_us), us(g.prefill_token_us), us(g.sequence_us)};
  return c;
}

// What is wrong with the generation flags for this run ("" when nothing): simulate_generator
// (--simulate --model generator) or url (--url). Thread-safe.
[[nodiscard]] inline std::string generation_flags_error(const GenerationCli& g,
                                                        bool simulate_generator, bool url) {
  if (!simulate_generator && !url) {
    for (const CLI::Option* o : g.workload_flags)
      if (o->count() > 0)
        return o->get_name() +
               " shapes a generation workload: add --simulate --model generator, or --url";
  }
  if (!simulate_generator) {
    if (const CLI::Option* o = g.simulation_flag_given())
      return o->get_name() +
             " configures the simulated generator: add --simulate --model generator";
    return {};
  }
  const std::size_t prompt = g.shared_prefix + g.prompt_len;
  if (prompt < 1) return "--prompt-len and --shared-prefix: a prompt needs at least one token";
  if (g.kv_watermark >= g.kv_blocks)
    return fmt::format("--kv-watermark ({}) must be less than --kv-blocks ({})", g.kv_watermark,
                       g.kv_blocks);
  const std::size_t booked = g.kv_mode == "reserve" ? prompt + g.max_tokens : prompt;
  const std::size_t blocks = (booked + g.kv_block_size - 1) / g.kv_block_size;
  if (blocks > g.kv_blocks)
    return fmt::format(
        "{} tokens ({}) need {} blocks of {}, more than --kv-blocks {}: every request would be "
        "rejected "
        "too_large",
        booked, g.kv_mode == "reserve" ? "prompt + max_tokens, reserved" : "the prompt", blocks,
        g.kv_block_size, g.kv_blocks);
  return {};
}

// A word of the prompts sent with --url: lowercase letters and digits, one token for the
// reference tokenizer.
[[nodiscard]] inline std::string prompt_word(std::uint64_t& state) {
  static constexpr char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::uint64_t v = tailbatch::tools::detail::gensim_next(state);
  std::string w(1, alphabet[v % 26]);  // starts with a letter
  v /= 26;
  for (int i = 0; i < 6; ++i, v /= 36) w += alphabet[v % 36];
  return w;
}

// The /v1/completions bodies of --url with the workload flags: `count` requests, each
// {"model", "prompt", "max_tokens", "stream": true}, the prompt the shared prefix's words
// (the same for all) then --prompt-len words of its own, max_tokens drawn from
// --output-len and capped at --max-tokens. Seeded: the same flags and seed give the same
// bodies. Allocates. Thread-safe.
[[nodiscard]] inline std::vector<std::string> completion_bodies(const GenerationCli& g,
                                                                std::uint64_t seed,
                                                                std::size_t count) {
  const auto lengths = tailbatch::parse_output_lengths(g.output_len);
  std::uint64_t state = seed ^ 0xC0FFEEull;
  std::string prefix;
  for (std::size_t i = 0; i < g.shared_prefix; ++i) prefix += prompt_word(state) + " ";
  std::vector<std::string> bodies;
  bodies.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    std::string prompt = prefix;
    for (std::size_t i = 0; i < g.prompt_len; ++i) prompt += prompt_word(state) + " ";
    if (!prompt.empty()) prompt.pop_back();
    const std::size_t max_tokens = std::min(lengths.sample(state), g.max_tokens);
    bodies.push_back(
        fmt::format("{{\"model\": \"tailbatch-reference-generator\", \"prompt\": \"{}\", "
                    "\"max_tokens\": {}, \"stream\": true}}",
                    prompt, max_tokens));
  }
  return bodies;
}

// One simulated generation run, as a --json line.
[[nodiscard]] inline std::string generation_json(const GenerationCli& g,
                                                 const tailbatch::GenerationSimResult& r,
                                                 bool meets_slo) {
  auto ms = [](std::chrono::nanoseconds d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  return fmt::format(
      "{{\"mode\": \"simulate\", \"model\": \"generator\", \"kv_mode\": \"{}\", "
      "\"prefix_caching\": {}, "
      "\"offered_rps\": {:.3f}, \"requests\": {}, \"achieved_rps\": {:.3f}, \"tokens_per_s\": "
      "{:.1f}, "
      "\"ttft_p50_ms\": {:.3f}, \"ttft_p95_ms\": {:.3f}, \"ttft_p99_ms\": {:.3f}, \"e2e_p50_ms\": "
      "{:.3f}, "
      "\"e2e_p95_ms\": {:.3f}, \"e2e_p99_ms\": {:.3f}, \"preemptions\": {}, \"recomputed_tokens\": "
      "{}, "
      "\"prompt_tokens\": {}, \"prefill_tokens\": {}, \"prefix_hit_rate\": {:.4f}, \"mean_batch\": "
      "{:.3f}, "
      "\"mean_output_tokens\": {:.3f}, \"errors\": {}, \"meets_slo\": {}}}",
      g.kv_mode, g.prefix_caching == "on" ? "true" : "false", r.offered_rps, r.requests,
      r.achieved_rps, r.tokens_per_s, ms(r.ttft_p50), ms(r.ttft_p95), ms(r.ttft_p99), ms(r.e2e_p50),
      ms(r.e2e_p95), ms(r.e2e_p99), r.preemptions, r.recomputed_tokens, r.prompt_tokens,
      r.prefill_tokens, r.prefix_hit_rate, r.mean_sequences_per_step, r.mean_output_tokens,
      r.errors, meets_slo ? "true" : "false");
}

// --simulate --model generator: each profile simulated (a sweep's rates, or one run),
// printed as a table (or JSON lines), with the highest rate whose TTFT p95 stays within
// slo_ttft_p95_ms. Returns the exit status. Throws std::invalid_argument for a bad
// configuration. Owns no threads.
[[nodiscard]] inline int run_generation_simulated(
    const GenerationCli& g, const std::vector<tailbatch::LoadProfile>& profiles, std::uint64_t seed,
    double slo_ttft_p95_ms, bool json) {
  auto ms = [](std::chrono::nanoseconds d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  tailbatch::GenerationSimConfig c = generation_config(g);
  c.workload.seed = seed;
  if (!json) {
    fmt::print(
        "simulated continuous batching: KV {} mode, {} blocks of {} tokens, watermark {}, prefix "
        "caching {}, "
        "{} sequences at most;\nstep = {} us + {} us x prefill tokens + {} us x emitting "
        "sequences; prompts {} "
        "tokens ({} shared + {} own), output {} capped at max_tokens {}\n\n",
        g.kv_mode, g.kv_blocks, g.kv_block_size, g.kv_watermark, g.prefix_caching, g.max_active,
        g.step_base_us, g.prefill_token_us, g.sequence_us, g.shared_prefix + g.prompt_len,
        g.shared_prefix, g.prompt_len, g.output_len, g.max_tokens);
    fmt::print("{:>9} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>11} {:>6}  {}\n", "offered",
               "requests", "tokens/s", "TTFT p50", "TTFT p95", "e2e p95", "preempt", "recomputed",
               "prefill tok", "hit %", "TTFT p95 target");
  }
  std::optional<std::pair<double, double>> best;  // offered rps, tokens/s
  for (const auto& profile : profiles) {
    c.workload.arrivals = profile;
    const auto r = tailbatch::simulate_generation(c);
    const bool meets = ms(r.ttft_p95) <= slo_ttft_p95_ms && r.errors == 0;
    if (meets && (!best || r.offered_rps > best->first))
      best.emplace(r.offered_rps, r.tokens_per_s);
    if (json) {
      fmt::print("{}\n", generation_json(g, r, meets));
    } else {
      fmt::print(
          "{:>9.1f} {:>8} {:>10.0f} {:>7.2f} ms {:>7.1f} ms {:>7.1f} ms {:>9} {:>10} {:>11} "
          "{:>5.1f}%  {}\n",
          r.offered_rps, r.requests, r.tokens_per_s, ms(r.ttft_p50), ms(r.ttft_p95), ms(r.e2e_p95),
          r.preemptions, r.recomputed_tokens, r.prefill_tokens, r.prefix_hit_rate * 100.0,
          meets ? "meets" : (r.errors > 0 ? "errors" : "misses"));
    }
  }
  if (!json) {
    if (best) {
      fmt::print("\nhighest offered rate with TTFT p95 <= {} ms: {:.1f} req/s ({:.0f} tokens/s)\n",
                 slo_ttft_p95_ms, best->first, best->second);
    } else {
      fmt::print("\nno rate kept TTFT p95 <= {} ms\n", slo_ttft_p95_ms);
    }
  }
  return 0;
}

}  // namespace tailbatch_load
