// ContinuousBatcher with a KV block pool: admission by blocks and watermark, growth a block
// at a time, preemption order and recompute (gap-free, exactly-once streams), reserve mode,
// too_large at submit, prefix sharing, metrics, recompute equality on the reference
// generator, and a threaded storm with preemptions and cancellations.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tailbatch/continuous_batcher.hpp>
#include <tailbatch/reference/generator.hpp>
#include <thread>
#include <vector>

#include "continuous_test_support.hpp"
#include "tailbatch_test.hpp"

using namespace std::chrono_literals;
using namespace tailbatch;
using namespace tailbatch::test;

namespace {

// What one sequence looked like in one step.
struct Seen {
  std::uint64_t id;
  std::vector<KvBlockId> table;
  std::size_t cached, prefilled, chunk, position, generated;
  bool decoding;
};

struct Recorder {
  ManualClock clock;
  std::vector<std::vector<Seen>> steps;
  auto fn() {
    return [this](std::span<Seq> batch) {
      std::vector<Seen> step;
      for (auto& s : batch) {
        step.push_back({s.id(),
                        std::vector<KvBlockId>(s.block_table().begin(), s.block_table().end()),
                        s.cached_tokens(), s.prefilled(), s.prefill_chunk().size(), s.position(),
                        s.generated(), s.decoding()});
      }
      steps.push_back(std::move(step));
      clock.advance(1ms);
      for (auto& s : batch)
        if (s.emits()) s.emit(token_of(s));
    };
  }
  const Seen* find(std::size_t step, std::uint64_t id) const {
    for (const auto& s : steps.at(step))
      if (s.id == id) return &s;
    return nullptr;
  }
};

ContinuousBatcherConfig kv_config(KvMode mode, std::size_t blocks, std::size_t block_size = 4,
                                  std::size_t watermark = 0) {
  ContinuousBatcherConfig c;
  c.max_active = 16;
  c.kv.mode = mode;
  c.kv.total_blocks = blocks;
  c.kv.block_size = block_size;
  c.kv.watermark_blocks = watermark;
  return c;
}

}  // namespace

TEST_CASE("KV configuration is checked at construction, naming the field", "[continuous_kv]") {
  CHECK(config_error(kv_config(KvMode::grow, 0)) ==
        "ContinuousBatcher: kv.total_blocks must be >= 1");
  CHECK(config_error(kv_config(KvMode::grow, 8, 0)) ==
        "ContinuousBatcher: kv.block_size must be >= 1");
  CHECK(config_error(kv_config(KvMode::grow, 8, 4, 8)) ==
        "ContinuousBatcher: kv.watermark_blocks must be < kv.total_blocks");
  CHECK(config_error(kv_config(KvMode::reserve, 8)).empty());
  CHECK(tailbatch::to_string(KvMode::grow) == "grow");
  CHECK(tailbatch::to_string(KvMode::reserve) == "reserve");
}

TEST_CASE("a prompt larger than the whole pool is rejected at submit as too_large",
          "[continuous_kv]") {
  Recorder rec;
  Batcher grow(rec.fn(), kv_config(KvMode::grow, 4), rec.clock);  // 16 tokens
  auto big = grow.submit(req(17, 1));
  REQUIRE(big->closed());
  CHECK(big->end()->status == Status::rejected);
  CHECK(big->end()->reason == RejectReason::too_large);
  CHECK(big->end()->message ==
        "ContinuousBatcher: prompt (17 tokens) exceeds the KV pool (4 blocks of 4 tokens)");
  auto fits = grow.submit(req(16, 100));  // grow: only the prompt must fit
  CHECK_FALSE(fits->closed());
  auto empty = grow.submit(req(0, 3));
  REQUIRE(empty->closed());
  CHECK(empty->end()->status == Status::failed);

  Batcher reserve(rec.fn(), kv_config(KvMode::reserve, 4), rec.clock);
  auto booked = reserve.submit(req(10, 7));
  REQUIRE(booked->closed());
  CHECK(booked->end()->reason == RejectReason::too_large);
  CHECK(booked->end()->message ==
        "ContinuousBatcher: prompt + max_new_tokens (17 tokens) exceeds the KV pool (4 blocks of 4 "
        "tokens)");
  CHECK(reserve.stats().count(RejectReason::too_large) == 1);
  run_all(grow);
}

TEST_CASE(
    "grow: admission needs the prompt's blocks plus the watermark; a block is added when the last "
    "fills",
    "[continuous_kv]") {
  Recorder rec;
  // 8 blocks of 4 tokens, watermark 2.
  Batcher b(rec.fn(), kv_config(KvMode::grow, 8, 4, 2), rec.clock);
  auto a = b.submit(req(10, 6));  // 3 blocks
  auto c = b.submit(req(9, 2));   // 3 blocks: 6 taken, 2 left = the watermark: fits
  auto d = b.submit(req(4, 2));   // 1 block: would leave 1 < watermark: waits
  auto r = b.poll();
  CHECK(r.admitted == 2);
  CHECK(b.waiting_approx() == 1);
  const Seen* sa = rec.find(0, 1);
  REQUIRE(sa != nullptr);
  CHECK(sa->table.size() == 3);
  CHECK(sa->cached == 0);
  CHECK(sa->position == 0);
  // Sequence 1: 10 prompt tokens, then decoding feeds token positions 10, 11, 12, ...:
  // position 11 is the last of block 3, position 12 needs a fourth block.
  (void)b.poll();  // decodes position 10
  CHECK(rec.find(1, 1)->table.size() == 3);
  CHECK(rec.find(1, 1)->position == 10);
  (void)b.poll();  // position 11
  CHECK(rec.find(2, 1)->table.size() == 3);
  (void)b.poll();  // position 12: a new block (sequence 2 finished after 2 tokens, freeing 3)
  CHECK(rec.find(3, 1)->table.size() == 4);
  run_all(b);
  CHECK(drain(*a) == expected_tokens(1, 6));
  CHECK(drain(*c) == expected_tokens(2, 2));
  CHECK(drain(*d) == expected_tokens(3, 2));
  const auto s = b.stats();
  CHECK(s.preemptions == 0);
  CHECK(s.kv.total_blocks == 8);
  CHECK(s.kv.used_blocks == 0);
}

TEST_CASE("grow: the newest admitted sequence is preempted, recomputed, and its stream has no gap",
          "[continuous_kv]") {
  Recorder rec;
  // 4 blocks of 4 tokens; three sequences of 4-token prompts, 8 new tokens each: each
  // needs 3 blocks at its end, so they cannot all grow.
  auto cfg = kv_config(KvMode::grow, 4, 4);
  cfg.kv.prefix_caching = false;
  Batcher b(rec.fn(), cfg, rec.clock);
  auto s1 = b.submit(req(4, 8, 1));
  auto s2 = b.submit(req(4, 8, 2));
  auto s3 = b.submit(req(4, 8, 3));
  std::vector<std::uint64_t> preempted_order;
  std::size_t last = 0;
  for (int i = 0; i < 200 && b.active_approx() + b.waiting_approx() > 0; ++i) {
    (void)b.poll();
    const auto p = b.stats().preemptions;
    if (p > last) {
      // Who left the active set: present in the previous step, not in this one, not done.
      last = p;
      std::set<std::uint64_t> now;
      for (const auto& s : rec.steps.back()) now.insert(s.id);
      for (const auto& s : rec.steps[rec.steps.size() - 2])
        if (!now.count(s.id)) preempted_order.push_back(s.id);
    }
  }
  REQUIRE(s1->closed());
  REQUIRE(s2->closed());
  REQUIRE(s3->closed());
  CHECK(drain(*s1) == expected_tokens(1, 8));
  CHECK(drain(*s2) == expected_tokens(2, 8));
  CHECK(drain(*s3) == expected_tokens(3, 8));
  CHECK(s1->end()->ok());
  CHECK(s2->end()->ok());
  CHECK(s3->end()->ok());
  const auto st = b.stats();
  CHECK(st.preemptions >= 1);
  REQUIRE_FALSE(preempted_order.empty());
  CHECK(preempted_order.front() == 3);  // the newest admitted goes first
  CHECK(st.recomputed_tokens > 0);
  CHECK(st.by_status[0] == 3);
  // The recompute: sequence 3 came back prefilling its prompt and what it had generated,
  // and its next token continued the count.
  bool recomputed = false;
  for (const auto& step : rec.steps)
    for (const auto& s : step)
      if (s.id == 3 && !s.decoding && s.generated > 0) {
        recomputed = true;
        CHECK(s.prefilled + s.chunk == 4 + s.generated);
      }
  CHECK(recomputed);
  CHECK(st.kv.used_blocks == 0);
}

TEST_CASE("grow: a lower-priority sequence is preempted before a newer one of higher priority",
          "[continuous_kv]") {
  Recorder rec;
  auto cfg = kv_config(KvMode::grow, 4, 4);
  cfg.kv.prefix_caching = false;
  Batcher b(rec.fn(), cfg, rec.clock);
  SubmitOptions low;
  low.priority = Priority::low;
  auto s1 = b.submit(req(4, 8, 1), low);
  auto s2 = b.submit(req(4, 8, 2));
  (void)b.poll();
  std::uint64_t first_out = 0;
  for (int i = 0; i < 200 && b.active_approx() + b.waiting_approx() > 0 && first_out == 0; ++i) {
    (void)b.poll();
    if (b.stats().preemptions > 0) {
      std::set<std::uint64_t> now;
      for (const auto& s : rec.steps.back()) now.insert(s.id);
      first_out = now.count(1) ? 2 : 1;
    }
  }
  CHECK(first_out == 1);
  run_all(b);
  CHECK(drain(*s1) == expected_tokens(1, 8));
  CHECK(drain(*s2) == expected_tokens(2, 8));
}

TEST_CASE("a preempted sequence ends once when cancelled or out of time while it waits",
          "[continuous_kv]") {
  for (int way = 0; way < 2; ++way) {
    Recorder rec;
    auto cfg = kv_config(KvMode::grow, 4, 4);
    cfg.kv.prefix_caching = false;
    Batcher b(rec.fn(), cfg, rec.clock);
    auto s1 = b.submit(req(4, 12, 1));
    auto r2 = req(4, 12, 2);
    r2.completion_deadline = rec.clock.now() + 9ms;
    int ends = 0;
    tailbatch::StreamCallbacks<int> cb;
    std::vector<int> got;
    cb.on_tokens = [&](std::span<const int> t) { got.insert(got.end(), t.begin(), t.end()); };
    cb.on_end = [&](const tailbatch::StreamEnd&) { ++ends; };
    auto s2 = b.submit(std::move(r2), SubmitOptions{}, std::move(cb));
    // Both hold 1 block, then 2 (tokens 4-7), then need a third each: 2 is preempted.
    for (int i = 0; i < 20 && b.stats().preemptions == 0; ++i) (void)b.poll();
    REQUIRE(b.stats().preemptions == 1);
    REQUIRE_FALSE(s2->closed());
    if (way == 0) {
      s2->cancel();
    } else {
      rec.clock.advance(10ms);  // past its completion_deadline
    }
    (void)b.poll();
    REQUIRE(s2->closed());
    CHECK(s2->end()->status == (way == 0 ? Status::cancelled : Status::deadline_exceeded));
    CHECK(got == expected_tokens(2, got.size()));
    run_all(b);
    CHECK(ends == 1);
    CHECK(drain(*s1) == expected_tokens(1, 12));
    CHECK(b.stats().kv.used_blocks == 0);
    CHECK(b.waiting_approx() == 0);
  }
}

TEST_CASE("reserve: prompt + max_new_tokens are booked at admission and nothing is preempted",
          "[continuous_kv]") {
  Recorder rec;
  Batcher b(rec.fn(), kv_config(KvMode::reserve, 6, 4), rec.clock);
  auto s1 = b.submit(req(4, 8));  // 12 tokens: 3 blocks booked
  auto s2 = b.submit(req(4, 8));  // 3 more: fits
  auto s3 = b.submit(req(4, 8));  // waits for a whole booking to free
  auto r = b.poll();
  CHECK(r.admitted == 2);
  CHECK(b.stats().kv.reserved_blocks == 4);  // 2 x (3 booked - 1 taken)
  CHECK(rec.find(0, 1)->table.size() == 1);  // only the prompt's block is taken now
  run_all(b);
  CHECK(drain(*s1) == expected_tokens(1, 8));
  CHECK(drain(*s2) == expected_tokens(2, 8));
  CHECK(drain(*s3) == expected_tokens(3, 8));
  // s3 started only after s1 and s2 had ended: 8 tokens each, one step per token.
  std::size_t first_s3 = 0;
  while (rec.find(first_s3, 3) == nullptr) ++first_s3;
  CHECK(first_s3 == 8);
  CHECK(b.stats().preemptions == 0);
  CHECK(b.stats().kv.reserved_blocks == 0);
}

TEST_CASE("prefix reuse: full prompt blocks are shared, the last partial one never",
          "[continuous_kv]") {
  Recorder rec;
  tailbatch::MetricsRegistry registry;
  auto cfg = kv_config(KvMode::grow, 32, 4);
  cfg.metrics = &registry;
  Batcher b(rec.fn(), cfg, rec.clock);
  std::vector<int> prefix(10);
  for (int i = 0; i < 10; ++i) prefix[static_cast<std::size_t>(i)] = 100 + i;
  auto with_tail = [&](int t) {
    auto p = prefix;
    p.push_back(t);
    p.push_back(t + 1);
    return p;
  };
  auto s1 = b.submit(req(with_tail(1), 2));  // 12 tokens: 3 full blocks
  (void)b.poll();                            // prefilled and committed
  auto s2 = b.submit(req(with_tail(7), 2));  // shares blocks 0 and 1 (tokens 0-7); block 2 differs
  (void)b.poll();
  const Seen* a = rec.find(0, 1);
  const Seen* c = rec.find(1, 2);
  REQUIRE(a != nullptr);
  REQUIRE(c != nullptr);
  CHECK(a->cached == 0);
  CHECK(c->cached == 8);
  CHECK(c->prefilled == 8);
  CHECK(c->chunk == 4);
  CHECK(c->table[0] == a->table[0]);
  CHECK(c->table[1] == a->table[1]);
  CHECK(c->table[2] != a->table[2]);
  // The same 12-token prompt: its last block holds the last prompt token, never shared.
  auto s3 = b.submit(req(with_tail(1), 2));
  (void)b.poll();
  const Seen* d = rec.find(2, 3);
  REQUIRE(d != nullptr);
  CHECK(d->cached == 8);
  CHECK(d->table[2] != a->table[2]);
  run_all(b);
  CHECK(drain(*s1) == expected_tokens(1, 2));
  CHECK(drain(*s2) == expected_tokens(2, 2));
  CHECK(drain(*s3) == expected_tokens(3, 2));
  const auto st = b.stats();
  CHECK(st.kv.prefix_query_tokens == 36);
  CHECK(st.kv.prefix_hit_tokens == 16);
  CHECK(st.kv.used_blocks == 0);
  CHECK(st.kv.cached_blocks > 0);  // unreferenced blocks stay cached
  const std::string text = registry.prometheus();
  CHECK(text.find("tailbatch_kv_prefix_cache_hits_total 16") != std::string::npos);
  CHECK(text.find("tailbatch_kv_blocks_capacity 32") != std::string::npos);
  CHECK(text.find("tailbatch_generation_preemptions_total 0") != std::string::npos);
  CHECK(text.find("tailbatch_generation_recomputed_tokens_total 0") != std::string::npos);
}

TEST_CASE("prefix reuse: blocks of generated tokens are shared too (grow mode)",
          "[continuous_kv]") {
  Recorder rec;
  Batcher b(rec.fn(), kv_config(KvMode::grow, 16, 4), rec.clock);
  auto s1 = b.submit(req(4, 9));  // emits 1000..1008; KV of 12 tokens written: 3 full blocks
  run_all(b);
  CHECK(drain(*s1) == expected_tokens(1, 9));
  // The next turn: the conversation so far, and one more token.
  std::vector<int> next(4, 1);
  for (int t = 1000; t < 1008; ++t) next.push_back(t);
  next.push_back(5);
  auto s2 = b.submit(req(next, 2));
  (void)b.poll();
  const Seen* seen = rec.steps.back().data();
  REQUIRE(seen->id == 2);
  CHECK(seen->cached == 12);
  CHECK(seen->chunk == 1);
  run_all(b);
  CHECK(drain(*s2) == expected_tokens(2, 2));
}

TEST_CASE("a pool the caller owns is used as it is", "[continuous_kv]") {
  Recorder rec;
  tailbatch::KvBlockPool<int> pool({.block_size = 2, .total_blocks = 5});
  ContinuousBatcherConfig cfg;
  cfg.kv.mode = KvMode::grow;
  {
    Batcher b(rec.fn(), cfg, pool, rec.clock);
    CHECK(b.config().kv.total_blocks == 5);
    auto big = b.submit(req(11, 1));
    CHECK(big->end()->reason == RejectReason::too_large);
    auto s = b.submit(req(3, 4));
    run_all(b);
    CHECK(drain(*s) == expected_tokens(1, 4));  // a rejected submit takes no id
  }
  CHECK(pool.stats().used_blocks == 0);
  ContinuousBatcherConfig off;
  CHECK_THROWS_AS(Batcher(rec.fn(), off, pool, rec.clock), std::invalid_argument);
}

TEST_CASE(
    "preemption is invisible in the output: the reference generator's greedy tokens are unchanged",
    "[continuous_kv][generator]") {
  using tailbatch::reference::Generator;
  using tailbatch::reference::GeneratorConfig;
  using tailbatch::reference::GeneratorKvStore;
  using tailbatch::reference::GeneratorState;
  using GenBatcher = tailbatch::ContinuousBatcher<std::int32_t, GeneratorState, ManualClock>;
  GeneratorConfig gc;
  gc.vocab_size = 256;
  gc.hidden_dim = 64;
  Generator g(gc);

  const std::size_t n = 6, max_new = 24;
  std::vector<std::vector<std::int32_t>> prompts(n);
  for (std::size_t i = 0; i < n; ++i) {
    // A shared 8-token head (prefix reuse), then each its own tail.
    for (std::size_t k = 0; k < 8; ++k) prompts[i].push_back(static_cast<std::int32_t>(3 + k));
    for (std::size_t k = 0; k < 3 + i; ++k)
      prompts[i].push_back(static_cast<std::int32_t>((i * 37 + k * 11 + 5) % 256));
  }
  std::vector<std::vector<std::int32_t>> alone(n);
  for (std::size_t i = 0; i < n; ++i) alone[i] = g.generate(prompts[i], max_new, g.new_state(i));

  for (bool prefix : {true, false}) {
    ManualClock clock;
    ContinuousBatcherConfig cfg;
    cfg.max_active = 8;
    cfg.prefill_chunk = 5;  // chunked prefill and recompute too
    cfg.kv.mode = KvMode::grow;
    cfg.kv.block_size = 4;
    cfg.kv.total_blocks = 20;  // 80 tokens for 6 sequences of up to 37: preemptions
    cfg.kv.prefix_caching = prefix;
    GeneratorKvStore store(cfg.kv.total_blocks, cfg.kv.block_size, gc.hidden_dim);
    GenBatcher b([&](std::span<GenBatcher::Sequence> batch) { g.step_sequences(batch, store); },
                 cfg, clock);
    std::vector<std::shared_ptr<GenBatcher::Stream>> streams;
    for (std::size_t i = 0; i < n; ++i) {
      GenBatcher::Request r;
      r.prompt = prompts[i];
      r.max_new_tokens = max_new;
      r.state = g.new_state(i);
      streams.push_back(b.submit(std::move(r)));
    }
    for (int guard = 0; guard < 10000 && b.active_approx() + b.waiting_approx() > 0; ++guard)
      (void)b.poll();
    const auto st = b.stats();
    CHECK(st.preemptions > 0);
    if (prefix) CHECK(st.kv.prefix_hit_tokens > 0);
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(streams[i]->closed());
      CHECK(streams[i]->end()->ok());
      std::vector<std::int32_t> got;
      while (auto t = streams[i]->try_next()) got.push_back(*t);
      CHECK(got == alone[i]);
    }
  }
}

TEST_CASE("storm: preemptions and cancellations, every stream gap-free and ended exactly once",
          "[continuous_kv][stress]") {
  using SBatcher = tailbatch::ContinuousBatcher<int>;
  using SSeq = SBatcher::Sequence;
  for (KvMode mode : {KvMode::grow, KvMode::reserve}) {
    ContinuousBatcherConfig cfg;
    cfg.max_active = 12;
    cfg.prefill_chunk = 6;
    cfg.queue_capacity = 4096;
    cfg.kv.mode = mode;
    cfg.kv.block_size = 4;
    cfg.kv.total_blocks = 40;
    cfg.kv.watermark_blocks = 1;
    SBatcher b(
        [](std::span<SSeq> batch) {
          // A slow step: the submitters keep the queue full, so grow mode must preempt.
          std::this_thread::sleep_for(20us);
          for (auto& s : batch)
            if (s.emits()) s.emit(static_cast<int>(s.generated()));
        },
        cfg);
    constexpr int threads = 4;
    const int per_thread = 240 / tailbatch::test::sanitizer_slowdown;
    std::atomic<int> ends{0};
    std::mutex m;
    std::map<std::uint64_t, std::vector<int>> got;  // key: thread * 1000 + i
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < per_thread; ++i) {
          SBatcher::Request r;
          r.prompt.assign(static_cast<std::size_t>(1 + (t * 7 + i * 5) % 30), 1 + (i % 3));
          r.max_new_tokens = static_cast<std::size_t>(1 + (i * 13 + t) % 40);
          const std::uint64_t key = static_cast<std::uint64_t>(t * 1000 + i);
          tailbatch::StreamCallbacks<int> cb;
          cb.on_tokens = [&, key](std::span<const int> toks) {
            std::lock_guard lock(m);
            auto& v = got[key];
            v.insert(v.end(), toks.begin(), toks.end());
          };
          cb.on_end = [&](const tailbatch::StreamEnd&) { ends.fetch_add(1); };
          auto s = b.submit(std::move(r), SubmitOptions{}, std::move(cb));
          if (i % 7 == 3) s->cancel();
        }
      });
    }
    for (auto& t : ts) t.join();
    b.shutdown();
    CHECK(ends.load() == threads * per_thread);
    const auto st = b.stats();
    CHECK(st.submitted == static_cast<std::uint64_t>(threads * per_thread));
    CHECK(st.kv.used_blocks == 0);
    CHECK(st.kv.reserved_blocks == 0);
    if (mode == KvMode::reserve) CHECK(st.preemptions == 0);
    if (mode == KvMode::grow) CHECK(st.preemptions > 0);
    std::lock_guard lock(m);
    for (const auto& [key, toks] : got) {
      for (std::size_t k = 0; k < toks.size(); ++k) {
        if (toks[k] != static_cast<int>(k)) {
          FAIL("stream " << key << " has a gap or a duplicate at " << k);
        }
      }
    }
  }
}
