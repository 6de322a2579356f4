// The reference generator's CUDA path against its CPU twin: tokens equal and logits within
// 1e-5 relative (bit-equal where the CPU twin contracts nothing), over mixed prefill and
// decode lanes, greedy and sampled; bitwise batch invariance on the device; the device
// generator driving a ContinuousBatcher. Without a GPU it exits 77 (skipped) with the
// reason.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/cuda/generator_kernels.cuh>
#include <tailbatch/reference/generator.hpp>

#include "cuda_test_support.hpp"
#include "reference_test_support.hpp"


using tailbatch::cuda::DeviceGenerator;
using namespace tailbatch::reference;
using tailbatch::test::prompt_of;

namespace {

constexpr std::size_t kPromptLengths = 19;  // prompts of 1 to 19 tokens

struct Seq {
  std::vector<std::int32_t> prompt;
  std::size_t fed = 0;
  GeneratorState state;
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;  // every emission's, concatenated
};

// Runs `count` sequences for `n` tokens each, all in one batch per step, prompts in chunks
// of 4; `device` chooses the path.
template <class StepFn>
std::vector<Seq> run(const Generator& cpu, std::size_t count, std::size_t n, StepFn&& step) {
  const std::size_t V = cpu.config().vocab_size;
  std::vector<Seq> seqs(count);
  for (std::size_t i = 0; i < count; ++i) {
    seqs[i].prompt = prompt_of(i, V, kPromptLengths);
    seqs[i].state = cpu.new_state(100 + i);
  }
  for (;;) {
    std::vector<GeneratorLane> lanes;
    std::vector<Seq*> who;
    for (auto& s : seqs) {
      if (s.tokens.size() >= n) continue;
      GeneratorLane l;
      l.state = &s.state;
      if (s.fed < s.prompt.size()) {
        const std::size_t take = std::min<std::size_t>(4, s.prompt.size() - s.fed);
        l.feed = std::span<const std::int32_t>(s.prompt).subspan(s.fed, take);
        s.fed += take;
        l.emit = s.fed == s.prompt.size();
      } else {
        l.feed = std::span<const std::int32_t>(&s.state.next_input, 1);
      }
      lanes.push_back(l);
      who.push_back(&s);
    }
    if (lanes.empty()) break;
    std::size_t emitting = 0;
    for (auto& l : lanes) emitting += l.emit ? 1 : 0;
    std::vector<float> z(emitting * V);
    step(std::span<GeneratorLane>(lanes), std::span<float>(z));
    std::size_t e = 0;
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      if (!lanes[i].emit) continue;
      who[i]->tokens.push_back(lanes[i].token);
      who[i]->logits.insert(who[i]->logits.end(), z.begin() + static_cast<std::ptrdiff_t>(e * V),
                            z.begin() + static_cast<std::ptrdiff_t>((e + 1) * V));
      ++e;
    }
  }
  return seqs;
}

void compare(const std::vector<Seq>& gpu, const std::vector<Seq>& cpu, const char* what) {
  double worst = 0.0;
  std::size_t bit_equal = 0, total = 0;
  bool tokens_equal = true;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    tokens_equal = tokens_equal && gpu[i].tokens == cpu[i].tokens;
    CHECK(gpu[i].logits.size() == cpu[i].logits.size());
    for (std::size_t k = 0; k < std::min(gpu[i].logits.size(), cpu[i].logits.size()); ++k) {
      const double a = gpu[i].logits[k], b = cpu[i].logits[k];
      const double rel = std::fabs(a - b) / std::max(1e-30, std::max(std::fabs(a), std::fabs(b)));
      if (std::fabs(a - b) > 1e-6) worst = std::max(worst, rel);
      bit_equal += tailbatch::test::same_bits(std::span<const float>(&gpu[i].logits[k], 1),
                                              std::span<const float>(&cpu[i].logits[k], 1)) ? 1 : 0;
      ++total;
    }
  }
  std::printf("%s: tokens %s; logits bit-equal %zu/%zu, worst relative difference %.3g\n", what,
              tokens_equal ? "equal" : "DIFFER", bit_equal, total, worst);
  CHECK(tokens_equal);
  CHECK(worst <= 1e-5);
}

}  // namespace

int main() {
  if (const std::string why = tailbatch::cuda_test::why_no_device(); !why.empty()) tailbatch::cuda_test::skip(why);
  try {
    for (float temperature : {0.0f, 0.8f}) {
      GeneratorConfig c;
      c.temperature = temperature;  // default size: vocab 2048, hidden 512
      Generator cpu(c);
      Generator cpu_twin(c);
      DeviceGenerator gpu(cpu);
      GeneratorWorkspace ws;
      auto on_cpu = run(cpu, 37, 10, [&](std::span<GeneratorLane> l, std::span<float> z) { cpu_twin.step(l, ws, z); });
      auto on_gpu = run(cpu, 37, 10, [&](std::span<GeneratorLane> l, std::span<float> z) { gpu.step(l, nullptr, z); });
      compare(on_gpu, on_cpu, temperature == 0.0f ? "greedy" : "sampled");

      // Batch invariance on the device: each sequence alone gives the same bits.
      for (std::size_t i = 0; i < 37; i += 6) {
        GeneratorState s = cpu.new_state(100 + i);
        auto prompt = prompt_of(i, c.vocab_size, kPromptLengths);
        GeneratorLane lane;
        lane.state = &s;
        lane.feed = prompt;
        std::vector<float> z(c.vocab_size);
        std::vector<float> alone;
        std::vector<std::int32_t> tokens;
        for (int t = 0; t < 10; ++t) {
          gpu.step(std::span<GeneratorLane>(&lane, 1), nullptr, z);
          alone.insert(alone.end(), z.begin(), z.end());
          tokens.push_back(lane.token);
          lane.feed = std::span<const std::int32_t>(&s.next_input, 1);
        }
        CHECK(tokens == on_gpu[i].tokens);
        CHECK(tailbatch::test::same_bits(alone, on_gpu[i].logits));
      }
    }

    // The device generator behind a ContinuousBatcher streams what the CPU twin generates.
    {
      Generator cpu{GeneratorConfig{}};
      Generator solo{GeneratorConfig{}};
      DeviceGenerator gpu(cpu);
      using Batcher = tailbatch::ContinuousBatcher<std::int32_t, GeneratorState, tailbatch::ManualClock>;
      tailbatch::ContinuousBatcherConfig bc;
      bc.max_active = 8;
      bc.prefill_chunk = 5;
      bc.max_step_tokens = 24;
      Batcher b([&](std::span<Batcher::Sequence> batch) { gpu.step_sequences(batch); }, bc, tailbatch::ManualClock{});
      std::vector<std::shared_ptr<Batcher::Stream>> streams;
      std::vector<std::vector<std::int32_t>> expected;
      OutputLengths lengths(1, 40, 9);
      for (std::size_t i = 0; i < 20; ++i) {
        Batcher::Request r;
        r.prompt = prompt_of(i, 2048, kPromptLengths);
        r.max_new_tokens = lengths.next();
        r.state = cpu.new_state(i);
        expected.push_back(solo.generate(r.prompt, r.max_new_tokens, solo.new_state(i)));
        streams.push_back(b.submit(std::move(r)));
      }
      while (b.active_approx() + b.waiting_approx() > 0) (void)b.poll();
      std::size_t equal = 0;
      for (std::size_t i = 0; i < streams.size(); ++i) {
        std::vector<std::int32_t> got;
        while (auto t = streams[i]->try_next()) got.push_back(*t);
        CHECK(streams[i]->end()->ok());
        equal += got == expected[i] ? 1 : 0;
      }
      std::printf("batcher on the device: %zu/%zu sequences equal the CPU twin's\n", equal, streams.size());
      CHECK(equal == streams.size());
    }

    // Bad input is refused before anything is enqueued.
    {
      Generator cpu{GeneratorConfig{}};
      DeviceGenerator gpu(cpu);
      GeneratorState s;
      std::vector<std::int32_t> bad{4096};
      GeneratorLane lane{&s, bad, true, -1};
      bool threw = false;
      try {
        gpu.step(std::span<GeneratorLane>(&lane, 1));
      } catch (const std::invalid_argument&) {
        threw = true;
      }
      CHECK(threw);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  return tailbatch::cuda_test::finish("cuda_test_generator");
}
