// The generation simulator: the real ContinuousBatcher and KvBlockPool stepped on the
// ManualClock with a modelled step cost. Checked for the cost model's exact timings on a
// lone request, determinism, reserve never preempting, grow preempting (and recomputing)
// when the pool runs dry, prefix reuse cutting prefill, and the output-length
// distributions and their parsing.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <tailbatch/tools/generation_simulator.hpp>

#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using tailbatch::KvMode;
using tailbatch::LoadProfile;
using tailbatch::GenerationSimConfig;
using tailbatch::GenerationSimResult;
using tailbatch::OutputLengthDistribution;
using tailbatch::parse_output_lengths;
using tailbatch::simulate_generation;

namespace {

// A pool that runs dry: 48 blocks of 16 tokens (768 tokens) against 20 requests of 64
// prompt tokens that each write 200 of at most 256 new tokens, arriving together.
GenerationSimConfig dry_pool(KvMode mode) {
  GenerationSimConfig c;
  c.workload.arrivals = LoadProfile::constant(100.0, 200ms);  // 20 requests, 10 ms apart
  c.workload.prompt_tokens = 64;
  c.workload.max_tokens = 256;
  c.workload.output_lengths = OutputLengthDistribution::fixed(200);
  c.max_active = 16;
  c.kv.mode = mode;
  c.kv.block_size = 16;
  c.kv.total_blocks = 48;
  c.kv.watermark_blocks = 1;
  c.kv.prefix_caching = false;
  return c;
}

}  // namespace

TEST_CASE("a lone request takes exactly the modelled step times", "[generation_simulator]") {
  GenerationSimConfig c;
  c.workload.arrivals = LoadProfile::constant(1.0, 1s);  // one request, at 0
  c.workload.prompt_tokens = 100;
  c.workload.max_tokens = 10;
  c.workload.output_lengths = OutputLengthDistribution::fixed(10);
  c.cost = {1ms, 10us, 100us};
  const GenerationSimResult r = simulate_generation(c);
  REQUIRE(r.requests == 1);
  CHECK(r.ok == 1);
  CHECK(r.tokens == 10);
  CHECK(r.steps == 10);  // the prefill step emits the first token
  // Prefill of 100 tokens, then 9 decode steps of one sequence.
  CHECK(r.ttft_p50 == 1ms + 100 * 10us + 100us);
  CHECK(r.e2e_p50 == r.ttft_p50 + 9 * (1ms + 100us));
  CHECK(r.makespan == r.e2e_p50);
  CHECK(r.prefill_tokens == 100);
  CHECK(r.prompt_tokens == 100);
  CHECK(r.preemptions == 0);
  CHECK(r.tokens_per_s == Approx(10.0 / std::chrono::duration<double>(r.makespan).count()));
}

TEST_CASE("the same configuration and seed give the same results", "[generation_simulator]") {
  GenerationSimConfig c = dry_pool(KvMode::grow);
  c.workload.arrivals = LoadProfile::poisson(80.0, 1s);
  c.workload.output_lengths = OutputLengthDistribution::geometric(64);
  const GenerationSimResult a = simulate_generation(c);
  const GenerationSimResult b = simulate_generation(c);
  CHECK(a.requests == b.requests);
  CHECK(a.tokens == b.tokens);
  CHECK(a.steps == b.steps);
  CHECK(a.makespan == b.makespan);
  CHECK(a.ttft_p50 == b.ttft_p50);
  CHECK(a.ttft_p95 == b.ttft_p95);
  CHECK(a.e2e_p95 == b.e2e_p95);
  CHECK(a.preemptions == b.preemptions);
  CHECK(a.recomputed_tokens == b.recomputed_tokens);
  CHECK(a.prefill_tokens == b.prefill_tokens);
  // Another seed: other arrivals and lengths.
  c.workload.seed = 7;
  const GenerationSimResult other = simulate_generation(c);
  CHECK((other.tokens != a.tokens || other.makespan != a.makespan));
}

TEST_CASE("reserve never preempts; grow preempts when the pool runs dry, and recomputes",
          "[generation_simulator]") {
  const GenerationSimResult reserve = simulate_generation(dry_pool(KvMode::reserve));
  const GenerationSimResult grow = simulate_generation(dry_pool(KvMode::grow));
  REQUIRE(reserve.requests == 20);
  REQUIRE(grow.requests == 20);
  // Both complete every request with every token.
  CHECK(reserve.ok == 20);
  CHECK(grow.ok == 20);
  CHECK(reserve.tokens == 20 * 200);
  CHECK(grow.tokens == 20 * 200);
  // reserve books 64 + 256 tokens (20 blocks) a request: 2 run at once, none is preempted.
  CHECK(reserve.preemptions == 0);
  CHECK(reserve.recomputed_tokens == 0);
  CHECK(reserve.prefill_tokens == 20 * 64);
  CHECK(reserve.mean_sequences_per_step <= 2.0);
  // grow admits by the prompt's 4 blocks: more run at once until their outputs fill the
  // pool; then the newest are preempted and recompute prompt + generated tokens.
  CHECK(grow.preemptions > 0);
  CHECK(grow.recomputed_tokens > 0);
  // A recompute's prefill also takes the last emitted token, which a decode step would have
  // fed: one more token per preemption (every victim here was decoding).
  CHECK(grow.prefill_tokens == 20 * 64 + grow.recomputed_tokens + grow.preemptions);
  CHECK(grow.mean_sequences_per_step > reserve.mean_sequences_per_step);
  CHECK(grow.tokens_per_s > reserve.tokens_per_s);
  CHECK(grow.kv.used_blocks == 0);  // every table freed at the end
}

TEST_CASE("prefix reuse cuts the prefill tokens and the time to first token",
          "[generation_simulator]") {
  GenerationSimConfig c;
  c.workload.arrivals = LoadProfile::constant(20.0, 2s);  // 40 requests, 50 ms apart
  c.workload.shared_prefix_tokens = 1000;
  c.workload.prompt_tokens = 50;
  c.workload.max_tokens = 16;
  c.workload.output_lengths = OutputLengthDistribution::fixed(16);
  c.kv.mode = KvMode::grow;
  c.kv.total_blocks = 1024;
  c.kv.prefix_caching = true;
  const GenerationSimResult on = simulate_generation(c);
  c.kv.prefix_caching = false;
  const GenerationSimResult off = simulate_generation(c);
  REQUIRE(on.requests == 40);
  CHECK(on.prompt_tokens == 40 * 1050);
  CHECK(off.prefill_tokens == 40 * 1050);
  // The first request computes all 1,050; every later one finds the 62 full blocks of the
  // prefix (992 tokens) cached and computes the other 58.
  CHECK(on.prefill_tokens == 1050 + 39 * 58);
  CHECK(on.prefix_hit_rate == Approx(39.0 * 992 / (40.0 * 1050)));
  CHECK(off.prefix_hit_rate == 0.0);
  CHECK(on.ttft_p50 * 2 < off.ttft_p50);
  CHECK(on.tokens == off.tokens);
}

TEST_CASE("output-length distributions: their means, the cap, and their text",
          "[generation_simulator]") {
  std::uint64_t state = 1;
  const auto fixed = OutputLengthDistribution::fixed(7);
  for (int i = 0; i < 100; ++i) CHECK(fixed.sample(state) == 7);
  CHECK(fixed.capped_mean(5) == 5.0);

  const auto geo = OutputLengthDistribution::geometric(128);
  const int n = 200000;
  double sum = 0, capped = 0;
  std::size_t shortest = 1000000;
  for (int i = 0; i < n; ++i) {
    const std::size_t len = geo.sample(state);
    shortest = std::min(shortest, len);
    sum += static_cast<double>(len);
    capped += static_cast<double>(std::min<std::size_t>(len, 512));
  }
  CHECK(shortest == 1);
  CHECK(sum / n == Approx(128.0).epsilon(0.01));
  // Capped at max_tokens 512: E[min(L, 512)] = 128 (1 - (1 - 1/128)^512), about 125.7.
  CHECK(geo.capped_mean(512) == Approx(128.0 * (1.0 - std::pow(1.0 - 1.0 / 128, 512))));
  CHECK(capped / n == Approx(geo.capped_mean(512)).epsilon(0.01));
  CHECK(OutputLengthDistribution::geometric(1).sample(state) == 1);

  // The simulator draws from it: the mean output of many requests.
  GenerationSimConfig c;
  c.workload.arrivals = LoadProfile::constant(400.0, 5s);  // 2,000 requests
  c.workload.prompt_tokens = 8;
  c.workload.max_tokens = 512;
  c.workload.output_lengths = geo;
  c.max_active = 64;
  c.kv.total_blocks = 100000;
  const GenerationSimResult r = simulate_generation(c);
  CHECK(r.ok == r.requests);
  CHECK(r.mean_output_tokens == Approx(geo.capped_mean(512)).epsilon(0.06));

  CHECK(parse_output_lengths("fixed:128").kind() == OutputLengthDistribution::Kind::fixed);
  CHECK(parse_output_lengths("fixed:128").mean() == 128.0);
  CHECK(parse_output_lengths("geometric:64.5").mean() == 64.5);
  CHECK(parse_output_lengths("geometric:128").to_string() == "geometric:128");
  CHECK(parse_output_lengths("fixed:3").to_string() == "fixed:3");
  CHECK_INVALID(parse_output_lengths("fixed:0"),
                "\"fixed:0\": fixed:N needs a whole number N >= 1");
  CHECK_INVALID(parse_output_lengths("fixed:2.5"), "fixed:N needs a whole number");
  CHECK_INVALID(parse_output_lengths("fixed:"), "fixed:N needs a whole number");
  CHECK_INVALID(parse_output_lengths("geometric:0.5"), "geometric:MEAN needs a number MEAN >= 1");
  CHECK_INVALID(parse_output_lengths("geometric:abc"), "geometric:MEAN needs a number");
  CHECK_INVALID(parse_output_lengths("uniform:5"), "expected fixed:N or geometric:MEAN");
  CHECK_INVALID(parse_output_lengths("128"), "expected fixed:N or geometric:MEAN");
  CHECK_INVALID(OutputLengthDistribution::fixed(0), "fixed length must be >= 1");
  CHECK_INVALID(OutputLengthDistribution::geometric(0.9), "geometric mean must be >= 1");
}

TEST_CASE("bad configurations name the field", "[generation_simulator]") {
  GenerationSimConfig c;
  c.workload.arrivals = LoadProfile::constant(1.0, 1s);
  c.workload.prompt_tokens = 0;
  CHECK_INVALID(simulate_generation(c), "workload.prompt_tokens + workload.shared_prefix_tokens");
  c.workload.prompt_tokens = 4;
  c.workload.max_tokens = 0;
  CHECK_INVALID(simulate_generation(c), "workload.max_tokens");
  c.workload.max_tokens = 4;
  c.workload.vocab_size = 1;
  CHECK_INVALID(simulate_generation(c), "workload.vocab_size");
  c.workload.vocab_size = 2048;
  c.cost.base = -1ns;
  CHECK_INVALID(simulate_generation(c), "cost");
  c.cost = {0ns, 0ns, 0ns};
  CHECK_INVALID(simulate_generation(c), "cost must make a step take time");
  c.cost = {};
  c.kv.watermark_blocks = c.kv.total_blocks;
  CHECK_INVALID(simulate_generation(c), "kv.watermark_blocks");
  c.kv.watermark_blocks = 0;
  c.max_active = 0;
  CHECK_INVALID(simulate_generation(c), "max_active");
}
