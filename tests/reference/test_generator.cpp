// The reference generator: deterministic weights, batch invariance (alone vs any batch,
// any lane, any prefill chunking, any CPU kernel), seeded sampling, output lengths, and the
// generator driving a ContinuousBatcher.
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/generator.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference_test_support.hpp"
#include "tailbatch_test.hpp"

using namespace tailbatch::reference;

namespace {

GeneratorConfig small(float temperature = 0.0f) {
  GeneratorConfig c;
  c.vocab_size = 256;
  c.hidden_dim = 96;
  c.temperature = temperature;
  return c;
}

// A sequence's run: its tokens and the logits of each emission.
struct Run {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Run alone(Generator& g, std::span<const std::int32_t> prompt, std::size_t n, std::uint64_t seed) {
  Run r;
  auto state = g.new_state(seed);
  GeneratorLane lane;
  lane.state = &state;
  lane.feed = prompt;
  std::vector<float> z(g.config().vocab_size);
  for (std::size_t i = 0; i < n; ++i) {
    g.step(std::span<GeneratorLane>(&lane, 1), z);
    r.tokens.push_back(lane.token);
    r.logits.push_back(z);
    lane.feed = std::span<const std::int32_t>(&state.next_input, 1);
  }
  return r;
}

using tailbatch::test::prompt_of;
using tailbatch::test::same_bits;

// Runs many sequences together: each step, the live ones in a shuffled order, prompts fed
// in chunks of `chunk` tokens (0: whole), sequences joining at staggered steps.
std::vector<Run> together(Generator& g, std::size_t count, std::size_t n, std::size_t chunk, std::uint64_t shuffle) {
  const std::size_t V = g.config().vocab_size;
  struct Live {
    std::vector<std::int32_t> prompt;
    std::size_t fed = 0;
    GeneratorState state;
    Run run;
  };
  std::vector<Live> seqs(count);
  for (std::size_t i = 0; i < count; ++i) {
    seqs[i].prompt = prompt_of(i, V);
    seqs[i].state = g.new_state(i);
  }
  std::uint64_t x = shuffle;
  for (std::size_t step = 0;; ++step) {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < count; ++i)
      if (i % 5 <= step && seqs[i].run.tokens.size() < n) order.push_back(i);  // staggered joins
    if (order.empty() && step > count) break;
    for (std::size_t i = order.size(); i > 1; --i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(order[i - 1], order[(x >> 33) % i]);
    }
    std::vector<GeneratorLane> lanes(order.size());
    for (std::size_t j = 0; j < order.size(); ++j) {
      auto& s = seqs[order[j]];
      lanes[j].state = &s.state;
      if (s.fed < s.prompt.size()) {
        const std::size_t left = s.prompt.size() - s.fed;
        const std::size_t take = chunk == 0 ? left : std::min(chunk, left);
        lanes[j].feed = std::span<const std::int32_t>(s.prompt).subspan(s.fed, take);
        s.fed += take;
        lanes[j].emit = s.fed == s.prompt.size();
      } else {
        lanes[j].feed = std::span<const std::int32_t>(&s.state.next_input, 1);
        lanes[j].emit = true;
      }
    }
    std::size_t emitting = 0;
    for (auto& l : lanes) emitting += l.emit ? 1 : 0;
    std::vector<float> z(emitting * V);
    g.step(lanes, z);
    std::size_t e = 0;
    for (std::size_t j = 0; j < order.size(); ++j) {
      if (!lanes[j].emit) continue;
      auto& s = seqs[order[j]];
      s.run.tokens.push_back(lanes[j].token);
      s.run.logits.emplace_back(z.begin() + static_cast<std::ptrdiff_t>(e * V),
                                z.begin() + static_cast<std::ptrdiff_t>((e + 1) * V));
      ++e;
    }
  }
  std::vector<Run> out;
  for (auto& s : seqs) out.push_back(std::move(s.run));
  return out;
}

}  // namespace

TEST_CASE("bad configuration throws std::invalid_argument naming the field", "[generator]") {
  auto message = [](GeneratorConfig c) {
    try {
      Generator g(c);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto c = small();
  c.vocab_size = 100;
  CHECK(message(c) == "GeneratorConfig: vocab_size must be a multiple of 32 and >= 32");
  c = small();
  c.hidden_dim = 0;
  CHECK(message(c) == "GeneratorConfig: hidden_dim must be a multiple of 32 and >= 32");
  c = small();
  c.temperature = -1.0f;
  CHECK(message(c) == "GeneratorConfig: temperature must be finite and >= 0");
  c = small();
  c.eos_token = 256;
  CHECK(message(c) == "GeneratorConfig: eos_token must be -1 or a token below vocab_size");
  CHECK_THROWS_AS(OutputLengths(0, 5, 1), std::invalid_argument);
  CHECK_THROWS_AS(OutputLengths(6, 5, 1), std::invalid_argument);
}

TEST_CASE("the weights are a pure function of the seed", "[generator]") {
  Generator a(small()), b(small());
  auto c = small();
  c.seed = 7;
  Generator d(c);
  auto wa = a.weights(), wb = b.weights(), wd = d.weights();
  REQUIRE(wa.w_vocab.size() == 256u * 96u);
  CHECK(std::equal(wa.w_in.begin(), wa.w_in.end(), wb.w_in.begin()));
  CHECK(std::equal(wa.w_vocab.begin(), wa.w_vocab.end(), wb.w_vocab.begin()));
  CHECK(std::equal(wa.embeddings.begin(), wa.embeddings.end(), wb.embeddings.begin()));
  CHECK_FALSE(std::equal(wa.w_in.begin(), wa.w_in.end(), wd.w_in.begin()));
  auto p = prompt_of(3, 256);
  CHECK(a.generate(p, 20, a.new_state()) == b.generate(p, 20, b.new_state()));
}

TEST_CASE("greedy decoding picks the argmax and is not stuck on one token", "[generator]") {
  Generator g(small());
  auto r = alone(g, prompt_of(1, 256), 40, 0);
  for (std::size_t i = 0; i < r.tokens.size(); ++i) {
    const auto& z = r.logits[i];
    CHECK(r.tokens[i] == std::max_element(z.begin(), z.end()) - z.begin());
  }
  std::set<std::int32_t> distinct(r.tokens.begin(), r.tokens.end());
  CHECK(distinct.size() > 3);
}

TEST_CASE("batch invariance: a sequence's tokens and logits are bit-identical alone and in any batch",
          "[generator]") {
  for (float temperature : {0.0f, 0.9f}) {
    Generator g(small(temperature));
    const std::size_t count = 37;  // three lane groups, the last one partial
    const std::size_t n = 12;
    std::vector<Run> ref;
    for (std::size_t i = 0; i < count; ++i) ref.push_back(alone(g, prompt_of(i, 256), n, i));
    for (std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
      for (std::uint64_t shuffle : {1u, 99u}) {
        auto runs = together(g, count, n, chunk, shuffle);
        for (std::size_t i = 0; i < count; ++i) {
          INFO("temperature " << temperature << " chunk " << chunk << " sequence " << i);
          REQUIRE(runs[i].tokens == ref[i].tokens);
          for (std::size_t t = 0; t < n; ++t) REQUIRE(same_bits(runs[i].logits[t], ref[i].logits[t]));
        }
      }
    }
  }
}

TEST_CASE("every CPU kernel computes the same bits", "[generator]") {
  auto base = small(0.7f);
  base.hidden_dim = 128;
  std::vector<Run> ref;
  bool first = true;
  for (CpuKernel k : {CpuKernel::portable, CpuKernel::avx2, CpuKernel::avx512}) {
    if (!tailbatch::reference::cpu_kernel_supported(k)) {
      WARN("CPU kernel " << tailbatch::reference::to_string(k) << " not supported here: not compared");
      continue;
    }
    auto c = base;
    c.cpu_kernel = k;
    Generator g(c);
    CHECK(g.kernel() == k);
    auto runs = together(g, 20, 8, 3, 5);
    if (first) {
      ref = runs;
      first = false;
      continue;
    }
    for (std::size_t i = 0; i < runs.size(); ++i) {
      INFO("kernel " << tailbatch::reference::to_string(k) << " sequence " << i);
      REQUIRE(runs[i].tokens == ref[i].tokens);
      for (std::size_t t = 0; t < runs[i].logits.size(); ++t) REQUIRE(same_bits(runs[i].logits[t], ref[i].logits[t]));
    }
  }
}

TEST_CASE("seeded sampling: the same seed repeats, other seeds differ", "[generator]") {
  Generator g(small(1.0f));
  auto p = prompt_of(4, 256);
  auto a = g.generate(p, 30, g.new_state(11));
  auto b = g.generate(p, 30, g.new_state(11));
  auto c = g.generate(p, 30, g.new_state(12));
  CHECK(a == b);
  CHECK(a != c);
  Generator greedy(small(0.0f));
  CHECK(greedy.generate(p, 30, greedy.new_state(11)) == greedy.generate(p, 30, greedy.new_state(12)));
}

TEST_CASE("a default-constructed state and an empty prompt start from the start token", "[generator]") {
  Generator g(small());
  auto a = g.generate({}, 10, GeneratorState{});
  std::vector<std::int32_t> start{0};
  auto b = g.generate(start, 10, g.new_state(0));
  CHECK(a == b);
  CHECK(a.size() == 10);
}

TEST_CASE("tokens outside the vocabulary are refused", "[generator]") {
  Generator g(small());
  GeneratorState s;
  std::vector<std::int32_t> bad{256};
  GeneratorLane lane{&s, bad, true, -1};
  CHECK_THROWS_AS(g.step(std::span<GeneratorLane>(&lane, 1)), std::invalid_argument);
  GeneratorLane nostate;
  CHECK_THROWS_AS(g.step(std::span<GeneratorLane>(&nostate, 1)), std::invalid_argument);
}

TEST_CASE("output lengths: uniform in [min, max]; the expected longest of a batch is exact",
          "[generator]") {
  OutputLengths lengths(8, 256, 42);
  std::size_t lo = 1000, hi = 0;
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    auto l = lengths.next();
    lo = std::min(lo, l);
    hi = std::max(hi, l);
    sum += static_cast<double>(l);
  }
  CHECK(lo == 8);
  CHECK(hi == 256);
  CHECK(sum / n == Approx(132.0).epsilon(0.01));
  CHECK(lengths.expected_mean() == 132.0);
  CHECK(lengths.expected_longest(1) == Approx(132.0).epsilon(1e-12));
  // Monte Carlo check of the closed form for a batch of 16.
  OutputLengths draw(8, 256, 7);
  double longest = 0;
  const int batches = 20000;
  for (int b = 0; b < batches; ++b) {
    std::size_t m = 0;
    for (int i = 0; i < 16; ++i) m = std::max(m, draw.next());
    longest += static_cast<double>(m);
  }
  CHECK(longest / batches == Approx(lengths.expected_longest(16)).epsilon(0.005));
  CHECK(lengths.expected_longest(16) == Approx(241.8476).epsilon(1e-6));
}

TEST_CASE("the generator drives a ContinuousBatcher: streamed tokens equal generation alone",
          "[generator][continuous_batcher]") {
  using Batcher = tailbatch::ContinuousBatcher<std::int32_t, GeneratorState, tailbatch::ManualClock>;
  for (std::size_t chunk : {std::size_t{0}, std::size_t{4}}) {
    Generator g(small(0.8f));
    Generator solo(small(0.8f));
    tailbatch::ContinuousBatcherConfig c;
    c.max_active = 6;
    c.prefill_chunk = chunk;
    c.max_step_tokens = chunk == 0 ? 0 : 16;
    Batcher b([&](std::span<Batcher::Sequence> batch) { g.step_sequences(batch); }, c, tailbatch::ManualClock{});
    OutputLengths lengths(1, 30, 3);
    std::vector<std::shared_ptr<Batcher::Stream>> streams;
    std::vector<std::vector<std::int32_t>> expected;
    for (std::size_t i = 0; i < 25; ++i) {
      Batcher::Request r;
      r.prompt = prompt_of(i, 256);
      r.max_new_tokens = lengths.next();
      r.state = g.new_state(1000 + i);
      expected.push_back(solo.generate(r.prompt, r.max_new_tokens, solo.new_state(1000 + i)));
      streams.push_back(b.submit(std::move(r)));
      if (i % 3 == 0) (void)b.poll();
    }
    while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
    for (std::size_t i = 0; i < streams.size(); ++i) {
      std::vector<std::int32_t> got;
      while (auto t = streams[i]->try_next()) got.push_back(*t);
      INFO("chunk " << chunk << " sequence " << i);
      CHECK(streams[i]->end()->ok());
      CHECK(got == expected[i]);
    }
  }
}

TEST_CASE("eos_token ends a sequence early with Status::ok", "[generator][continuous_batcher]") {
  auto c = small();
  Generator probe(c);
  auto p = prompt_of(2, 256);
  auto free_run = probe.generate(p, 12, probe.new_state());
  c.eos_token = free_run[5];
  Generator g(c);
  const auto first = static_cast<std::size_t>(std::find(free_run.begin(), free_run.end(), c.eos_token) - free_run.begin());
  CHECK(g.generate(p, 12, g.new_state()).size() == first + 1);

  using Batcher = tailbatch::ContinuousBatcher<std::int32_t, GeneratorState, tailbatch::ManualClock>;
  Batcher b([&](std::span<Batcher::Sequence> batch) { g.step_sequences(batch); }, {}, tailbatch::ManualClock{});
  Batcher::Request r;
  r.prompt = p;
  r.max_new_tokens = 12;
  auto s = b.submit(std::move(r));
  while (!s->closed()) (void)b.poll();
  CHECK(s->end()->ok());
  CHECK(s->end()->tokens == first + 1);
}
