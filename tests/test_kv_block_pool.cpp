// KvBlockPool on its own: allocation, freeing, exhaustion, growth and preemption,
// reference counts, prefix sharing (full blocks only, verified against collisions), LRU
// eviction of cached blocks, cached-token counts, the watermark, reserve bookings, metrics,
// and a randomized run checked against a model of the engine's KV memory.
#include <tailbatch/kv_block_pool.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tailbatch_test.hpp"

using namespace tailbatch;

namespace {

using Pool = KvBlockPool<std::int32_t>;
using Table = Pool::BlockTable;
using tailbatch::test::MessageIs;

// Every key collides: only the verification (parent identity and tokens) tells blocks apart.
struct ConstantHash {
  std::uint64_t operator()(std::uint64_t, std::span<const std::int32_t>) const noexcept { return 42; }
};

// Keys collide often (four values), the keys still depend on the prefix.
struct FourKeysHash {
  std::uint64_t operator()(std::uint64_t parent, std::span<const std::int32_t> tokens) const noexcept {
    return KvBlockHash<std::int32_t>{}(parent, tokens) & 3u;
  }
};

// tokens first, first + 1, ..., first + n - 1
std::vector<std::int32_t> iota(std::int32_t first, std::size_t n) {
  std::vector<std::int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<KvBlockId> ids(const Table& t) { return {t.blocks().begin(), t.blocks().end()}; }

// The pool's state partition: every block is used, cached or free, exactly once.
template <class P>
void check_partition(const P& pool) {
  const auto s = pool.stats();
  CHECK(s.used_blocks + s.cached_blocks + s.free_blocks == s.total_blocks);
  CHECK(s.available_blocks() == pool.available_blocks());
}

// Allocates the table for `tokens` and commits them all: a prefilled prompt, cacheable.
template <class P>
void prefill(P& pool, typename P::BlockTable& table, const std::vector<std::int32_t>& tokens) {
  REQUIRE(pool.allocate(table, tokens) == KvAllocStatus::ok);
  pool.commit(table, tokens);
}

}  // namespace

TEST_CASE("KvBlockPool: bad configuration names the field") {
  CHECK_THROWS_MATCHES(Pool({.block_size = 0, .total_blocks = 8}), std::invalid_argument,
                       MessageIs("KvBlockPool: block_size must be >= 1"));
  CHECK_THROWS_MATCHES(Pool({.block_size = 16, .total_blocks = 0}), std::invalid_argument,
                       MessageIs("KvBlockPool: total_blocks must be >= 1"));
  CHECK_THROWS_MATCHES(Pool({.block_size = 16, .total_blocks = 0xFFFFFFFFull}), std::invalid_argument,
                       MessageIs("KvBlockPool: total_blocks must be < 2^32 - 1 (block ids are 32-bit)"));
  CHECK_THROWS_MATCHES(Pool({.block_size = std::size_t{1} << 62, .total_blocks = 8}), std::invalid_argument,
                       MessageIs("KvBlockPool: total_blocks * block_size must fit in std::size_t"));
  CHECK_NOTHROW(Pool({.block_size = 1, .total_blocks = 1}));
}

TEST_CASE("KvBlockPool: allocate takes ceil(prompt / block_size) distinct blocks, free gives them back") {
  Pool pool({.block_size = 4, .total_blocks = 8});
  CHECK(pool.blocks_for(0) == 0);
  CHECK(pool.blocks_for(4) == 1);
  CHECK(pool.blocks_for(5) == 2);
  CHECK(pool.available_blocks() == 8);

  Table a;
  CHECK_FALSE(a.allocated());
  REQUIRE(pool.allocate(a, iota(0, 10)) == KvAllocStatus::ok);
  CHECK(a.allocated());
  CHECK(ids(a) == std::vector<KvBlockId>{0, 1, 2});
  CHECK(a.capacity_tokens() == 12);
  CHECK(a.cached_tokens() == 0);
  Table b;
  REQUIRE(pool.allocate(b, iota(100, 4)) == KvAllocStatus::ok);
  CHECK(ids(b) == std::vector<KvBlockId>{3});
  auto s = pool.stats();
  CHECK(s.used_blocks == 4);
  CHECK(s.free_blocks == 4);
  CHECK(s.cached_blocks == 0);
  check_partition(pool);

  pool.free(a);
  CHECK_FALSE(a.allocated());
  CHECK(a.blocks().empty());
  CHECK(pool.stats().used_blocks == 1);
  CHECK(pool.stats().free_blocks == 7);  // never committed: nothing to cache
  pool.free(a);                          // freeing an empty table does nothing
  CHECK(pool.stats().used_blocks == 1);

  // Freed blocks are reused (most recently freed first), and a table can be allocated again.
  REQUIRE(pool.allocate(a, iota(0, 1)) == KvAllocStatus::ok);
  CHECK(ids(a) == std::vector<KvBlockId>{0});
  CHECK_THROWS_MATCHES((void)pool.allocate(a, iota(0, 1)), std::invalid_argument,
                       MessageIs("KvBlockPool::allocate: the table already holds blocks"));

  // An empty prompt allocates a table with no blocks that can grow.
  Table empty;
  REQUIRE(pool.allocate(empty, {}) == KvAllocStatus::ok);
  CHECK(empty.allocated());
  CHECK(empty.blocks().empty());
  CHECK(pool.grow(empty, 1) == KvAllocStatus::ok);
  CHECK(empty.blocks().size() == 1);
}

TEST_CASE("KvBlockPool: exhaustion reports no_room and changes nothing; too_large never fits") {
  Pool pool({.block_size = 4, .total_blocks = 4});
  CHECK(pool.can_ever_fit(16));
  CHECK_FALSE(pool.can_ever_fit(17));
  Table big;
  CHECK(pool.allocate(big, iota(0, 17)) == KvAllocStatus::too_large);
  CHECK_FALSE(big.allocated());

  Table a, b, c;
  REQUIRE(pool.allocate(a, iota(0, 12)) == KvAllocStatus::ok);  // 3 blocks
  const auto before = pool.stats();
  CHECK(pool.allocate(b, iota(50, 8)) == KvAllocStatus::no_room);  // needs 2, 1 left
  CHECK_FALSE(b.allocated());
  CHECK(b.blocks().empty());
  const auto after = pool.stats();
  CHECK(after.used_blocks == before.used_blocks);
  CHECK(after.free_blocks == before.free_blocks);
  CHECK(after.prefix_lookups == before.prefix_lookups);  // a refused allocation is not counted
  REQUIRE(pool.allocate(c, iota(50, 4)) == KvAllocStatus::ok);  // the last one
  CHECK(pool.available_blocks() == 0);
  CHECK(pool.allocate(b, iota(60, 1)) == KvAllocStatus::no_room);
  pool.free(a);
  CHECK(pool.allocate(b, iota(50, 8)) == KvAllocStatus::ok);
  check_partition(pool);
}

TEST_CASE("KvBlockPool: grow appends a block when the last one fills; no_room is a preemption signal") {
  Pool pool({.block_size = 4, .total_blocks = 4});
  Table a, b;
  REQUIRE(pool.allocate(a, iota(0, 3), {.max_tokens = 12}) == KvAllocStatus::ok);
  REQUIRE(pool.allocate(b, iota(100, 8)) == KvAllocStatus::ok);
  CHECK(ids(a) == std::vector<KvBlockId>{0});

  CHECK(pool.grow(a, 4) == KvAllocStatus::ok);  // still fits its one block
  CHECK(a.blocks().size() == 1);
  CHECK(pool.grow(a, 5) == KvAllocStatus::ok);  // the last block filled: one more
  CHECK(ids(a) == std::vector<KvBlockId>{0, 3});
  CHECK(pool.available_blocks() == 0);

  // The pool is dry: a's next block does not fit, and nothing changes.
  CHECK(pool.grow(a, 9) == KvAllocStatus::no_room);
  CHECK(a.blocks().size() == 2);
  // Preempt b (free it entirely) and retry: a grows into b's blocks.
  pool.free(b);
  CHECK(pool.grow(a, 9) == KvAllocStatus::ok);
  CHECK(a.blocks().size() == 3);
  // Past its max_tokens a sequence never grows.
  CHECK(pool.grow(a, 13) == KvAllocStatus::too_large);
  CHECK(a.blocks().size() == 3);

  // Without max_tokens the pool is the only bound.
  Table c;
  REQUIRE(pool.allocate(c, iota(200, 1)) == KvAllocStatus::ok);
  CHECK(pool.grow(c, 17) == KvAllocStatus::too_large);  // more than the whole pool
  CHECK(pool.grow(c, 5) == KvAllocStatus::no_room);     // a holds the rest
  pool.free(a);
  CHECK(pool.grow(c, 16) == KvAllocStatus::ok);
  CHECK(c.blocks().size() == 4);

  // A table the pool did not allocate is refused.
  Table none;
  CHECK(pool.grow(none, 1) == KvAllocStatus::too_large);
  check_partition(pool);
}

TEST_CASE("KvBlockPool: two sequences with a common two-block prefix share those blocks, counted once") {
  Pool pool({.block_size = 4, .total_blocks = 16});
  const auto prefix = iota(0, 8);
  const auto prompt_a = concat(prefix, iota(100, 2));  // 2 full blocks + a partial one
  const auto prompt_b = concat(prefix, iota(200, 3));

  Table a, b;
  REQUIRE(pool.allocate(a, prompt_a) == KvAllocStatus::ok);
  CHECK(a.cached_tokens() == 0);
  pool.commit(a, prompt_a);  // the engine prefilled a
  CHECK(a.committed_tokens() == 10);
  CHECK(pool.cached_prefix_tokens(prompt_b) == 8);

  REQUIRE(pool.allocate(b, prompt_b) == KvAllocStatus::ok);
  CHECK(b.cached_tokens() == 8);  // prefill of b starts at token 8
  REQUIRE(b.blocks().size() == 3);
  CHECK(b.blocks()[0] == a.blocks()[0]);
  CHECK(b.blocks()[1] == a.blocks()[1]);
  CHECK(b.blocks()[2] != a.blocks()[2]);  // the partial block is b's own
  auto s = pool.stats();
  CHECK(s.used_blocks == 4);  // 2 shared + a's partial + b's partial
  CHECK(s.prefix_lookups == 2);
  CHECK(s.prefix_query_tokens == 10 + 11);
  CHECK(s.prefix_hit_tokens == 8);

  // Freeing a keeps the shared blocks (b holds them); its partial block becomes free.
  pool.free(a);
  s = pool.stats();
  CHECK(s.used_blocks == 3);
  CHECK(s.cached_blocks == 0);
  // Freeing b releases the last reference: the two full blocks stay cached.
  pool.free(b);
  s = pool.stats();
  CHECK(s.used_blocks == 0);
  CHECK(s.cached_blocks == 2);
  CHECK(s.free_blocks == 14);
  CHECK(pool.cached_prefix_tokens(prompt_a) == 8);
  check_partition(pool);
}

TEST_CASE("KvBlockPool: a partial block and the block of the prompt's last token are never shared") {
  Pool pool({.block_size = 4, .total_blocks = 16});
  Table a;
  const auto six = iota(0, 6);
  prefill(pool, a, six);  // block 0 full, block 1 holds 2 of 4
  CHECK(pool.stats().prefix_hit_tokens == 0);

  Table b;
  REQUIRE(pool.allocate(b, six) == KvAllocStatus::ok);
  CHECK(b.cached_tokens() == 4);
  CHECK(b.blocks()[0] == a.blocks()[0]);
  CHECK(b.blocks()[1] != a.blocks()[1]);

  // A prompt of exactly two full blocks: the second holds its last token, which prefill
  // must compute, so only the first is shared, even when both are cached.
  Table c, d, e;
  const auto eight = iota(50, 8);
  prefill(pool, c, eight);
  REQUIRE(pool.allocate(d, eight) == KvAllocStatus::ok);
  CHECK(d.cached_tokens() == 4);
  CHECK(d.blocks()[1] != c.blocks()[1]);
  // One token more, and both full blocks are shared.
  const auto nine = concat(eight, {7});
  REQUIRE(pool.allocate(e, nine) == KvAllocStatus::ok);
  CHECK(e.cached_tokens() == 8);
  CHECK(e.blocks()[1] == c.blocks()[1]);
}

TEST_CASE("KvBlockPool: blocks filled by generated tokens are shared too, once committed") {
  Pool pool({.block_size = 4, .total_blocks = 16});
  Table a;
  std::vector<std::int32_t> tokens = iota(0, 3);
  REQUIRE(pool.allocate(a, tokens, {.max_tokens = 16}) == KvAllocStatus::ok);
  pool.commit(a, tokens);
  // Decode six tokens: before each step the table grows to hold the fed-back token.
  for (std::int32_t t = 3; t < 9; ++t) {
    REQUIRE(pool.grow(a, tokens.size() + 1) == KvAllocStatus::ok);
    tokens.push_back(t);
    // The step wrote the KV of every token but the one it just emitted.
    pool.commit(a, std::span<const std::int32_t>(tokens).first(tokens.size() - 1));
  }
  CHECK(a.committed_tokens() == 8);
  CHECK(pool.cached_prefix_tokens(concat(tokens, {99})) == 8);
  // A commit beyond the table's capacity is ignored past it.
  pool.commit(a, iota(0, 40));
  CHECK(a.committed_tokens() == a.capacity_tokens());
}

TEST_CASE("KvBlockPool: unreferenced cached blocks are evicted least recently released first, a sequence's last block first") {
  Pool pool({.block_size = 2, .total_blocks = 6});
  const auto prompt_a = iota(0, 5);    // blocks a0 a1 full, a2 partial
  const auto prompt_b = iota(100, 5);  // b0 b1 full, b2 partial
  Table a, b;
  REQUIRE(pool.allocate(a, prompt_a) == KvAllocStatus::ok);
  REQUIRE(pool.allocate(b, prompt_b) == KvAllocStatus::ok);
  pool.commit(a, prompt_a);
  pool.commit(b, prompt_b);
  pool.free(a);  // eviction order: a1 a0
  pool.free(b);  // then b1 b0; a2 and b2 are free
  auto s = pool.stats();
  CHECK(s.cached_blocks == 4);
  CHECK(s.free_blocks == 2);
  CHECK(pool.available_blocks() == 6);
  CHECK(pool.cached_prefix_tokens(prompt_a) == 4);
  CHECK(pool.cached_prefix_tokens(prompt_b) == 4);

  // Free blocks go first: no eviction.
  Table c;
  REQUIRE(pool.allocate(c, iota(1000, 4)) == KvAllocStatus::ok);
  CHECK(pool.stats().evictions == 0);
  // Then a1 (a's last full block), a0, b1, b0.
  Table d, e, f;
  REQUIRE(pool.allocate(d, iota(2000, 2)) == KvAllocStatus::ok);
  CHECK(pool.stats().evictions == 1);
  CHECK(pool.cached_prefix_tokens(prompt_a) == 2);
  CHECK(pool.cached_prefix_tokens(prompt_b) == 4);
  REQUIRE(pool.allocate(e, iota(3000, 2)) == KvAllocStatus::ok);
  CHECK(pool.cached_prefix_tokens(prompt_a) == 0);
  CHECK(pool.cached_prefix_tokens(prompt_b) == 4);

  // A hit takes b0 out of the eviction order, so the next eviction is b1 and b0 survives.
  Table g;
  REQUIRE(pool.allocate(g, concat(iota(100, 2), {-1})) == KvAllocStatus::ok);  // b0 + its own block
  CHECK(g.cached_tokens() == 2);
  CHECK(pool.stats().evictions == 3);  // g's own block evicted b1
  CHECK(pool.available_blocks() == 0);
  CHECK(pool.allocate(f, iota(4000, 1)) == KvAllocStatus::no_room);  // b0 is held by g
  pool.free(g);
  CHECK(pool.cached_prefix_tokens(prompt_b) == 2);
  check_partition(pool);
}

TEST_CASE("KvBlockPool: cached_prefix_tokens is a side-effect-free preview of allocate") {
  Pool pool({.block_size = 4, .total_blocks = 32});
  const auto system = iota(0, 12);
  Table first;
  REQUIRE(pool.allocate(first, concat(system, {500})) == KvAllocStatus::ok);
  pool.commit(first, concat(system, {500}));
  const auto before = pool.stats();
  for (std::int32_t user = 0; user < 4; ++user) {
    const auto prompt = concat(system, iota(1000 * (user + 1), 5));
    CHECK(pool.cached_prefix_tokens(prompt) == 12);
  }
  const auto after = pool.stats();
  CHECK(after.prefix_lookups == before.prefix_lookups);
  CHECK(after.used_blocks == before.used_blocks);
  CHECK(pool.cached_prefix_tokens(iota(1, 12)) == 0);  // off by one token at the start
  CHECK(pool.cached_prefix_tokens({}) == 0);

  std::vector<Table> tables(4);
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const auto prompt = concat(system, iota(static_cast<std::int32_t>(1000 * (i + 1)), 5));
    REQUIRE(pool.allocate(tables[i], prompt) == KvAllocStatus::ok);
    CHECK(tables[i].cached_tokens() == 12);
    CHECK(tables[i].committed_tokens() == 12);
  }
  CHECK(pool.stats().prefix_hit_rate() == 48.0 / 81.0);  // 4 x 12 hit of 13 + 4 x 17 asked
  CHECK(pool.stats().used_blocks == 4 + 4 * 2);  // 3 shared + first's own, 2 each of their own
}

TEST_CASE("KvBlockPool: the watermark keeps blocks available after an admission") {
  Pool pool({.block_size = 4, .total_blocks = 10});
  CHECK(pool.can_allocate(4, 6));
  CHECK_FALSE(pool.can_allocate(4, 7));
  CHECK_FALSE(pool.can_allocate(11));
  Table a;
  CHECK(pool.allocate(a, iota(0, 16), {.watermark_blocks = 7}) == KvAllocStatus::no_room);
  REQUIRE(pool.allocate(a, iota(0, 16), {.watermark_blocks = 6}) == KvAllocStatus::ok);
  CHECK(pool.available_blocks() == 6);
  // The watermark binds admissions only: a running sequence may grow into it.
  CHECK(pool.grow(a, 40) == KvAllocStatus::ok);
  CHECK(pool.available_blocks() == 0);
  pool.free(a);

  // Reviving an unreferenced cached block takes it from what is available, as a fresh
  // block would.
  Table b, c;
  const auto prompt = iota(0, 9);
  prefill(pool, b, prompt);
  pool.free(b);  // 2 cached, 8 free
  CHECK(pool.available_blocks() == 10);
  CHECK(pool.allocate(c, prompt, {.watermark_blocks = 8}) == KvAllocStatus::no_room);
  REQUIRE(pool.allocate(c, prompt, {.watermark_blocks = 7}) == KvAllocStatus::ok);
  CHECK(c.cached_tokens() == 8);
  CHECK(pool.available_blocks() == 7);
}

TEST_CASE("KvBlockPool: reserve books prompt + max new tokens at admission; grow then never fails") {
  Pool pool({.block_size = 4, .total_blocks = 10});
  Table a;
  CHECK_THROWS_MATCHES((void)pool.allocate(a, iota(0, 5), {.reserve = true}), std::invalid_argument,
                       MessageIs("KvAllocateOptions: reserve needs max_tokens"));
  CHECK(pool.allocate(a, iota(0, 5), {.max_tokens = 41, .reserve = true}) == KvAllocStatus::too_large);
  REQUIRE(pool.allocate(a, iota(0, 5), {.max_tokens = 20, .reserve = true}) == KvAllocStatus::ok);
  CHECK(a.blocks().size() == 2);  // the prompt's blocks are taken, the rest booked
  CHECK(a.booked_blocks() == 3);
  auto s = pool.stats();
  CHECK(s.used_blocks == 2);
  CHECK(s.reserved_blocks == 3);
  CHECK(pool.available_blocks() == 5);

  // A second reservation that does not fit beside the booking waits (no_room).
  Table b;
  CHECK(pool.allocate(b, iota(100, 4), {.max_tokens = 24, .reserve = true}) == KvAllocStatus::no_room);
  REQUIRE(pool.allocate(b, iota(100, 4), {.max_tokens = 20, .reserve = true}) == KvAllocStatus::ok);
  CHECK(pool.available_blocks() == 0);
  // Nothing else can be admitted, yet both reserved sequences grow to their max.
  Table c;
  CHECK(pool.allocate(c, iota(200, 1)) == KvAllocStatus::no_room);
  for (std::size_t n = 6; n <= 20; ++n) REQUIRE(pool.grow(a, n) == KvAllocStatus::ok);
  for (std::size_t n = 5; n <= 20; ++n) REQUIRE(pool.grow(b, n) == KvAllocStatus::ok);
  CHECK(a.blocks().size() == 5);
  CHECK(a.booked_blocks() == 0);
  CHECK(pool.stats().reserved_blocks == 0);
  CHECK(pool.grow(a, 21) == KvAllocStatus::too_large);

  // A sequence that ends early gives its booking back.
  pool.free(a);
  pool.free(b);
  Table d;
  REQUIRE(pool.allocate(d, iota(0, 4), {.max_tokens = 40, .reserve = true}) == KvAllocStatus::ok);
  CHECK(pool.stats().reserved_blocks == 9);
  pool.free(d);
  CHECK(pool.stats().reserved_blocks == 0);
  CHECK(pool.available_blocks() == 10);
  check_partition(pool);
}

TEST_CASE("KvBlockPool: booked blocks keep their cached content until grow needs them") {
  Pool pool({.block_size = 2, .total_blocks = 4});
  Table a;
  const auto prompt = iota(0, 5);
  prefill(pool, a, prompt);
  pool.free(a);  // 2 cached, 2 free
  Table r;
  REQUIRE(pool.allocate(r, iota(100, 1), {.max_tokens = 8, .reserve = true}) == KvAllocStatus::ok);
  CHECK(pool.stats().reserved_blocks == 3);
  CHECK(pool.stats().evictions == 0);
  CHECK(pool.cached_prefix_tokens(prompt) == 4);  // still there
  REQUIRE(pool.grow(r, 8) == KvAllocStatus::ok);
  CHECK(pool.stats().evictions == 2);
  CHECK(pool.cached_prefix_tokens(prompt) == 0);
}

TEST_CASE("KvBlockPool: hash collisions never share a block whose prefix differs") {
  KvBlockPool<std::int32_t, ConstantHash> pool({.block_size = 2, .total_blocks = 32});
  using CTable = decltype(pool)::BlockTable;
  // Same second block, different first block: the second must not be shared.
  const std::vector<std::int32_t> x = {1, 2, 7, 8, 0};
  const std::vector<std::int32_t> y = {3, 4, 7, 8, 0};
  // Same tokens at a different depth.
  const std::vector<std::int32_t> z = {7, 8, 7, 8, 0};
  CTable a, b, c, d;
  prefill(pool, a, x);
  CHECK(pool.cached_prefix_tokens(y) == 0);
  CHECK(pool.cached_prefix_tokens(z) == 0);
  REQUIRE(pool.allocate(b, y) == KvAllocStatus::ok);
  CHECK(b.cached_tokens() == 0);
  pool.commit(b, y);
  REQUIRE(pool.allocate(c, z) == KvAllocStatus::ok);
  CHECK(c.cached_tokens() == 0);
  pool.commit(c, z);
  // Every distinct block is indexed under the same key; each prefix still finds its own.
  REQUIRE(pool.allocate(d, y) == KvAllocStatus::ok);
  CHECK(d.cached_tokens() == 4);
  CHECK(d.blocks()[0] == b.blocks()[0]);
  CHECK(d.blocks()[1] == b.blocks()[1]);
  CHECK(pool.cached_prefix_tokens(x) == 4);
  CHECK(pool.cached_prefix_tokens(z) == 4);
  CHECK(pool.cached_prefix_tokens(std::vector<std::int32_t>{1, 2, 7, 9, 0}) == 2);
}

TEST_CASE("KvBlockPool: blocks filled twice before either was indexed are both shareable, and so are their children") {
  Pool pool({.block_size = 2, .total_blocks = 16});
  const auto prompt = iota(0, 5);
  Table a, b;
  REQUIRE(pool.allocate(a, prompt) == KvAllocStatus::ok);
  REQUIRE(pool.allocate(b, prompt) == KvAllocStatus::ok);  // admitted in the same step: no hit yet
  CHECK(b.cached_tokens() == 0);
  pool.commit(a, prompt);
  pool.commit(b, prompt);  // same content as a's: indexed beside it; b's ids do not change
  // b decodes on; its next full block is a child of content a holds as well.
  const auto longer = concat(prompt, {5, 6});
  REQUIRE(pool.grow(b, 7) == KvAllocStatus::ok);
  pool.commit(b, longer);
  pool.free(b);
  // Whichever twin a lookup finds first, b's child block matches through it.
  Table c;
  REQUIRE(pool.allocate(c, concat(longer, {9})) == KvAllocStatus::ok);
  CHECK(c.cached_tokens() == 6);
  // With a holding its twins, evict b's: the prefix is still found through a's.
  pool.free(c);
  Table filler;
  REQUIRE(pool.allocate(filler, iota(100, 2 * (16 - 3))) == KvAllocStatus::ok);  // 13 blocks
  CHECK(pool.cached_prefix_tokens(concat(longer, {9})) == 4);
  CHECK(pool.cached_prefix_tokens(prompt) == 4);
}

TEST_CASE("KvBlockPool: without prefix caching nothing is indexed, shared or counted") {
  Pool pool({.block_size = 4, .total_blocks = 8, .prefix_caching = false});
  CHECK_FALSE(pool.prefix_caching());
  const auto prompt = iota(0, 9);
  Table a, b;
  prefill(pool, a, prompt);
  CHECK(a.committed_tokens() == 9);
  REQUIRE(pool.allocate(b, prompt) == KvAllocStatus::ok);
  CHECK(b.cached_tokens() == 0);
  CHECK(pool.cached_prefix_tokens(prompt) == 0);
  pool.free(a);
  const auto s = pool.stats();
  CHECK(s.cached_blocks == 0);
  CHECK(s.free_blocks == 5);
  CHECK(s.prefix_lookups == 0);
}

TEST_CASE("KvBlockPool: a table frees itself when destroyed, and moves carry its blocks") {
  Pool pool({.block_size = 4, .total_blocks = 8});
  {
    Table a;
    REQUIRE(pool.allocate(a, iota(0, 8)) == KvAllocStatus::ok);
    Table b(std::move(a));
    CHECK_FALSE(a.allocated());  // NOLINT(bugprone-use-after-move): moved-from is empty
    CHECK(b.blocks().size() == 2);
    Table c;
    REQUIRE(pool.allocate(c, iota(0, 4)) == KvAllocStatus::ok);
    c = std::move(b);  // c's own block is freed first
    CHECK(pool.stats().used_blocks == 2);
    CHECK(c.blocks().size() == 2);
  }
  CHECK(pool.stats().used_blocks == 0);
  CHECK(pool.available_blocks() == 8);

  std::vector<Table> tables;
  for (int i = 0; i < 8; ++i) {
    tables.emplace_back();
    REQUIRE(pool.allocate(tables.back(), iota(10 * i, 3)) == KvAllocStatus::ok);  // vector moves tables
  }
  CHECK(pool.stats().used_blocks == 8);
  tables.clear();
  CHECK(pool.stats().used_blocks == 0);
}

TEST_CASE("KvBlockPool: metrics through the registry") {
  MetricsRegistry registry;
  Pool pool({.block_size = 4, .total_blocks = 8, .metrics = &registry, .metric_labels = {{"model", "chat"}}});
  const auto prompt = iota(0, 9);
  Table a, b;
  REQUIRE(pool.allocate(a, prompt, {.max_tokens = 24, .reserve = true}) == KvAllocStatus::ok);
  pool.commit(a, prompt);
  REQUIRE(pool.allocate(b, prompt) == KvAllocStatus::ok);
  const std::string text = registry.prometheus();
  CHECK(contains(text, "tailbatch_kv_blocks_capacity{model=\"chat\"} 8\n"));
  CHECK(contains(text, "tailbatch_kv_blocks_used{model=\"chat\"} 4\n"));
  CHECK(contains(text, "tailbatch_kv_blocks_reserved{model=\"chat\"} 3\n"));
  CHECK(contains(text, "tailbatch_kv_blocks_cached{model=\"chat\"} 0\n"));
  CHECK(contains(text, "tailbatch_kv_prefix_cache_queries_total{model=\"chat\"} 18\n"));
  CHECK(contains(text, "tailbatch_kv_prefix_cache_hits_total{model=\"chat\"} 8\n"));
  pool.free(a);
  pool.free(b);
  Table c;
  REQUIRE(pool.allocate(c, iota(100, 32)) == KvAllocStatus::ok);  // takes the 6 free, evicts the 2 cached
  const std::string later = registry.prometheus();
  CHECK(contains(later, "tailbatch_kv_evictions_total{model=\"chat\"} 2\n"));
  CHECK(contains(later, "tailbatch_kv_blocks_used{model=\"chat\"} 8\n"));
}

TEST_CASE("KvBlockPool: stats and metrics are read from other threads while the owner works") {
  MetricsRegistry registry;
  Pool pool({.block_size = 4, .total_blocks = 64, .metrics = &registry});
  std::atomic<bool> done{false};
  std::atomic<int> bad_readings{0};  // Catch2's assertions are for the test's own thread
  std::atomic<int> readings{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      while (!done.load(std::memory_order_acquire)) {
        bool ok = true;
        if (r == 0) {
          const auto s = pool.stats();
          ok = s.used_blocks + s.cached_blocks <= s.total_blocks && pool.can_ever_fit(256);
        } else {
          ok = contains(registry.prometheus(), "tailbatch_kv_blocks_used");
        }
        if (!ok) bad_readings.fetch_add(1);
        readings.fetch_add(1);
      }
    });
  }
  while (readings.load() < 2) std::this_thread::yield();  // the readers are running
  // The owner: sequences sharing a system prompt come and go.
  const auto system = iota(0, 16);
  std::vector<Table> tables(8);
  const int rounds = 2000 / tailbatch::test::sanitizer_slowdown;
  for (int i = 0; i < rounds; ++i) {
    Table& t = tables[static_cast<std::size_t>(i) % tables.size()];
    pool.free(t);
    const auto prompt = concat(system, iota(1000 + i, 1 + static_cast<std::size_t>(i % 9)));
    if (pool.allocate(t, prompt, {.max_tokens = prompt.size() + 8}) != KvAllocStatus::ok) continue;
    pool.commit(t, prompt);
    (void)pool.grow(t, prompt.size() + 8);
  }
  done.store(true, std::memory_order_release);
  for (auto& th : readers) th.join();
  CHECK(bad_readings.load() == 0);
  const auto s = pool.stats();
  CHECK(s.prefix_hit_tokens > 0);
  std::set<KvBlockId> used;
  for (const auto& t : tables)
    for (KvBlockId b : t.blocks()) used.insert(b);
  CHECK(s.used_blocks == used.size());
}

// A random mix of admissions, steps, commits and frees on a small pool, with an engine
// model that writes each token's "KV" into the slot its block table names. As in a real
// model, a token's KV depends on its position and on every token before it: here, a
// fingerprint of the prefix it ends. Whatever the pool shares, the KV a sequence reads
// back must be that of its own prefix, and no sequence may write into a block another one
// references.
template <class Hasher>
void run_engine_model(std::uint32_t seed) {
  constexpr std::size_t block_size = 3;
  constexpr std::size_t total = 24;
  KvBlockPool<std::int32_t, Hasher> pool({.block_size = block_size, .total_blocks = total});
  using T = typename decltype(pool)::BlockTable;
  std::vector<std::uint64_t> kv(total * block_size, 0);  // the engine's memory: one slot per token
  const auto fingerprint = [](const std::vector<std::int32_t>& tokens, std::size_t p) {
    std::uint64_t f = 0;
    for (std::size_t i = 0; i <= p; ++i) f = f * 1000003u + static_cast<std::uint64_t>(tokens[i]) + 1;
    return f;
  };
  struct Seq {
    T table;
    std::vector<std::int32_t> tokens;  // prompt, then generated
    std::size_t written = 0;           // tokens whose KV is in the engine's memory
  };
  std::vector<Seq> seqs(6);
  std::mt19937 rng(seed);
  // Prompts from a few shared prefixes, so that sharing and collisions happen.
  const std::vector<std::vector<std::int32_t>> prefixes = {iota(0, 7), iota(0, 4), {5, 5, 5, 5, 5, 5}, {}};
  const auto holders = [&](KvBlockId b) {
    int n = 0;
    for (const auto& s : seqs)
      for (KvBlockId x : s.table.blocks()) n += x == b;
    return n;
  };
  const auto write = [&](Seq& s, std::size_t upto) {  // the engine computes KV for [written, upto)
    for (std::size_t p = s.written; p < upto; ++p) {
      const KvBlockId b = s.table.blocks()[p / block_size];
      REQUIRE(holders(b) == 1);  // never write into a shared block
      kv[b * block_size + p % block_size] = fingerprint(s.tokens, p);
    }
    s.written = upto;
    pool.commit(s.table, std::span<const std::int32_t>(s.tokens).first(upto));
  };
  for (int step = 0; step < 400; ++step) {
    Seq& s = seqs[rng() % seqs.size()];
    const unsigned op = rng() % 10;
    if (!s.table.allocated()) {
      s.tokens = prefixes[rng() % prefixes.size()];
      const std::size_t extra = 1 + rng() % 5;
      for (std::size_t i = 0; i < extra; ++i) s.tokens.push_back(static_cast<std::int32_t>(rng() % 3));
      const auto status = pool.allocate(s.table, s.tokens, {.max_tokens = s.tokens.size() + 12});
      if (status != KvAllocStatus::ok) continue;
      // What prefill skips must already be in the engine's memory.
      for (std::size_t p = 0; p < s.table.cached_tokens(); ++p)
        REQUIRE(kv[s.table.blocks()[p / block_size] * block_size + p % block_size] == fingerprint(s.tokens, p));
      s.written = s.table.cached_tokens();
      write(s, s.tokens.size());  // prefill
    } else if (op < 7) {
      // A decode step: append a token, make room for it, write the one before it.
      if (s.tokens.size() >= s.table.max_tokens()) {
        pool.free(s.table);
        continue;
      }
      if (pool.grow(s.table, s.tokens.size() + 1) != KvAllocStatus::ok) {
        pool.free(s.table);  // preempted
        continue;
      }
      s.tokens.push_back(static_cast<std::int32_t>(rng() % 3));
      write(s, s.tokens.size() - 1);
    } else {
      pool.free(s.table);
    }
    check_partition(pool);
    // Reference counts match the tables, and what the stats call used.
    std::set<KvBlockId> used;
    for (const auto& q : seqs)
      for (KvBlockId b : q.table.blocks()) used.insert(b);
    REQUIRE(pool.stats().used_blocks == used.size());
  }
  const auto s = pool.stats();
  CHECK(s.prefix_hit_tokens > 0);  // the run did exercise sharing
}

TEST_CASE("KvBlockPool: a random run keeps the engine's KV consistent with every table") {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    run_engine_model<KvBlockHash<std::int32_t>>(seed);
    run_engine_model<FourKeysHash>(seed);
    run_engine_model<ConstantHash>(seed);
  }
}
