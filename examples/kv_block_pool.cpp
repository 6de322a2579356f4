// A KvBlockPool behind a toy engine with a paged KV store.
//
// The engine keeps one KV slot per token at slot = block * block_size + offset, as a
// paged-attention kernel does, and every sequence reads its KV back through its block
// table. A token's "KV" here is a fingerprint of the prefix it ends (a real one depends on
// the position and every token before it too), so a wrong share would be caught.
//
//   1. Prefix reuse: four requests behind one 48-token system prompt.
//   2. grow (vLLM): sequences that may generate 16 tokens but mostly stop sooner decode in
//      a small pool; when one cannot grow, the newest is preempted (freed) and recomputed
//      later, finding what is left of its blocks still cached.
//   3. reserve (TGI): the same requests book prompt + 16 new tokens up front: nothing is
//      ever preempted, and fewer sequences run at once.
#include <cstdint>
#include <cstdio>
#include <deque>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <tailbatch/kv_block_pool.hpp>

namespace tb = tailbatch;
using Token = std::int32_t;
using Pool = tb::KvBlockPool<Token>;

namespace {

std::uint64_t fingerprint(std::span<const Token> tokens, std::size_t position) {
  std::uint64_t f = 0;
  for (std::size_t i = 0; i <= position; ++i) f = f * 1000003u + static_cast<std::uint64_t>(tokens[i]) + 1;
  return f;
}

// The engine's half: KV memory addressed by block tables.
struct PagedEngine {
  std::size_t block_size;
  std::vector<std::uint64_t> kv;  // total_blocks * block_size slots
  std::size_t computed = 0;       // tokens whose KV this engine computed

  explicit PagedEngine(const Pool& pool) : block_size(pool.block_size()), kv(pool.total_blocks() * pool.block_size()) {}

  std::size_t slot(std::span<const tb::KvBlockId> table, std::size_t position) const {
    return table[position / block_size] * block_size + position % block_size;
  }
  // Computes (writes) the KV of tokens [from, to).
  void compute(std::span<const tb::KvBlockId> table, std::span<const Token> tokens, std::size_t from, std::size_t to) {
    for (std::size_t p = from; p < to; ++p) kv[slot(table, p)] = fingerprint(tokens, p);
    computed += to - from;
  }
  // Attention reads every earlier token's KV through the table; it must be that prefix's.
  void check(std::span<const tb::KvBlockId> table, std::span<const Token> tokens, std::size_t upto) const {
    for (std::size_t p = 0; p < upto; ++p)
      if (kv[slot(table, p)] != fingerprint(tokens, p)) throw std::logic_error("KV read back does not match");
  }
};

std::vector<Token> range(Token first, std::size_t n) {
  std::vector<Token> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = first + static_cast<Token>(i);
  return v;
}

void prefix_reuse() {
  fmt::print("1. Prefix reuse: a 48-token system prompt, block size 16\n");
  Pool pool({.block_size = 16, .total_blocks = 64});
  PagedEngine engine(pool);
  const std::vector<Token> system = range(1000, 48);
  std::vector<Pool::BlockTable> tables(4);
  std::size_t without_reuse = 0;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    std::vector<Token> prompt = system;
    for (Token t : range(static_cast<Token>(100 * i), 10 + 3 * i)) prompt.push_back(t);
    if (pool.allocate(tables[i], prompt) != tb::KvAllocStatus::ok) throw std::logic_error("no room");
    const auto table = tables[i].blocks();
    engine.check(table, prompt, tables[i].cached_tokens());  // what prefill skips is there already
    engine.compute(table, prompt, tables[i].cached_tokens(), prompt.size());  // prefill the rest
    pool.commit(tables[i], prompt);  // its full blocks become shareable
    without_reuse += prompt.size();
    fmt::print("   request {}: {} prompt tokens, {} cached, blocks {}\n", i, prompt.size(),
               tables[i].cached_tokens(), table);
  }
  const auto s = pool.stats();
  fmt::print("   prefill computed {} tokens instead of {}; {} blocks used, hit rate {:.0f}%\n\n",
             engine.computed, without_reuse, s.used_blocks, 100 * s.prefix_hit_rate());
}

struct Seq {
  int id;
  std::vector<Token> tokens;  // prompt, then generated
  std::size_t end;            // tokens when it stops (the engine does not know it in advance)
  std::size_t max_tokens;     // prompt + max new tokens
  Pool::BlockTable table;
};

// Runs six sequences through a 12-block pool (block size 4) in one mode; returns the steps.
int run(bool reserve) {
  Pool pool({.block_size = 4, .total_blocks = 12});
  PagedEngine engine(pool);
  std::deque<Seq> waiting;
  const std::size_t generates[] = {3, 16, 5, 2, 12, 4};  // of at most 16
  for (int i = 0; i < 6; ++i) {
    const std::size_t prompt = 6 + static_cast<std::size_t>(i % 3);
    waiting.push_back({i, range(static_cast<Token>(50 * i), prompt), prompt + generates[i], prompt + 16, {}});
  }
  std::vector<Seq> running;
  int steps = 0;
  std::size_t preemptions = 0;
  while (!waiting.empty() || !running.empty()) {
    // Admit from the head of the queue while the pool allows (grow: keep 1 block spare).
    while (!waiting.empty()) {
      Seq& s = waiting.front();
      const auto status = pool.allocate(
          s.table, s.tokens, {.max_tokens = s.max_tokens, .reserve = reserve, .watermark_blocks = reserve ? 0u : 1u});
      if (status != tb::KvAllocStatus::ok) break;
      engine.check(s.table.blocks(), s.tokens, s.table.cached_tokens());
      engine.compute(s.table.blocks(), s.tokens, s.table.cached_tokens(), s.tokens.size());
      pool.commit(s.table, s.tokens);
      fmt::print("   step {:2}: admit seq {} ({} tokens, {} cached)\n", steps, s.id, s.tokens.size(),
                 s.table.cached_tokens());
      running.push_back(std::move(s));
      waiting.pop_front();
    }
    // Every running sequence needs room for one more token; preempt the newest until it fits.
    for (std::size_t i = 0; i < running.size(); ++i) {
      while (pool.grow(running[i].table, running[i].tokens.size() + 1) == tb::KvAllocStatus::no_room) {
        Seq victim = std::move(running.back());
        running.pop_back();
        pool.free(victim.table);  // its committed blocks stay cached for the recompute
        ++preemptions;
        fmt::print("   step {:2}: preempt seq {} at {} tokens\n", steps, victim.id, victim.tokens.size());
        waiting.push_front(std::move(victim));
        if (i >= running.size()) break;
      }
    }
    // One decode step: each sequence reads its KV and appends a token.
    ++steps;
    for (Seq& s : running) {
      engine.check(s.table.blocks(), s.tokens, s.tokens.size());
      s.tokens.push_back(static_cast<Token>(7 * s.tokens.size() % 97));
      engine.compute(s.table.blocks(), s.tokens, s.tokens.size() - 1, s.tokens.size());
      pool.commit(s.table, s.tokens);
    }
    std::erase_if(running, [&](Seq& s) {
      if (s.tokens.size() < s.end) return false;
      fmt::print("   step {:2}: seq {} done\n", steps, s.id);
      pool.free(s.table);
      return true;
    });
  }
  fmt::print("   {} steps, {} preemptions, {} tokens computed, {} evictions\n\n", steps, preemptions,
             engine.computed, pool.stats().evictions);
  return steps;
}

}  // namespace

int main() {
  prefix_reuse();
  fmt::print("2. grow (vLLM): 6 sequences, 6-8 prompt tokens, 2-16 of at most 16 new; 12 blocks of 4\n");
  const int grow_steps = run(false);
  fmt::print("3. reserve (TGI): the same, prompt + 16 new tokens booked at admission\n");
  const int reserve_steps = run(true);
  fmt::print("grow finished in {} steps, reserve in {}.\n", grow_steps, reserve_steps);
  fmt::print("Every KV read through a block table matched its prefix.\n");
  return 0;
}
