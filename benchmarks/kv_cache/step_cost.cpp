// step_cost: fits the generation simulator's step-cost model (docs/load-testing.md,
// "Simulating generation with a KV cache") to the reference generator on this machine.
//
// The reference generator runs behind a ContinuousBatcher with a KV pool (grow mode, 4096
// blocks of 16 tokens, 16 sequences at most), stepped by poll() on a manual clock, over a
// mixed workload: 400 requests, a quarter with prompts of 1-1,100 tokens and the rest 1-100,
// outputs of 1-128 tokens. Each step's model call is timed on the steady clock. The fit:
//   - decode-only steps (no prefill): least squares of time = base + per_sequence x e over
//     each e's median time, weighted by its steps, where e is the number of sequences that
//     emit a token in the step;
//   - steps with 200 or more prefill tokens: the median of (time - base - per_sequence x e)
//     / prefill tokens, the per prefill token cost.
// It prints the three numbers as tailbatch-load flags (--step-base-us, --prefill-token-us,
// --sequence-us) and the decode-only medians beside the model. Timing: run it alone.
//
// Usage: step_cost [--requests N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/generator.hpp>
#include <vector>

namespace {

namespace ref = tailbatch::reference;
using Batcher = tailbatch::ContinuousBatcher<std::int32_t, ref::GeneratorState, tailbatch::ManualClock>;

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Step {
  double prefill = 0;  // prompt tokens computed in the step
  double emitting = 0; // sequences that emit a token
  double us = 0;       // the model call's time
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 400;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--requests") == 0 && i + 1 < argc) {
      requests = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: step_cost [--requests N]\n");
      return 2;
    }
  }
  if (requests < 10) {
    std::fprintf(stderr, "step_cost: --requests must be >= 10\n");
    return 2;
  }

  ref::Generator gen;
  const std::size_t blocks = 4096, block_size = 16;
  ref::GeneratorKvStore store(blocks, block_size, gen.config().hidden_dim);
  tailbatch::ManualClock clock;
  tailbatch::ContinuousBatcherConfig config;
  config.max_active = 16;
  config.queue_capacity = static_cast<std::size_t>(requests) + 1;
  config.workers = 0;
  config.kv.mode = tailbatch::KvMode::grow;
  config.kv.block_size = block_size;
  config.kv.total_blocks = blocks;
  config.kv.prefix_caching = false;

  std::vector<Step> steps;
  std::vector<std::size_t> output_len(static_cast<std::size_t>(requests) + 1);
  Batcher batcher(
      [&](std::span<Batcher::Sequence> batch) {
        Step step;
        for (auto& s : batch) {
          if (!s.decoding()) step.prefill += static_cast<double>(s.prefill_chunk().size());
          if (s.emits()) step.emitting += 1;
        }
        const auto t0 = std::chrono::steady_clock::now();
        gen.step_sequences(batch, store);
        const auto t1 = std::chrono::steady_clock::now();
        step.us = std::chrono::duration<double, std::micro>(t1 - t0).count();
        steps.push_back(step);
        for (auto& s : batch)
          if (s.generated() >= output_len[s.id()]) s.finish();
        clock.advance(std::chrono::microseconds(500));
      },
      config, clock);

  std::uint64_t seed = 7;
  for (int i = 1; i <= requests; ++i) {
    Batcher::Request r;
    const std::size_t prompt = (i % 4 == 0) ? 1 + splitmix(seed) % 1100 : 1 + splitmix(seed) % 100;
    for (std::size_t k = 0; k < prompt; ++k)
      r.prompt.push_back(static_cast<std::int32_t>(1 + splitmix(seed) % 2047));
    r.max_new_tokens = 512;
    output_len[static_cast<std::size_t>(i)] = 1 + splitmix(seed) % 128;
    r.state = gen.new_state(static_cast<std::uint64_t>(i));
    (void)batcher.submit(std::move(r), tailbatch::SubmitOptions{},
                         tailbatch::StreamCallbacks<std::int32_t>{});
    for (int k = 0; k < 6; ++k) (void)batcher.poll();  // arrivals keep flowing between steps
  }
  while (batcher.poll().stepped) {
  }
  batcher.shutdown();

  // Decode-only steps: time = base + per_sequence x e, least squares over each e's median
  // time (weighted by its count of steps), so a few slow steps on a shared machine do not
  // bend the line.
  double n = 0, se = 0, st = 0, see = 0, set = 0, fitted_steps = 0;
  for (int e = 1; e <= 16; ++e) {
    std::vector<double> v;
    for (const auto& s : steps)
      if (s.prefill == 0 && s.emitting == e) v.push_back(s.us);
    if (v.size() < 5) continue;
    const double w = static_cast<double>(v.size()), t = median(v);
    n += w;
    se += w * e;
    st += w * t;
    see += w * e * e;
    set += w * e * t;
    fitted_steps += w;
  }
  if (n * see - se * se <= 0) {
    std::fprintf(stderr, "step_cost: too few decode-only steps to fit (%g)\n", n);
    return 1;
  }
  const double per_sequence = (n * set - se * st) / (n * see - se * se);
  const double base = (st - per_sequence * se) / n;
  std::vector<double> per_token;
  for (const auto& s : steps)
    if (s.prefill >= 200) per_token.push_back((s.us - base - per_sequence * s.emitting) / s.prefill);

  std::printf("steps %zu (%g decode-only in the fit, %zu with >= 200 prefill tokens)\n",
              steps.size(), fitted_steps, per_token.size());
  std::printf("base %.1f us, per emitting sequence %.2f us, per prefill token %.3f us\n", base,
              per_sequence, median(per_token));
  std::printf("tailbatch-load flags: --step-base-us %.0f --sequence-us %.1f --prefill-token-us %.2f\n",
              base, per_sequence, median(per_token));
  for (int e : {1, 2, 4, 8, 16}) {
    std::vector<double> v;
    for (const auto& s : steps)
      if (s.prefill == 0 && s.emitting == e) v.push_back(s.us);
    if (!v.empty())
      std::printf("decode-only, %2d sequences: %zu steps, median %.1f us (model %.1f us)\n", e,
                  v.size(), median(v), base + per_sequence * e);
  }
  return 0;
}
