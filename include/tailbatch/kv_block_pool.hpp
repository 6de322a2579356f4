// KvBlockPool: a generative engine's KV-cache memory as fixed-size blocks, the resource a
// KV-cache-aware scheduler admits, grows and preempts sequences by.
//
// An engine keeps the keys and values of every token a sequence has seen (its KV cache),
// and that memory, not compute, runs out first when sequences are batched: each decode
// step adds one token's KV to every sequence, and no one knows how long a sequence will
// run. The pool cuts the engine's KV memory into total_blocks blocks of block_size tokens
// and gives each sequence a block table: the ids of its blocks, in token order, which the
// engine maps to its own memory (docs/kv-cache.md: a paged-attention kernel, a
// contiguous cache). The pool holds no KV: only block ids, reference counts, and the
// tokens of the full blocks it can share.
//
//   allocate(table, prompt, options)  the prompt's blocks, sharing cached prefix blocks
//   grow(table, tokens)               more blocks for a longer sequence
//   commit(table, tokens)             the engine has written these tokens' KV: full blocks
//                                     become shareable by later sequences
//   free(table)                       everything back (the sequence finished or is preempted)
//
// The two admission modes of docs/kv-cache.md are built from these; the scheduler chooses:
//   grow (vLLM)    allocate() the prompt when it fits with watermark_blocks to spare; grow()
//                  a block at a time as decoding fills the last one; when grow() reports
//                  no_room, free() a victim (preemption by recompute) and try again.
//   reserve (TGI)  allocate() with reserve: prompt + max new tokens are booked at once, so
//                  grow() up to max_tokens never fails and nothing is ever preempted.
//
// Prefix reuse. A full block whose KV is committed is indexed by a chained hash of its
// whole prefix (block i's key covers tokens [0, (i+1)·block_size)). allocate() gives a new
// sequence every leading full block of its prompt that is indexed, shared and reference-
// counted, and table.cached_tokens() says how many prompt tokens prefill may skip. The
// last, partial block is never shared, nor is the block holding the prompt's last token:
// prefill always computes that token, whose logits start decoding. A hash match is
// verified (the block's own tokens and the identity of its parent block), so a collision
// costs a comparison, never a wrong KV. A released full block stays cached until the pool
// needs its memory; then the least recently released goes first, and the blocks of one
// sequence from its last to its first, so that a prefix outlives its extensions.
//
// Accounting. Every block is in exactly one state: used (referenced by a table), cached
// (holding indexed content that no table references: evictable) or free (empty). A reserve
// booking promises blocks without taking them, so booked blocks keep their cached content
// until grow() needs them: available_blocks() = free + cached - booked.
//
// Threads. The pool has one owner, the scheduler's decode thread: a batcher calls it between
// steps, where a lock would only add cost. Everything that changes or looks up blocks is
// "Not thread-safe: one owner". What another thread needs is thread-safe: the geometry
// (block_size(), blocks_for(), can_ever_fit(): a submit() checks a prompt against the pool),
// stats() and the metrics (relaxed atomics the owner publishes).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/hash.hpp>
#include <tailbatch/detail/kv/lru_list.hpp>
#include <tailbatch/detail/kv/prefix_index.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/metrics.hpp>
#include <type_traits>
#include <utility>
#include <vector>

namespace tailbatch {

// A block's id: an index in [0, total_blocks) that the engine maps to its KV memory.
using KvBlockId = std::uint32_t;

// What a token must be for the pool: copied into the blocks it indexes, compared to verify
// a hash match.
template <class T>
concept KvToken = std::semiregular<T> && std::equality_comparable<T>;

// The key of a full block: a 64-bit hash of its parent's key (0 for the first block) and
// its own tokens, so that block i's key covers the whole prefix [0, (i+1)·block_size).
// Only equal keys are compared token by token, so a weak hasher costs time, never
// correctness.
template <class H, class Token>
concept KvBlockHasher = std::default_initializable<H> && std::copy_constructible<H> &&
    requires(const H& h, std::uint64_t parent, std::span<const Token> tokens) {
  { h(parent, tokens) }
  noexcept->std::same_as<std::uint64_t>;
};

// The default KvBlockHasher: integral and enum tokens are mixed as they are, others through
// std::hash<Token>; a multiply-rotate step per token in four interleaved lanes, the lanes
// rotated apart, summed and finalized (detail::mix64).
template <class Token>
requires std::integral<Token> || std::is_enum_v<Token> || requires(const Token& t) {
  std::hash<Token>{}(t);
}
struct KvBlockHash {
  [[nodiscard]] std::uint64_t operator()(std::uint64_t parent,
                                         std::span<const Token> tokens) const noexcept {
    // Four independent lanes, so that consecutive multiplies overlap instead of waiting on
    // each other; lane j takes tokens j, j + 4, ...
    std::uint64_t lane[4] = {parent ^ 0x243F6A8885A308D3ull, 0x13198A2E03707344ull,
                             0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
    const Token* t = tokens.data();
    const std::size_t n = tokens.size();
    for (std::size_t quad = 0; quad < n / 4; ++quad, t += 4) {
      lane[0] = step(lane[0], t[0]);
      lane[1] = step(lane[1], t[1]);
      lane[2] = step(lane[2], t[2]);
      lane[3] = step(lane[3], t[3]);
    }
    for (std::size_t j = 0; j < n % 4; ++j) lane[j] = step(lane[j], t[j]);
    return detail::mix64(lane[0] + std::rotl(lane[1], 16) + std::rotl(lane[2], 32) +
                         std::rotl(lane[3], 48) + static_cast<std::uint64_t>(tokens.size()));
  }

 private:
  static std::uint64_t step(std::uint64_t lane, const Token& t) noexcept {
    return (std::rotl(lane, 23) ^ bits(t)) * 0x9E3779B97F4A7C15ull;
  }
  static std::uint64_t bits(const Token& t) noexcept {
    if constexpr (std::is_enum_v<Token>) {
      return static_cast<std::uint64_t>(static_cast<std::underlying_type_t<Token>>(t));
    } else if constexpr (std::is_integral_v<Token>) {
      return static_cast<std::uint64_t>(t);
    } else {
      return static_cast<std::uint64_t>(std::hash<Token>{}(t));
    }
  }
};

// The pool's shape. Plain values; checked at construction.
struct KvBlockPoolConfig {
  // Tokens per block. Must be >= 1. Small blocks waste less of a sequence's last block and
  // share more of a prefix; large ones make block tables shorter. vLLM uses 16.
  std::size_t block_size = 16;
  // Blocks in the pool: the engine's KV memory divided by the size of one block's KV
  // (block_size x layers x 2 x KV heads x head dim x bytes per value). No default: it is the
  // engine's to say. Must be >= 1 and < 2^32 - 1 (block ids are 32-bit).
  std::size_t total_blocks = 0;
  // Index committed full blocks and share them with later sequences of the same prefix.
  // Off: no lookups, and neither the token copies nor the index are allocated.
  bool prefix_caching = true;
  // Metrics, registered at construction with metric_labels added to each; nullptr: none,
  // at no cost. The registry must outlive the pool.
  //   tailbatch_kv_blocks_capacity              gauge    blocks in the pool
  //   tailbatch_kv_blocks_used                 gauge    blocks referenced by a sequence
  //   tailbatch_kv_blocks_cached               gauge    unreferenced blocks holding a
  //                                                     reusable prefix (evictable)
  //   tailbatch_kv_blocks_reserved             gauge    blocks booked by reserve mode, not
  //                                                     yet taken
  //   tailbatch_kv_prefix_cache_queries_total  counter  prompt tokens looked up by allocate()
  //   tailbatch_kv_prefix_cache_hits_total     counter  of them, found cached (prefill skips them)
  //   tailbatch_kv_evictions_total             counter  cached blocks evicted to make room
  // Gauges are computed when the registry is read; the counters are added to once per
  // allocate() and once per eviction.
  MetricsRegistry* metrics = nullptr;
  Labels metric_labels{};
};

// How one allocate() books its blocks.
struct KvAllocateOptions {
  // The most tokens the sequence will ever hold: its prompt plus its max new tokens. grow()
  // refuses to go past it (too_large), and allocate() sizes the table's storage to it, so
  // that grow() never allocates. The default, no limit of its own, leaves the pool as the
  // only bound. Less than the prompt counts as the prompt.
  std::size_t max_tokens = std::numeric_limits<std::size_t>::max();
  // Book max_tokens' blocks now (TGI's reserve mode): grow() up to max_tokens then never
  // reports no_room. Needs max_tokens.
  bool reserve = false;
  // Blocks that must stay available after this allocation (vLLM's watermark): room kept for
  // the running sequences to grow into, so that admitting one sequence does not force a
  // preemption at the very next step. 0: none.
  std::size_t watermark_blocks = 0;
};

// What allocate() and grow() report. On anything but ok, nothing changed.
enum class KvAllocStatus : std::uint8_t {
  ok,
  no_room,    // not enough available blocks now: wait, or free (preempt) another sequence
  too_large,  // can never be done: more blocks than the pool has, past the table's
              // max_tokens, or (grow) a table this pool did not allocate
};

// A short, stable, lower-case name ("no_room"). Never allocates. Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(KvAllocStatus s) noexcept {
  return detail::enum_name(s, {"ok", "no_room", "too_large"});
}

// What a KvBlockPool holds and has done, read at one moment (stats()). used_blocks and
// cached_blocks are read together, so used + cached + free == total always holds; the other
// fields are read one by one with relaxed loads, so while the owner works they may disagree
// with those two by the call in progress.
struct KvBlockPoolStats {
  std::size_t total_blocks = 0;
  std::size_t used_blocks = 0;            // referenced by at least one table
  std::size_t cached_blocks = 0;          // unreferenced, holding indexed content: evictable
  std::size_t free_blocks = 0;            // empty
  std::size_t reserved_blocks = 0;        // booked by reserve-mode allocations, not yet taken
  std::uint64_t prefix_lookups = 0;       // allocate() calls that looked their prompt up
  std::uint64_t prefix_query_tokens = 0;  // prompt tokens those lookups covered
  std::uint64_t prefix_hit_tokens = 0;    // of them, found cached
  std::uint64_t evictions = 0;            // cached blocks whose content was dropped for reuse

  // free + cached - reserved: what an allocation may take. Never blocks. Thread-safe.
  [[nodiscard]] std::size_t available_blocks() const noexcept {
    const std::size_t takeable = free_blocks + cached_blocks;
    return takeable > reserved_blocks ? takeable - reserved_blocks : 0;
  }
  // prefix_hit_tokens / prefix_query_tokens; 0 before any lookup. Never blocks. Thread-safe.
  [[nodiscard]] double prefix_hit_rate() const noexcept {
    return prefix_query_tokens == 0
               ? 0.0
               : static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_query_tokens);
  }
};

// The pool. Token: what the engine's sequences are made of (e.g. std::int32_t). Hasher: the
// block key (KvBlockHasher).
//
// Thread-safety: one owner (see the file comment); each member says which it is.
// Exceptions: the constructor throws std::invalid_argument naming a bad config field, and
// std::bad_alloc; allocate() throws std::invalid_argument on misuse (a table that already
// holds blocks; reserve without max_tokens) and std::bad_alloc when the table's storage
// must grow, with nothing changed (strong guarantee); everything else is noexcept.
// Allocation: at construction, per block 36 bytes, and with prefix caching block_size tokens
// plus 40 to 72 bytes more (eviction links and an index kept at most half full), and the
// metrics' registration. Afterwards only a table's own storage allocates: in
// allocate(), for max_tokens' blocks (kept when the table is freed and reused), and in grow()
// past that only when max_tokens was left unlimited.
//
// Lifetime: the pool must outlive its tables (a table frees itself on destruction). Not
// copyable, not movable (tables and metrics point at it).
template <KvToken Token = std::int32_t, KvBlockHasher<Token> Hasher = KvBlockHash<Token>>
class KvBlockPool {
 public:
  using token_type = Token;
  using hasher_type = Hasher;

  // One sequence's blocks, in token order: token t of the sequence lives in block
  // blocks()[t / block_size()] at offset t % block_size(). Filled by allocate() and grow(),
  // emptied by free() or its destructor. Move-only (a copy would free its blocks twice).
  // Not thread-safe: used by the pool's owner.
  class BlockTable {
   public:
    // An empty table, for allocate(). Allocates nothing. Thread-safe.
    BlockTable() noexcept = default;
    // Takes other's blocks; other is left empty. Not thread-safe: the pool's owner.
    BlockTable(BlockTable&& other) noexcept { take(other); }
    // Frees the blocks held (see KvBlockPool::free) before taking over other's; other is
    // left empty. Not thread-safe: the pool's owner.
    BlockTable& operator=(BlockTable&& other) noexcept {
      if (this != &other) {
        release();
        take(other);
      }
      return *this;
    }
    BlockTable(const BlockTable&) = delete;
    BlockTable& operator=(const BlockTable&) = delete;
    // Frees the blocks held. Not thread-safe: on the pool's owner thread.
    ~BlockTable() { release(); }

    // The block ids, in token order: what the engine's attention reads. Valid until the
    // next allocate(), grow() or free() of this table. Not thread-safe: the pool's owner.
    [[nodiscard]] std::span<const KvBlockId> blocks() const noexcept { return blocks_; }
    // Whether allocate() filled this table and free() has not emptied it yet (an empty
    // prompt allocates a table with no blocks). Not thread-safe: the pool's owner.
    [[nodiscard]] bool allocated() const noexcept { return owner_ != nullptr; }
    // Leading prompt tokens whose KV was already in shared blocks at allocate(): prefill
    // starts at this position. A multiple of the block size, less than the prompt's size
    // (0 for an empty prompt). Not thread-safe: the pool's owner.
    [[nodiscard]] std::size_t cached_tokens() const noexcept { return cached_tokens_; }
    // Tokens the blocks can hold: blocks().size() x block size. Not thread-safe: the pool's owner.
    [[nodiscard]] std::size_t capacity_tokens() const noexcept {
      return owner_ == nullptr ? 0 : blocks_.size() * owner_->block_size();
    }
    // The max_tokens of the allocation (KvAllocateOptions), at least the prompt's size.
    // Not thread-safe: the pool's owner.
    [[nodiscard]] std::size_t max_tokens() const noexcept { return max_tokens_; }
    // Tokens the pool knows the engine has written (cached_tokens(), then commit()).
    // Not thread-safe: the pool's owner.
    [[nodiscard]] std::size_t committed_tokens() const noexcept { return committed_tokens_; }
    // Blocks booked by a reserve allocation and not yet taken by grow(). Not thread-safe:
    // the pool's owner.
    [[nodiscard]] std::size_t booked_blocks() const noexcept { return booked_; }

   private:
    friend class KvBlockPool;

    void take(BlockTable& other) noexcept {
      owner_ = std::exchange(other.owner_, nullptr);
      blocks_ = std::move(other.blocks_);
      other.blocks_.clear();
      max_tokens_ = std::exchange(other.max_tokens_, 0);
      cached_tokens_ = std::exchange(other.cached_tokens_, 0);
      committed_tokens_ = std::exchange(other.committed_tokens_, 0);
      indexed_ = std::exchange(other.indexed_, 0);
      booked_ = std::exchange(other.booked_, 0);
    }
    void release() noexcept {
      if (owner_ != nullptr) owner_->free(*this);
    }

    KvBlockPool* owner_ = nullptr;
    std::vector<KvBlockId> blocks_;
    std::size_t max_tokens_ = 0;
    std::size_t cached_tokens_ = 0;
    std::size_t committed_tokens_ = 0;
    std::size_t indexed_ = 0;  // leading blocks in the prefix index (shared hits, then committed)
    std::size_t booked_ = 0;
  };

  // Validates config (std::invalid_argument naming the field), allocates the block state
  // and registers metrics when config.metrics is set (std::invalid_argument for labels the
  // registry refuses). Every block starts free.
  explicit KvBlockPool(KvBlockPoolConfig config, Hasher hasher = Hasher{})
      : config_(validated(std::move(config))),
        hasher_(std::move(hasher)),
        block_size_(config_.block_size),
        total_(config_.total_blocks),
        blocks_(total_),
        tokens_(config_.prefix_caching ? total_ * block_size_ : 0),
        lru_(config_.prefix_caching ? total_ : 0),
        index_(config_.prefix_caching ? total_ : 0) {
    free_.reserve(total_);
    // A stack popped from the back: block 0 is handed out first.
    for (std::size_t b = total_; b-- > 0;) free_.push_back(static_cast<KvBlockId>(b));
    if (config_.metrics != nullptr) register_metrics(*config_.metrics);
  }

  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;
  KvBlockPool(KvBlockPool&&) = delete;
  KvBlockPool& operator=(KvBlockPool&&) = delete;
  // Precondition: every table has been freed or destroyed.
  ~KvBlockPool() { assert(used_blocks_published() == 0); }

  // Tokens per block. Never blocks. Thread-safe.
  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  // Blocks in the pool. Never blocks. Thread-safe.
  [[nodiscard]] std::size_t total_blocks() const noexcept { return total_; }
  // Whether full blocks are indexed and shared. Never blocks. Thread-safe.
  [[nodiscard]] bool prefix_caching() const noexcept { return config_.prefix_caching; }
  // The validated configuration. Thread-safe.
  [[nodiscard]] const KvBlockPoolConfig& config() const noexcept { return config_; }
  // Blocks that hold `tokens` tokens: ceil(tokens / block_size). Never blocks. Thread-safe.
  [[nodiscard]] std::size_t blocks_for(std::size_t tokens) const noexcept {
    return tokens / block_size_ + (tokens % block_size_ != 0 ? 1 : 0);
  }
  // Whether `tokens` tokens fit in the whole pool, empty: a prompt (or, in reserve mode,
  // prompt + max new tokens) for which this is false can never be allocated, so reject it
  // at submit (too_large). Never blocks. Thread-safe.
  [[nodiscard]] bool can_ever_fit(std::size_t tokens) const noexcept {
    return blocks_for(tokens) <= total_;
  }

  // Blocks an allocation may take now: free + cached - booked. Never blocks.
  // Not thread-safe: one owner (stats() reads it from elsewhere).
  [[nodiscard]] std::size_t available_blocks() const noexcept {
    return free_.size() + lru_.size() - booked_;
  }
  // Whether `blocks` new blocks can be taken with watermark_blocks still available after:
  // the plain count, without a prefix lookup (allocate() does the exact check). Never
  // blocks. Not thread-safe: one owner.
  [[nodiscard]] bool can_allocate(std::size_t blocks,
                                  std::size_t watermark_blocks = 0) const noexcept {
    const std::size_t available = available_blocks();
    return blocks <= available && watermark_blocks <= available - blocks;
  }
  // Leading prompt tokens already cached, as allocate() would find them now (a multiple of
  // the block size, less than prompt.size()); 0 without prefix caching. Changes nothing,
  // counts nothing; hashes the prompt's full blocks. Never allocates. Not thread-safe: one
  // owner.
  [[nodiscard]] std::size_t cached_prefix_tokens(std::span<const Token> prompt) const noexcept {
    return match(prompt, [](KvBlockId) {}) * block_size_;
  }

  // Fills an empty table with the blocks for `prompt`: its leading full blocks that are
  // cached (shared: their reference counts go up) and fresh ones for the rest, taking free
  // blocks first and then evicting the least recently released cached ones; with
  // options.reserve, books the blocks for options.max_tokens too. All or nothing:
  //   ok         done; table.cached_tokens() tells prefill where to start
  //   no_room    the blocks (and options.watermark_blocks) are not available now
  //   too_large  the prompt (with reserve: max_tokens) needs more blocks than the pool has
  // Counts the lookup (prefix metrics) only when ok. Allocates the table's storage for
  // max_tokens' blocks (at most total_blocks), once per table. Throws std::invalid_argument
  // if the table already holds blocks or reserve is set without max_tokens, std::bad_alloc;
  // nothing changes then. Not thread-safe: one owner.
  [[nodiscard]] KvAllocStatus allocate(BlockTable& table, std::span<const Token> prompt,
                                       const KvAllocateOptions& options = {}) {
    if (table.owner_ != nullptr)
      detail::throw_invalid_argument("KvBlockPool::allocate: the table already holds blocks");
    const bool bounded = options.max_tokens != std::numeric_limits<std::size_t>::max();
    if (options.reserve && !bounded)
      detail::throw_invalid_argument("KvAllocateOptions: reserve needs max_tokens");
    const std::size_t max_tokens = std::max(options.max_tokens, prompt.size());
    const std::size_t prompt_blocks = blocks_for(prompt.size());
    const std::size_t max_blocks = blocks_for(max_tokens);
    if (prompt_blocks > total_ || (options.reserve && max_blocks > total_))
      return KvAllocStatus::too_large;

    table.blocks_.clear();
    table.blocks_.reserve(bounded ? std::min(max_blocks, total_) : prompt_blocks + 1);

    std::size_t revived = 0;  // cached blocks that the hits take out of the eviction order
    const std::size_t hits = match(prompt, [&](KvBlockId b) {
      table.blocks_.push_back(b);
      if (blocks_[b].refs == 0) ++revived;
    });
    const std::size_t fresh = prompt_blocks - hits;
    const std::size_t book = options.reserve ? max_blocks - prompt_blocks : 0;
    const std::size_t needed = fresh + revived + book;
    const std::size_t available = available_blocks();
    if (needed > available || options.watermark_blocks > available - needed) {
      table.blocks_.clear();
      return KvAllocStatus::no_room;
    }

    for (std::size_t i = 0; i < hits; ++i) {
      const KvBlockId b = table.blocks_[i];
      if (blocks_[b].refs++ == 0) {
        lru_.remove(b);
        publish_held(+1, -1);
      }
    }
    for (std::size_t i = 0; i < fresh; ++i) table.blocks_.push_back(take_block());
    booked_ += book;
    publish_add(booked_published_, book);

    table.owner_ = this;
    table.max_tokens_ = max_tokens;
    table.cached_tokens_ = hits * block_size_;
    table.committed_tokens_ = table.cached_tokens_;
    table.indexed_ = hits;
    table.booked_ = book;
    if (config_.prefix_caching) count_lookup(prompt.size(), table.cached_tokens_);
    return KvAllocStatus::ok;
  }

  // Makes the table hold at least `tokens` tokens (its sequence's length after the next
  // step), appending fresh blocks; in grow mode, call it before each step. Takes a reserve
  // booking first, then available blocks (evicting cached ones as allocate() does).
  //   ok         the table holds `tokens` (at once when it already did)
  //   no_room    not enough available blocks: preempt a sequence (free()) and retry, or
  //              the table's own storage could not grow (only with unlimited max_tokens)
  //   too_large  past the table's max_tokens, more than the pool, or a table this pool
  //              did not allocate
  // All or nothing. Never allocates when max_tokens was given at allocate(). Not
  // thread-safe: one owner.
  [[nodiscard]] KvAllocStatus grow(BlockTable& table, std::size_t tokens) noexcept {
    if (table.owner_ != this) return KvAllocStatus::too_large;
    const std::size_t have = table.blocks_.size();
    const std::size_t want = blocks_for(tokens);
    if (want <= have) return KvAllocStatus::ok;
    if (tokens > table.max_tokens_ || want > total_) return KvAllocStatus::too_large;
    const std::size_t needed = want - have;
    const std::size_t from_booking = std::min(needed, table.booked_);
    if (needed - from_booking > available_blocks()) return KvAllocStatus::no_room;
    if (table.blocks_.capacity() < want && !reserve_storage(table.blocks_, want))
      return KvAllocStatus::no_room;
    table.booked_ -= from_booking;
    booked_ -= from_booking;
    publish_sub(booked_published_, from_booking);
    for (std::size_t i = 0; i < needed; ++i) table.blocks_.push_back(take_block());
    return KvAllocStatus::ok;
  }

  // Tells the pool that the engine has written the KV of `tokens`: the sequence's tokens
  // from position 0 (prompt, then generated; the last generated token is written by the
  // step that feeds it back). Every block these fill completely is indexed, so that later
  // sequences with the same prefix share it; a block is indexed once, on the commit that
  // fills it. Call it after each step (only the growth since the last call is hashed).
  // Tokens past the table's capacity are ignored; a table this pool did not allocate is
  // left alone. Precondition: the first cached_tokens() of `tokens` are the prompt given to
  // allocate(). Never allocates. Not thread-safe: one owner.
  void commit(BlockTable& table, std::span<const Token> tokens) noexcept {
    if (table.owner_ != this) return;
    const std::size_t written = std::min(tokens.size(), table.blocks_.size() * block_size_);
    table.committed_tokens_ = std::max(table.committed_tokens_, written);
    if (!config_.prefix_caching) return;
    const std::size_t full = written / block_size_;
    for (std::size_t i = table.indexed_; i < full; ++i) {
      const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
      const Block* parent = i == 0 ? nullptr : &blocks_[table.blocks_[i - 1]];
      const std::uint64_t parent_content = parent == nullptr ? 0 : parent->content;
      const std::uint64_t key = hasher_(parent == nullptr ? 0 : parent->hash, block_tokens);
      // Another block may hold the same content already (two sequences prefilled the same
      // prefix before either was indexed): both are indexed, under one content id, so that
      // children of either match through both. Block ids never change under a sequence.
      const KvBlockId twin = index_.find_if(key, same_content(parent_content, block_tokens));
      const KvBlockId b = table.blocks_[i];
      Block& block = blocks_[b];
      assert(block.content == 0 && block.refs == 1);
      block.hash = key;
      block.parent = parent_content;
      block.content = twin != detail::kv::no_block ? blocks_[twin].content : next_content_++;
      std::copy(block_tokens.begin(), block_tokens.end(),
                tokens_.data() + std::size_t{b} * block_size_);
      index_.insert(key, b);
    }
    table.indexed_ = std::max(table.indexed_, full);
  }

  // Releases every block of the table and its booking; the table is empty afterwards (its
  // storage is kept for the next allocate()). A block no other table references becomes
  // cached if it is indexed (last block first in the eviction order) and free otherwise.
  // This is preemption too: a preempted sequence's committed blocks stay cached, so its
  // recompute may find them. No-op on an empty table; a table of another pool is freed
  // there. Never allocates. Not thread-safe: one owner.
  void free(BlockTable& table) noexcept {
    if (table.owner_ == nullptr) return;
    if (table.owner_ != this) {
      table.owner_->free(table);
      return;
    }
    for (auto it = table.blocks_.rbegin(); it != table.blocks_.rend(); ++it) release_block(*it);
    booked_ -= table.booked_;
    publish_sub(booked_published_, table.booked_);
    table.blocks_.clear();
    table.owner_ = nullptr;
    table.max_tokens_ = table.cached_tokens_ = table.committed_tokens_ = 0;
    table.indexed_ = table.booked_ = 0;
  }

  // The pool's counts and counters (KvBlockPoolStats). Never blocks, never allocates.
  // Thread-safe.
  [[nodiscard]] KvBlockPoolStats stats() const noexcept {
    KvBlockPoolStats s;
    s.total_blocks = total_;
    const std::uint64_t held = held_.load(std::memory_order_relaxed);  // one word: one moment
    s.used_blocks = static_cast<std::size_t>(held >> 32);
    s.cached_blocks = static_cast<std::size_t>(held & 0xffff'ffffU);
    const std::size_t taken = s.used_blocks + s.cached_blocks;
    s.free_blocks = taken < total_ ? total_ - taken : 0;
    s.reserved_blocks = booked_published_.load(std::memory_order_relaxed);
    s.prefix_lookups = lookups_.load(std::memory_order_relaxed);
    s.prefix_query_tokens = query_tokens_.load(std::memory_order_relaxed);
    s.prefix_hit_tokens = hit_tokens_.load(std::memory_order_relaxed);
    s.evictions = evictions_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  struct Block {
    std::uint64_t hash = 0;     // its key, while indexed
    std::uint64_t content = 0;  // equal for blocks with equal prefixes, while indexed; 0: not
    std::uint64_t parent = 0;   // the content id of the block before it (0: the first block)
    std::uint32_t refs = 0;     // tables holding it
  };

  static KvBlockPoolConfig validated(KvBlockPoolConfig c) {
    if (c.block_size < 1) detail::throw_invalid_argument("KvBlockPool: block_size must be >= 1");
    if (c.total_blocks < 1)
      detail::throw_invalid_argument("KvBlockPool: total_blocks must be >= 1");
    if (c.total_blocks >= detail::kv::no_block)
      detail::throw_invalid_argument(
          "KvBlockPool: total_blocks must be < 2^32 - 1 (block ids are 32-bit)");
    if (c.prefix_caching && c.block_size > std::numeric_limits<std::size_t>::max() / c.total_blocks)
      detail::throw_invalid_argument(
          "KvBlockPool: total_blocks * block_size must fit in std::size_t");
    return c;
  }

  // The leading full blocks of prompt that are indexed, calling on_hit(block) for each in
  // order; the prompt's last token is never covered. Returns how many.
  template <class OnHit>
  std::size_t match(std::span<const Token> prompt, OnHit&& on_hit) const noexcept {
    if (!config_.prefix_caching || prompt.empty()) return 0;
    const std::size_t limit = (prompt.size() - 1) / block_size_;
    std::uint64_t parent_hash = 0;
    std::uint64_t parent_content = 0;
    std::size_t i = 0;
    for (; i < limit; ++i) {
      const auto block_tokens = prompt.subspan(i * block_size_, block_size_);
      const std::uint64_t key = hasher_(parent_hash, block_tokens);
      const KvBlockId b = index_.find_if(key, same_content(parent_content, block_tokens));
      if (b == detail::kv::no_block) break;
      on_hit(b);
      parent_hash = key;
      parent_content = blocks_[b].content;
    }
    return i;
  }

  // The check behind every hash match: the same parent content and the same tokens.
  auto same_content(std::uint64_t parent_content,
                    std::span<const Token> block_tokens) const noexcept {
    return [this, parent_content, block_tokens](KvBlockId b) noexcept {
      return blocks_[b].parent == parent_content &&
             std::equal(block_tokens.begin(), block_tokens.end(),
                        tokens_.data() + std::size_t{b} * block_size_);
    };
  }

  // One block for a table: a free one, else the least recently released cached one, whose
  // content is dropped. Precondition: available_blocks() > 0 before bookings are counted.
  KvBlockId take_block() noexcept {
    KvBlockId b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = lru_.pop_front();
      publish_held(0, -1);
      index_.erase(blocks_[b].hash, b);
      blocks_[b].content = 0;
      publish_add(evictions_, 1);
      if (evictions_counter_ != nullptr) evictions_counter_->inc();
    }
    blocks_[b].refs = 1;
    publish_held(+1, 0);
    return b;
  }

  void release_block(KvBlockId b) noexcept {
    Block& block = blocks_[b];
    if (--block.refs != 0) return;
    if (block.content != 0) {
      lru_.push_back(b);
      publish_held(-1, +1);
    } else {
      free_.push_back(b);
      publish_held(-1, 0);
    }
  }

  static bool reserve_storage(std::vector<KvBlockId>& v, std::size_t blocks) noexcept {
    return !detail::call_guarded([&] { v.reserve(std::max(blocks, 2 * v.capacity())); },
                                 [](const char*) {});
  }

  void count_lookup(std::size_t query_tokens, std::size_t hit_tokens) noexcept {
    publish_add(lookups_, 1);
    publish_add(query_tokens_, query_tokens);
    publish_add(hit_tokens_, hit_tokens);
    if (queries_counter_ != nullptr) {
      queries_counter_->inc(query_tokens);
      hits_counter_->inc(hit_tokens);
    }
  }

  // The owner is the only writer: a load and a store, no read-modify-write.
  template <class T>
  static void publish_add(std::atomic<T>& a, std::size_t n) noexcept {
    a.store(a.load(std::memory_order_relaxed) + static_cast<T>(n), std::memory_order_relaxed);
  }
  // Used and cached blocks change together (a cached block revived, a used one released to
  // the cache): one word holds both (used in the high half, cached in the low; counts are
  // below 2^32), so a reader never pairs a count from before a move with one from after it.
  void publish_held(std::int64_t used_delta, std::int64_t cached_delta) noexcept {
    const std::uint64_t held = held_.load(std::memory_order_relaxed);
    const std::uint64_t used = (held >> 32) + static_cast<std::uint64_t>(used_delta);
    const std::uint64_t cached = (held & 0xffff'ffffU) + static_cast<std::uint64_t>(cached_delta);
    held_.store(used << 32 | (cached & 0xffff'ffffU), std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t used_blocks_published() const noexcept {
    return static_cast<std::size_t>(held_.load(std::memory_order_relaxed) >> 32);
  }

  template <class T>
  static void publish_sub(std::atomic<T>& a, std::size_t n) noexcept {
    a.store(a.load(std::memory_order_relaxed) - static_cast<T>(n), std::memory_order_relaxed);
  }

  void register_metrics(MetricsRegistry& r) {
    const Labels& base = config_.metric_labels;
    const auto gauge = [&](const char* name, const char* help, const std::atomic<std::size_t>* v) {
      gauges_.push_back(r.gauge_callback(name, help, base, [v] {
        return static_cast<double>(v->load(std::memory_order_relaxed));
      }));
    };
    gauges_.push_back(r.gauge_callback("tailbatch_kv_blocks_capacity",
                                       "Blocks in the KV block pool", base,
                                       [n = total_] { return static_cast<double>(n); }));
    gauges_.push_back(r.gauge_callback(
        "tailbatch_kv_blocks_used", "KV blocks referenced by at least one sequence", base,
        [this] { return static_cast<double>(used_blocks_published()); }));
    gauges_.push_back(r.gauge_callback(
        "tailbatch_kv_blocks_cached",
        "KV blocks holding a reusable prefix that no sequence references (evictable)", base,
        [this] {
          return static_cast<double>(held_.load(std::memory_order_relaxed) & 0xffff'ffffU);
        }));
    gauge("tailbatch_kv_blocks_reserved",
          "KV blocks booked by reserve-mode allocations and not yet taken", &booked_published_);
    queries_counter_ = &r.counter("tailbatch_kv_prefix_cache_queries_total",
                                  "Prompt tokens looked up in the KV prefix cache", base);
    hits_counter_ =
        &r.counter("tailbatch_kv_prefix_cache_hits_total",
                   "Prompt tokens found in the KV prefix cache (prefill skips them)", base);
    evictions_counter_ =
        &r.counter("tailbatch_kv_evictions_total", "Cached KV blocks evicted to make room", base);
  }

  KvBlockPoolConfig config_;
  [[no_unique_address]] Hasher hasher_;
  std::size_t block_size_;
  std::size_t total_;
  std::vector<Block> blocks_;
  std::vector<Token> tokens_;  // block b's tokens at [b·block_size, (b+1)·block_size) while indexed
  std::vector<KvBlockId> free_;    // empty blocks, a stack
  detail::kv::LruList lru_;        // cached blocks, least recently released first
  detail::kv::PrefixIndex index_;  // key -> indexed blocks
  std::uint64_t next_content_ = 1;
  std::size_t booked_ = 0;

  // Published for stats() and the metrics; written by the owner only.
  std::atomic<std::uint64_t> held_{0};  // used << 32 | cached (publish_held)
  std::atomic<std::size_t> booked_published_{0};
  std::atomic<std::uint64_t> lookups_{0};
  std::atomic<std::uint64_t> query_tokens_{0};
  std::atomic<std::uint64_t> hit_tokens_{0};
  std::atomic<std::uint64_t> evictions_{0};
  Counter* queries_counter_ = nullptr;
  Counter* hits_counter_ = nullptr;
  Counter* evictions_counter_ = nullptr;
  std::vector<CallbackRegistration> gauges_;  // last: unregistered before the atomics go
};

}  // namespace tailbatch
