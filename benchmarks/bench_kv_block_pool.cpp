// KvBlockPool against the plain structures a hand-written block manager would use,
// measured in the same binary. Block size 16; the argument is the prompt's length in tokens
// (128, 1024, 4096: 8, 64, 256 blocks). One iteration handles one sequence.
//
//   BM_Baseline_FreeListStack      pop the prompt's block ids off a std::vector stack into a
//                                  table, push them back: the floor of block allocation
//   BM_Pool_AllocateFree           KvBlockPool::allocate + free, prefix caching off
//   BM_Pool_MissCommitFree         prefix caching on, a prompt never seen before: allocate
//                                  (the lookup misses at the first block), commit (hash and
//                                  index every full block), free (to the eviction order);
//                                  the pool is 4x the prompt, so allocations evict
//   BM_Baseline_HashMapLookup      the prefix lookup as a std::unordered_map from the chained
//                                  block hash to a block id (no token check), the same hasher,
//                                  every full block but the last a hit, ids into a table
//   BM_Pool_PrefixHit              KvBlockPool::allocate + free of a prompt whose every full
//                                  block but the last is cached: the same hashing, the index
//                                  probes, the token check, the reference counts
//   BM_Hash_Only                   the chained hash of the blocks a lookup hashes, alone
//
// items_per_second counts prompt tokens. Single-threaded: the pool has one owner. What this
// does not show: the engine's own cost (prefill of the tokens a hit saves is orders of
// magnitude more than any of this), nor token types other than std::int32_t.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <span>
#include <tailbatch/kv_block_pool.hpp>
#include <unordered_map>
#include <vector>

namespace {

using Token = std::int32_t;
using Pool = tailbatch::KvBlockPool<Token>;
using tailbatch::KvAllocStatus;
using tailbatch::KvBlockId;
constexpr std::size_t block_size = 16;

std::vector<Token> prompt_of(std::size_t tokens) {
  std::vector<Token> p(tokens);
  std::iota(p.begin(), p.end(), 1000);
  return p;
}

// allocate() + free() of one prompt per iteration: the loop of BM_Pool_AllocateFree and
// BM_Pool_PrefixHit.
void allocate_free(benchmark::State& state, Pool& pool, const std::vector<Token>& prompt) {
  Pool::BlockTable table;
  for (auto _ : state) {
    if (pool.allocate(table, prompt) != KvAllocStatus::ok) state.SkipWithError("no room");
    benchmark::DoNotOptimize(table.blocks().data());
    pool.free(table);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(prompt.size()));
}

void BM_Baseline_FreeListStack(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const std::size_t blocks = (tokens + block_size - 1) / block_size;
  std::vector<KvBlockId> free_list(4 * blocks);
  std::iota(free_list.rbegin(), free_list.rend(), KvBlockId{0});
  std::vector<KvBlockId> table;
  table.reserve(blocks);
  for (auto _ : state) {
    for (std::size_t i = 0; i < blocks; ++i) {
      table.push_back(free_list.back());
      free_list.pop_back();
    }
    benchmark::DoNotOptimize(table.data());
    for (auto it = table.rbegin(); it != table.rend(); ++it) free_list.push_back(*it);
    table.clear();
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Baseline_FreeListStack)->Arg(128)->Arg(1024)->Arg(4096);

void BM_Pool_AllocateFree(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  Pool pool({.block_size = block_size, .total_blocks = 4 * tokens / block_size, .prefix_caching = false});
  allocate_free(state, pool, prompt_of(tokens));
}
BENCHMARK(BM_Pool_AllocateFree)->Arg(128)->Arg(1024)->Arg(4096);

void BM_Pool_MissCommitFree(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  Pool pool({.block_size = block_size, .total_blocks = 4 * tokens / block_size});
  auto prompt = prompt_of(tokens);
  Pool::BlockTable table;
  Token first = 0;
  for (auto _ : state) {
    prompt[0] = ++first;  // the chained hash makes every block of this prompt new
    if (pool.allocate(table, prompt) != KvAllocStatus::ok) state.SkipWithError("no room");
    pool.commit(table, prompt);
    pool.free(table);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["evictions"] = static_cast<double>(pool.stats().evictions);
}
BENCHMARK(BM_Pool_MissCommitFree)->Arg(128)->Arg(1024)->Arg(4096);

void BM_Baseline_HashMapLookup(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const auto prompt = prompt_of(tokens);
  const std::span<const Token> all(prompt);
  const std::size_t full = (tokens - 1) / block_size;
  const tailbatch::KvBlockHash<Token> hasher;
  std::unordered_map<std::uint64_t, KvBlockId> index;
  std::uint64_t h = 0;
  for (std::size_t i = 0; i < full; ++i) {
    h = hasher(h, all.subspan(i * block_size, block_size));
    index.emplace(h, static_cast<KvBlockId>(i));
  }
  std::vector<KvBlockId> table;
  table.reserve(full + 1);
  for (auto _ : state) {
    std::uint64_t parent = 0;
    for (std::size_t i = 0; i < full; ++i) {
      parent = hasher(parent, all.subspan(i * block_size, block_size));
      const auto it = index.find(parent);
      if (it == index.end()) break;
      table.push_back(it->second);
    }
    benchmark::DoNotOptimize(table.data());
    table.clear();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Baseline_HashMapLookup)->Arg(128)->Arg(1024)->Arg(4096);

void BM_Pool_PrefixHit(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  Pool pool({.block_size = block_size, .total_blocks = 4 * tokens / block_size});
  const auto prompt = prompt_of(tokens);
  {
    Pool::BlockTable first;
    if (pool.allocate(first, prompt) != KvAllocStatus::ok) state.SkipWithError("no room");
    pool.commit(first, prompt);
  }
  allocate_free(state, pool, prompt);
  state.counters["hit_rate"] = pool.stats().prefix_hit_rate();
}
BENCHMARK(BM_Pool_PrefixHit)->Arg(128)->Arg(1024)->Arg(4096);

void BM_Hash_Only(benchmark::State& state) {
  const auto tokens = static_cast<std::size_t>(state.range(0));
  const auto prompt = prompt_of(tokens);
  const std::span<const Token> all(prompt);
  const tailbatch::KvBlockHash<Token> hasher;
  const std::size_t full = (tokens - 1) / block_size;  // the blocks a lookup hashes
  for (auto _ : state) {
    std::uint64_t h = 0;
    for (std::size_t i = 0; i < full; ++i) h = hasher(h, all.subspan(i * block_size, block_size));
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Hash_Only)->Arg(128)->Arg(1024)->Arg(4096);

}  // namespace

BENCHMARK_MAIN();
