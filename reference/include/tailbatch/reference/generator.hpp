// The reference generator: a tiny autoregressive model for ContinuousBatcher's tests,
// benchmark and demo (CPU twin; the CUDA kernels are in tailbatch/reference/cuda/generator_kernels.cuh).
//
// Per token: embedding row -> dense + softsign (the token's input projection) -> a
// recurrent state update h = decay * h + (1 - decay) * u; per emitted token: dense +
// softsign of h -> logits over the vocabulary -> greedy or seeded sampling. Like a
// transformer, the prompt's tokens are projected together (they fill the rows of one
// matrix product) and only the last one needs logits. At the default size one decode step
// reads 6 MiB of weights, more than a core's L2 cache. The dense layers compute rows in
// groups of 16 lanes (one AVX-512 register, as a GPU warp computes its threads): each
// weight is loaded once per group and used by all 16 lanes, so a step over 1 to 16
// sequences costs the same (about the time it takes to stream the weights once: 6 MiB in
// ~0.35 ms on the development machine) and 16 sequences cost far less than 16 steps over
// one. Past 16, each further group of 16 adds a pass over the weights.
//
// The weights are a pure function of the seed (splitmix64 counters, no std::
// distributions). Sampling uses each sequence's own splitmix64 stream, seeded per request.
//
// Batch invariance: a sequence's tokens and logits are bit-identical whether it runs alone
// or in any batch, at any row, with its prompt fed whole or in chunks, on every CPU kernel
// (see detail/generator_cpu.hpp for the fixed reduction order; the CPU tests check it).
// The CUDA kernels are designed to compute the same logits in the same order, and did on
// an NVIDIA H200 (the only GPU tried).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/kv_block_pool.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/detail/generator_cpu.hpp>
#include <vector>

namespace tailbatch::reference {

struct GeneratorConfig {
  // Every weight is a function of the seed.
  std::uint64_t seed = 20240611;
  // Tokens 0 .. vocab_size-1; a multiple of 32 and >= 32. Token 0 is the start token fed
  // to a sequence with an empty prompt.
  std::uint32_t vocab_size = 2048;
  // Width of the state; a multiple of 32 and >= 32.
  std::uint32_t hidden_dim = 512;
  // 0: greedy (argmax, the lowest token on a tie). > 0: sample from softmax(logits / T)
  // with the sequence's own stream. Must be >= 0 and finite.
  float temperature = 0.0f;
  // A token that ends its sequence (ContinuousBatcher: seq.finish()); -1: none, sequences
  // run to their max_new_tokens.
  std::int32_t eos_token = -1;
  CpuKernel cpu_kernel = CpuKernel::automatic;
};

// One sequence's model state. Default-constructed: zero state, sampling stream 0, next
// input the start token.
struct GeneratorState {
  std::vector<float> hidden;      // hidden_dim floats once used
  std::uint64_t rng = 0;          // splitmix64 counter of the sampling stream
  std::int32_t next_input = 0;    // the token a decode step feeds: the last one emitted
};

// The generator's KV cache, in the blocks of a KvBlockPool (kv_block_pool.hpp,
// docs/kv-cache.md). This model's per-token cache entry is its state after the token (the
// recurrence's whole summary of the prefix, hidden_dim floats), where a transformer's is
// the token's keys and values: token t of a sequence is cached in slot
// (block_table[t / block_size], t % block_size). A sequence admitted with cached prompt
// tokens reads the state after the last of them from its shared block and computes only
// the rest; one recomputed after a preemption starts from there too. Allocates
// total_blocks x block_size x hidden_dim floats at construction. Not thread-safe: written
// by the step that owns the blocks.
class GeneratorKvStore {
 public:
  // Throws std::invalid_argument unless every size is >= 1; std::bad_alloc.
  GeneratorKvStore(std::size_t total_blocks, std::size_t block_size, std::size_t hidden_dim)
      : blocks_(total_blocks), block_size_(block_size), hidden_(hidden_dim) {
    if (total_blocks < 1)
      tailbatch::detail::throw_invalid_argument("GeneratorKvStore: total_blocks must be >= 1");
    if (block_size < 1)
      tailbatch::detail::throw_invalid_argument("GeneratorKvStore: block_size must be >= 1");
    if (hidden_dim < 1)
      tailbatch::detail::throw_invalid_argument("GeneratorKvStore: hidden_dim must be >= 1");
    data_.assign(total_blocks * block_size * hidden_dim, 0.0f);
  }

  [[nodiscard]] std::size_t total_blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::size_t block_size() const noexcept { return block_size_; }
  [[nodiscard]] std::size_t hidden_dim() const noexcept { return hidden_; }
  // The slot of token `position` of a sequence with this block table: hidden_dim floats.
  // Throws std::invalid_argument if the table does not reach the position or names a block
  // outside the store.
  [[nodiscard]] float* slot(std::span<const KvBlockId> table, std::size_t position) {
    const std::size_t i = position / block_size_;
    if (i >= table.size())
      tailbatch::detail::throw_invalid_argument(
          "GeneratorKvStore: position " + std::to_string(position) + " is past the block table");
    if (table[i] >= blocks_)
      tailbatch::detail::throw_invalid_argument("GeneratorKvStore: block id outside the store");
    return data_.data() + (std::size_t{table[i]} * block_size_ + position % block_size_) * hidden_;
  }

 private:
  std::size_t blocks_, block_size_, hidden_;
  std::vector<float> data_;
};

// One sequence's work in one step: feed these tokens in order, then (if emit) compute the
// logits and sample the next token.
struct GeneratorLane {
  GeneratorState* state = nullptr;
  std::span<const std::int32_t> feed;
  bool emit = true;
  std::int32_t token = -1;  // out: the sampled token when emit
  // Optional KV cache: with kv set, the state after each fed token is stored at its
  // position (feed[j] at position + j) in `blocks`; with restore, the state is first read
  // from the slot of position - 1 (zero at position 0), so that tokens before `position`
  // are never computed again.
  GeneratorKvStore* kv = nullptr;
  std::span<const KvBlockId> blocks{};
  std::size_t position = 0;
  bool restore = false;
};

// A ContinuousBatcher's step through GeneratorLanes, shared by Generator::step_sequences
// and its CUDA twin: points lanes[i] at batch[i] (its state, whether it emits, its input:
// the token sampled last while decoding, else its next prefill chunk), calls
// step(lanes), then emits each sampled token and finishes a sequence that sampled `eos`.
// Allocates only to grow `lanes`. Not thread-safe: one step at a time.
//
// With a KV store (a ContinuousBatcher with a KV pool), each lane also gets the sequence's
// block table and position, and the first prefill chunk restores the state cached after
// seq.cached_tokens() tokens (zero when none): prefill skips the cached prefix, and a
// recompute after a preemption starts over from the cache instead of from a stale state.
template <class Sequence, class Step>
void step_sequences_through_lanes(std::span<Sequence> batch, std::vector<GeneratorLane>& lanes,
                                  std::int32_t eos, Step&& step, GeneratorKvStore* kv = nullptr) {
  lanes.resize(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto& seq = batch[i];
    auto& lane = lanes[i];
    lane.state = &seq.state();
    lane.emit = seq.emits();
    if (seq.decoding()) {
      lane.feed = std::span<const std::int32_t>(&seq.state().next_input, 1);
    } else {
      lane.feed = seq.prefill_chunk();
    }
    lane.kv = kv;
    if (kv != nullptr) {
      lane.blocks = seq.block_table();
      lane.position = seq.position();
      lane.restore = !seq.decoding() && seq.prefilled() == seq.cached_tokens();
    }
  }
  step(std::span<GeneratorLane>(lanes));
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!lanes[i].emit) continue;
    batch[i].emit(lanes[i].token);
    if (lanes[i].token == eos) batch[i].finish();
  }
}

// Read-only views of the weights, for copying them to a device. Layouts (row-major):
//   embeddings               [vocab_size][hidden_dim]
//   w_in, w_out              [hidden_dim (output)][hidden_dim (input)]
//   w_vocab                  [vocab_size (output)][hidden_dim (input)]
//   b_in, b_out, decay, keep [hidden_dim]   (keep = 1 - decay, rounded once)
struct GeneratorWeights {
  std::uint32_t vocab_size = 0;
  std::uint32_t hidden_dim = 0;
  std::span<const float> embeddings;
  std::span<const float> w_in;
  std::span<const float> b_in;
  std::span<const float> decay;
  std::span<const float> keep;
  std::span<const float> w_out;
  std::span<const float> b_out;
  std::span<const float> w_vocab;
};

// Output lengths for benchmarks: uniform integers in [min, max] from a seeded splitmix64
// stream. Not thread-safe: one per thread.
class OutputLengths {
 public:
  // Throws std::invalid_argument unless 1 <= min <= max.
  OutputLengths(std::size_t min, std::size_t max, std::uint64_t seed) : min_(min), max_(max), state_(seed) {
    if (min < 1) tailbatch::detail::throw_invalid_argument("OutputLengths: min must be >= 1");
    if (max < min) tailbatch::detail::throw_invalid_argument("OutputLengths: max must be >= min");
  }

  // The next length. Never allocates.
  [[nodiscard]] std::size_t next() noexcept {
    const std::uint64_t span = max_ - min_ + 1;
    // The modulo's bias is below span / 2^64: invisible at any benchmark's sample size.
    return min_ + static_cast<std::size_t>(detail::splitmix64(state_++) % span);
  }

  // The exact expected mean, (min + max) / 2. Thread-safe.
  [[nodiscard]] double expected_mean() const noexcept { return (static_cast<double>(min_) + static_cast<double>(max_)) / 2.0; }

  // The exact expected longest of `batch` independent lengths:
  // E[max] = min + sum_{k=min+1}^{max} (1 - ((k - min) / n)^batch), n = max - min + 1.
  // Thread-safe.
  [[nodiscard]] double expected_longest(std::size_t batch) const noexcept {
    const double n = static_cast<double>(max_ - min_ + 1);
    double e = static_cast<double>(min_);
    for (std::size_t k = min_ + 1; k <= max_; ++k) {
      e += 1.0 - std::pow(static_cast<double>(k - min_) / n, static_cast<double>(batch));
    }
    return e;
  }

 private:
  std::size_t min_, max_;
  std::uint64_t state_;
};

// Scratch memory for Generator::step. Reused across calls, it grows to the largest step
// seen and then stops allocating. Not thread-safe: one per thread.
class GeneratorWorkspace {
 public:
  GeneratorWorkspace() = default;

 private:
  friend class Generator;
  std::vector<float> xt_, yt_, u_, z_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::size_t> emitting_;
};

// The model. Construction builds the weights (allocates, a few ms); step() runs one decode
// step over a batch. Copies share the weights.
//
// Thread-safety: step() with an explicit workspace is thread-safe (the weights are
// read-only); step() without one uses the generator's own workspace: not thread-safe, one
// step at a time per Generator object (copies may step concurrently).
// Exceptions: the constructor throws std::invalid_argument naming a bad config field, and
// std::bad_alloc; step() throws std::invalid_argument for a token outside the vocabulary
// or a null state, and std::bad_alloc while its workspace grows.
class Generator {
 public:
  explicit Generator(GeneratorConfig config = {}) : config_(validated(config)), weights_(build(config_)) {
    kernel_ = resolve(config_.cpu_kernel);
  }

  // A fresh state whose sampling stream is seeded by sampling_seed. Allocates.
  // Thread-safe.
  [[nodiscard]] GeneratorState new_state(std::uint64_t sampling_seed = 0) const {
    GeneratorState s;
    s.hidden.assign(config_.hidden_dim, 0.0f);
    s.rng = detail::splitmix64(sampling_seed ^ 0x6a09e667f3bcc909ULL);
    return s;
  }

  // One step over a batch: for each lane, feeds its tokens in order into its state, then,
  // if lane.emit, computes its logits and samples lane.token (and sets
  // state->next_input to it). logits_out, if not empty, receives the logits of the
  // emitting lanes in lane order ([emitting][vocab_size]; it must hold that many).
  // Thread-safe with a workspace per thread.
  void step(std::span<GeneratorLane> lanes, GeneratorWorkspace& ws, std::span<float> logits_out = {}) const {
    constexpr std::size_t G = detail::gen_group;
    const std::size_t H = config_.hidden_dim;
    const std::size_t V = config_.vocab_size;
    std::size_t fed = 0;
    ws.emitting_.clear();
    for (std::size_t i = 0; i < lanes.size(); ++i) {
      auto& lane = lanes[i];
      if (!lane.state) tailbatch::detail::throw_invalid_argument("Generator::step: lane without a state");
      if (lane.kv != nullptr) {
        if (lane.kv->hidden_dim() != H)
          tailbatch::detail::throw_invalid_argument(
              "Generator::step: the KV store's hidden_dim differs");
        // Checked before anything changes: every slot this lane reads or writes exists.
        if (lane.restore && lane.position > 0) (void)lane.kv->slot(lane.blocks, lane.position - 1);
        if (!lane.feed.empty())
          (void)lane.kv->slot(lane.blocks, lane.position + lane.feed.size() - 1);
      }
      if (lane.state->hidden.size() != H) lane.state->hidden.assign(H, 0.0f);
      for (std::int32_t t : lane.feed) check_token(t);
      fed += lane.feed.size();
      if (lane.emit) ws.emitting_.push_back(i);
    }
    if (!logits_out.empty() && logits_out.size() < ws.emitting_.size() * V)
      tailbatch::detail::throw_invalid_argument("Generator::step: logits_out is too small");
    grow(ws.xt_, H * G);
    grow(ws.yt_, (H > V ? H : V) * G);
    grow(ws.u_, fed * H);
    grow(ws.z_, V);

    // 1. Input projections of every fed token, all lanes together, 16 tokens per group.
    ws.tokens_.clear();
    for (auto& lane : lanes) ws.tokens_.insert(ws.tokens_.end(), lane.feed.begin(), lane.feed.end());
    for (std::size_t g0 = 0; g0 < fed; g0 += G) {
      const std::size_t n = fed - g0 < G ? fed - g0 : G;
      std::fill(ws.xt_.begin(), ws.xt_.begin() + static_cast<std::ptrdiff_t>(H * G), 0.0f);
      for (std::size_t l = 0; l < n; ++l) {
        const float* e = weights_->embeddings.data() + static_cast<std::size_t>(ws.tokens_[g0 + l]) * H;
        for (std::size_t k = 0; k < H; ++k) ws.xt_[k * G + l] = e[k];
      }
      dense(ws.xt_.data(), H, weights_->w_in.data(), weights_->b_in.data(), H, ws.yt_.data(),
            detail::GenActivation::softsign);
      for (std::size_t l = 0; l < n; ++l) {
        float* u = ws.u_.data() + (g0 + l) * H;
        for (std::size_t k = 0; k < H; ++k) u[k] = ws.yt_[k * G + l];
      }
    }

    // 2. Each lane's recurrence over its own tokens, in order (through its KV cache, if
    //    it has one: restored before, stored after each token).
    std::size_t row = 0;
    for (auto& lane : lanes) {
      if (lane.kv != nullptr && lane.restore) {
        if (lane.position == 0) {
          std::fill(lane.state->hidden.begin(), lane.state->hidden.end(), 0.0f);
        } else {
          const float* cached = lane.kv->slot(lane.blocks, lane.position - 1);
          std::copy_n(cached, H, lane.state->hidden.data());
        }
      }
      for (std::size_t j = 0; j < lane.feed.size(); ++j, ++row) {
        detail::gen_blend(lane.state->hidden.data(), weights_->decay.data(), weights_->keep.data(),
                          ws.u_.data() + row * H, H);
        if (lane.kv != nullptr)
          std::copy_n(lane.state->hidden.data(), H, lane.kv->slot(lane.blocks, lane.position + j));
      }
    }

    // 3. Logits of the emitting lanes, 16 per group, then sampling.
    const std::size_t S = ws.emitting_.size();
    for (std::size_t g0 = 0; g0 < S; g0 += G) {
      const std::size_t n = S - g0 < G ? S - g0 : G;
      std::fill(ws.xt_.begin(), ws.xt_.begin() + static_cast<std::ptrdiff_t>(H * G), 0.0f);
      for (std::size_t l = 0; l < n; ++l) {
        const float* h = lanes[ws.emitting_[g0 + l]].state->hidden.data();
        for (std::size_t k = 0; k < H; ++k) ws.xt_[k * G + l] = h[k];
      }
      dense(ws.xt_.data(), H, weights_->w_out.data(), weights_->b_out.data(), H, ws.yt_.data(),
            detail::GenActivation::softsign);
      std::copy(ws.yt_.begin(), ws.yt_.begin() + static_cast<std::ptrdiff_t>(H * G), ws.xt_.begin());
      dense(ws.xt_.data(), H, weights_->w_vocab.data(), nullptr, V, ws.yt_.data(), detail::GenActivation::none);
      if (config_.temperature == 0.0f) {
        // Greedy: the argmax of all lanes at once, reading the logits in their [v][16]
        // layout (the same first-maximum rule as sample()).
        float best[G];
        std::int32_t arg[G] = {};
        for (std::size_t l = 0; l < G; ++l) best[l] = ws.yt_[l];
        for (std::size_t v = 1; v < V; ++v) {
          const float* z = ws.yt_.data() + v * G;
          for (std::size_t l = 0; l < G; ++l) {
            const bool more = z[l] > best[l];
            best[l] = more ? z[l] : best[l];
            arg[l] = more ? static_cast<std::int32_t>(v) : arg[l];
          }
        }
        for (std::size_t l = 0; l < n; ++l) {
          auto& lane = lanes[ws.emitting_[g0 + l]];
          lane.token = arg[l];
          lane.state->next_input = lane.token;
        }
      }
      for (std::size_t l = 0; l < n; ++l) {
        auto& lane = lanes[ws.emitting_[g0 + l]];
        if (config_.temperature == 0.0f && logits_out.empty()) continue;
        for (std::size_t v = 0; v < V; ++v) ws.z_[v] = ws.yt_[v * G + l];
        if (config_.temperature != 0.0f) {
          lane.token = sample(std::span<const float>(ws.z_.data(), V), *lane.state);
          lane.state->next_input = lane.token;
        }
        if (!logits_out.empty()) std::copy_n(ws.z_.data(), V, logits_out.data() + (g0 + l) * V);
      }
    }
  }

  // step() with the generator's own workspace. Not thread-safe: one step at a time.
  void step(std::span<GeneratorLane> lanes, std::span<float> logits_out = {}) {
    step(lanes, own_, logits_out);
  }

  // The step function for a ContinuousBatcher<std::int32_t, GeneratorState>: prefill
  // chunks and decode tokens of the whole batch in one step(); emits each sampled token
  // and finishes a sequence at eos_token. Not thread-safe: one step at a time.
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch) {
    step_sequences_through_lanes(batch, lanes_, config_.eos_token,
                                 [this](std::span<GeneratorLane> lanes) { step(lanes); });
  }

  // The same, for a ContinuousBatcher with a KV pool (ContinuousBatcherConfig::kv): the
  // sequences' KV lives in `kv`, in their blocks (GeneratorKvStore), so prefill skips
  // cached prompt tokens and a preempted sequence is recomputed from its blocks. kv must
  // have the pool's block size and block count and this model's hidden_dim. Not
  // thread-safe: one step at a time.
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch, GeneratorKvStore& kv) {
    step_sequences_through_lanes(
        batch, lanes_, config_.eos_token, [this](std::span<GeneratorLane> lanes) { step(lanes); },
        &kv);
  }

  // Generates max_new_tokens after prompt for one sequence, alone, one step per token.
  // Allocates. Not thread-safe: one step at a time.
  [[nodiscard]] std::vector<std::int32_t> generate(std::span<const std::int32_t> prompt, std::size_t max_new_tokens,
                                                   GeneratorState state) {
    std::vector<std::int32_t> out;
    if (max_new_tokens == 0) return out;
    GeneratorLane lane;
    lane.state = &state;
    lane.feed = prompt.empty() ? std::span<const std::int32_t>(&state.next_input, 1) : prompt;
    while (out.size() < max_new_tokens) {
      step(std::span<GeneratorLane>(&lane, 1));
      out.push_back(lane.token);
      if (lane.token == config_.eos_token) break;
      lane.feed = std::span<const std::int32_t>(&state.next_input, 1);
    }
    return out;
  }

  // Bytes of weights one decode step reads (projections and vocabulary matrix; embedding
  // rows are gathered per token). Thread-safe.
  [[nodiscard]] std::size_t weight_bytes_per_step() const noexcept {
    const std::size_t H = config_.hidden_dim;
    return (2 * H * H + H * config_.vocab_size) * sizeof(float);
  }

  // Read-only views of the weights (layouts: see GeneratorWeights), valid while this
  // generator or a copy lives. Thread-safe.
  [[nodiscard]] GeneratorWeights weights() const noexcept {
    return {config_.vocab_size, config_.hidden_dim, weights_->embeddings.span(), weights_->w_in.span(),
            weights_->b_in.span(),     weights_->decay.span(),      weights_->keep.span(),
            weights_->w_out.span(),    weights_->b_out.span(),      weights_->w_vocab.span()};
  }
  // The validated configuration. Thread-safe.
  [[nodiscard]] const GeneratorConfig& config() const noexcept { return config_; }
  // The CPU kernel in use (automatic resolved). Thread-safe.
  [[nodiscard]] CpuKernel kernel() const noexcept { return kernel_; }

  // Samples a token from logits with the state's stream: argmax when temperature is 0,
  // else the first token whose cumulative softmax mass (in double, in token order) exceeds
  // a uniform draw. Advances state.rng only when sampling. Thread-safe.
  [[nodiscard]] std::int32_t sample(std::span<const float> logits, GeneratorState& state) const noexcept {
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i) best = logits[i] > logits[best] ? i : best;
    if (config_.temperature == 0.0f) return static_cast<std::int32_t>(best);
    const double inv_t = 1.0 / static_cast<double>(config_.temperature);
    const double top = logits[best];
    double total = 0.0;
    for (float z : logits) total += std::exp((static_cast<double>(z) - top) * inv_t);
    const double u = static_cast<double>(detail::splitmix64(state.rng++) >> 11) * 0x1.0p-53 * total;
    double cum = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      cum += std::exp((static_cast<double>(logits[i]) - top) * inv_t);
      if (cum > u) return static_cast<std::int32_t>(i);
    }
    return static_cast<std::int32_t>(best);
  }

 private:
  struct Weights {
    detail::AlignedFloats embeddings, w_in, b_in, decay, keep, w_out, b_out, w_vocab;
  };

  static GeneratorConfig validated(GeneratorConfig c) {
    if (c.vocab_size < 32 || c.vocab_size % 32 != 0)
      tailbatch::detail::throw_invalid_argument("GeneratorConfig: vocab_size must be a multiple of 32 and >= 32");
    if (c.hidden_dim < 32 || c.hidden_dim % 32 != 0)
      tailbatch::detail::throw_invalid_argument("GeneratorConfig: hidden_dim must be a multiple of 32 and >= 32");
    if (!(c.temperature >= 0.0f) || !std::isfinite(c.temperature))
      tailbatch::detail::throw_invalid_argument("GeneratorConfig: temperature must be finite and >= 0");
    if (c.eos_token < -1 || c.eos_token >= static_cast<std::int32_t>(c.vocab_size))
      tailbatch::detail::throw_invalid_argument("GeneratorConfig: eos_token must be -1 or a token below vocab_size");
    if (!cpu_kernel_supported(c.cpu_kernel))
      tailbatch::detail::throw_invalid_argument("GeneratorConfig: cpu_kernel " + std::string(to_string(c.cpu_kernel)) +
                                  " is not supported by this CPU or build");
    return c;
  }

  static CpuKernel resolve(CpuKernel k) noexcept {
    if (k != CpuKernel::automatic) return k;
    if (detail::cpu_has_avx512()) return CpuKernel::avx512;
    if (detail::cpu_has_avx2()) return CpuKernel::avx2;
    return CpuKernel::portable;
  }

  // An out x in matrix (output-major), uniform in [-scale, scale).
  static detail::AlignedFloats matrix(std::uint64_t seed, std::uint64_t stream, std::size_t in, std::size_t out,
                                      float scale) {
    detail::AlignedFloats w(in * out);
    const detail::UniformStream u(seed, stream);
    for (std::size_t i = 0; i < in * out; ++i) w[i] = u(i) * scale;
    return w;
  }

  static std::shared_ptr<const Weights> build(const GeneratorConfig& c) {
    const std::size_t H = c.hidden_dim;
    const std::size_t V = c.vocab_size;
    auto w = std::make_shared<Weights>();
    const detail::UniformStream emb(c.seed, 101);
    w->embeddings = detail::AlignedFloats(V * H);
    for (std::size_t i = 0; i < V * H; ++i) w->embeddings[i] = emb(i);
    // Gains chosen so that the projections neither vanish nor saturate: softsign inputs
    // of order 1, logits spread over a few units so that sampling has real choices.
    const float s = std::sqrt(3.0f / static_cast<float>(H));
    w->w_in = matrix(c.seed, 102, H, H, 2.0f * s);
    w->w_out = matrix(c.seed, 103, H, H, 4.0f * s);
    w->w_vocab = matrix(c.seed, 104, H, V, 6.0f * s);
    const detail::UniformStream bias(c.seed, 105);
    w->b_in = detail::AlignedFloats(H);
    w->b_out = detail::AlignedFloats(H);
    w->decay = detail::AlignedFloats(H);
    w->keep = detail::AlignedFloats(H);
    for (std::size_t i = 0; i < H; ++i) {
      w->b_in[i] = 0.1f * bias(i);
      w->b_out[i] = 0.1f * bias(H + i);
      // Decays in [0.5, 0.95]: some units remember the last token, some the last dozens.
      w->decay[i] = 0.725f + 0.225f * bias(2 * H + i);
      w->keep[i] = 1.0f - w->decay[i];
    }
    return w;
  }

  void check_token(std::int32_t t) const {
    if (t < 0 || static_cast<std::uint32_t>(t) >= config_.vocab_size)
      tailbatch::detail::throw_invalid_argument("Generator::step: token " + std::to_string(t) + " outside the vocabulary");
  }

  static void grow(std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
  }

  // One lane group: out_t[out_dim][16] from x_t[in_dim][16].
  void dense(const float* xt, std::size_t in_dim, const float* w, const float* b, std::size_t out_dim,
             float* out_t, detail::GenActivation act) const noexcept {
    switch (kernel_) {
#if TAILBATCH_DETAIL_VECTOR_EXT && TAILBATCH_DETAIL_X86_DISPATCH
      case CpuKernel::avx512: detail::gen_dense_avx512(xt, in_dim, w, b, out_dim, out_t, act); return;
      case CpuKernel::avx2: detail::gen_dense_avx2(xt, in_dim, w, b, out_dim, out_t, act); return;
#endif
      default: detail::gen_dense_portable(xt, in_dim, w, b, out_dim, out_t, act); return;
    }
  }

  GeneratorConfig config_;
  std::shared_ptr<const Weights> weights_;
  CpuKernel kernel_ = CpuKernel::portable;
  GeneratorWorkspace own_;
  std::vector<GeneratorLane> lanes_;
};

}  // namespace tailbatch::reference
