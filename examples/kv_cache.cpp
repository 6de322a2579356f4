// A ContinuousBatcher that schedules the reference generator by KV-cache memory.
//
// The generator keeps its KV cache (for this recurrent model: its state after each token)
// in the blocks of the batcher's KvBlockPool, through a GeneratorKvStore: each step it
// reads and writes the slots its sequences' block tables name, and prefill starts after
// the prompt tokens that are already cached.
//
//   1. grow (vLLM): twelve requests, max_new_tokens 64, real lengths 8-64, in a pool of
//      24 blocks of 16 tokens; when a step cannot grow every sequence, the newest is
//      preempted and recomputed later. Its output is the same as in a run alone.
//   2. reserve (TGI): the same requests book prompt + 64 tokens at admission: never
//      preempted, fewer at once, more steps.
//   3. Prefix reuse: eight requests behind one 96-token system prompt.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/generator.hpp>
#include <vector>

namespace tb = tailbatch;
namespace ref = tailbatch::reference;
using Batcher = tb::ContinuousBatcher<std::int32_t, ref::GeneratorState>;

namespace {

struct Outcome {
  std::size_t steps = 0;
  tb::ContinuousBatcherStats stats;
  std::vector<std::vector<std::int32_t>> outputs;
};

// Runs the requests through a batcher of this KV configuration, stepping it by hand.
Outcome run(ref::Generator& gen, tb::ContinuousKvConfig kv,
            const std::vector<std::vector<std::int32_t>>& prompts,
            const std::vector<std::size_t>& lengths) {
  ref::GeneratorKvStore store(kv.total_blocks, kv.block_size, gen.config().hidden_dim);
  tb::ContinuousBatcherConfig config;
  config.max_active = 12;
  config.kv = kv;
  config.workers = 0;  // stepped by poll() below
  Batcher batcher(
      [&](std::span<Batcher::Sequence> batch) {
        gen.step_sequences(batch, store);  // block tables and cached counts, used for real
        for (auto& seq : batch)
          if (seq.generated() >= lengths[seq.id() - 1]) seq.finish();  // its "end of sequence"
      },
      config);
  // One request arrives per step.
  Outcome out;
  std::vector<std::shared_ptr<Batcher::Stream>> streams;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Batcher::Request r;
    r.prompt = prompts[i];
    r.max_new_tokens = 64;
    r.state = gen.new_state(i);
    streams.push_back(batcher.submit(std::move(r)));
    out.steps += batcher.poll().stepped ? 1u : 0u;
  }
  while (batcher.active_approx() + batcher.waiting_approx() > 0)
    out.steps += batcher.poll().stepped ? 1u : 0u;
  out.stats = batcher.stats();
  for (auto& s : streams) {
    out.outputs.emplace_back();
    while (auto t = s->try_next()) out.outputs.back().push_back(*t);
  }
  return out;
}

void report(const char* name, const Outcome& o) {
  std::printf("%s: %zu steps, %llu tokens, %llu preemptions, %llu tokens recomputed\n", name,
              o.steps, static_cast<unsigned long long>(o.stats.tokens),
              static_cast<unsigned long long>(o.stats.preemptions),
              static_cast<unsigned long long>(o.stats.recomputed_tokens));
}

}  // namespace

int main() {
  ref::GeneratorConfig gc;
  gc.vocab_size = 512;
  gc.hidden_dim = 128;
  ref::Generator gen(gc);

  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::size_t> lengths;
  for (std::size_t i = 0; i < 12; ++i) {
    std::vector<std::int32_t> p;
    for (std::size_t k = 0; k < 20 + i; ++k)
      p.push_back(static_cast<std::int32_t>(1 + (i * 31 + k * 7) % 511));
    prompts.push_back(p);
    lengths.push_back(8 + (i * 23) % 57);
  }

  tb::ContinuousKvConfig kv;
  kv.block_size = 16;
  kv.total_blocks = 24;  // 384 tokens: 4 bookings of ~90 tokens, or most of the 12 as they grow
  kv.watermark_blocks = 2;
  kv.prefix_caching = false;

  std::printf("1. grow (vLLM), 12 requests, %zu blocks of %zu tokens\n", kv.total_blocks,
              kv.block_size);
  kv.mode = tb::KvMode::grow;
  const Outcome grow = run(gen, kv, prompts, lengths);
  report("   grow", grow);
  bool same = true;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = gen.generate(prompts[i], lengths[i], gen.new_state(i));
    same = same && alone == grow.outputs[i];
  }
  std::printf("   every output equals the same request generated alone: %s\n", same ? "yes" : "NO");

  std::printf("2. reserve (TGI), the same requests and memory\n");
  kv.mode = tb::KvMode::reserve;
  const Outcome reserve = run(gen, kv, prompts, lengths);
  report("   reserve", reserve);

  std::printf("3. prefix reuse: 8 requests behind a 96-token system prompt\n");
  std::vector<std::int32_t> system;
  for (std::int32_t k = 0; k < 96; ++k) system.push_back(1 + (k * 13) % 511);
  std::vector<std::vector<std::int32_t>> chats;
  std::vector<std::size_t> chat_lengths;
  for (std::int32_t i = 0; i < 8; ++i) {
    auto p = system;
    for (std::int32_t k = 0; k < 10; ++k) p.push_back(1 + (i * 97 + k * 5) % 511);
    chats.push_back(p);
    chat_lengths.push_back(8);
  }
  kv.mode = tb::KvMode::grow;
  kv.total_blocks = 128;
  kv.prefix_caching = true;
  const Outcome shared = run(gen, kv, chats, chat_lengths);
  std::printf("   %llu of %llu prompt tokens found cached (prefill skipped them)\n",
              static_cast<unsigned long long>(shared.stats.kv.prefix_hit_tokens),
              static_cast<unsigned long long>(shared.stats.kv.prefix_query_tokens));
  return same ? 0 : 1;
}
