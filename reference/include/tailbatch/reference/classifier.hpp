// The reference text classifier: the model every tailbatch demo and benchmark runs.
//
// A real (if untrained) text path whose cost depends on batch size the way a real model's
// does: tokenize -> embedding bag (mean of the tokens' rows) -> dense + ReLU -> dense ->
// softmax over three labels (negative, neutral, positive). The first dense layer holds
// embed_dim x hidden_dim floats (32 MiB by default), more than a core's L2 cache and as
// much as a server's L3 slice, so a batch of one is bound by streaming those weights from
// memory, and a batch reads them once for all its items.
//
// The weights are a pure function of the seed (splitmix64 counters, no std::
// distributions, so the same seed gives the same bits with every standard library), except
// for one direction of the embedding space that carries the polarity of a small shipped
// lexicon (sentiment_lexicon.hpp): "a great, moving film" comes out positive, "awful,
// boring plot" negative, text without lexicon words neutral.
//
// Batch invariance: a request's output is bit-identical whether it runs alone or in any
// batch at any position, on every CPU kernel (see detail/cpu_kernels.hpp for why; the CPU
// tests check it). The CUDA kernels (tailbatch/reference/cuda/classifier_kernels.cuh) are
// designed to compute the same logits in the same order, and did on an NVIDIA H200 (the
// only GPU tried). docs/reference-model.md has the architecture, the sizes and the reasons.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <tailbatch/detail/enum_names.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/reference/detail/cpu_kernels.hpp>
#include <tailbatch/reference/sentiment_lexicon.hpp>
#include <tailbatch/reference/tokenizer.hpp>

namespace tailbatch::reference {

enum class Sentiment : std::uint8_t { negative = 0, neutral = 1, positive = 2 };
inline constexpr std::size_t sentiment_count = 3;

// "negative", "neutral" or "positive". Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(Sentiment s) noexcept {
  return tailbatch::detail::enum_name<sentiment_count>(s, {"negative", "neutral", "positive"});
}

// Which CPU code runs the first dense layer. All produce the same bits; they differ in
// speed only. automatic picks the widest the CPU supports.
enum class CpuKernel : std::uint8_t { automatic, portable, avx2, avx512 };

// "automatic", "portable", "avx2" or "avx512". Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(CpuKernel k) noexcept {
  return tailbatch::detail::enum_name(k, {"automatic", "portable", "avx2", "avx512"});
}

// Whether this CPU and this build can run kernel k (automatic and portable always can).
// Thread-safe.
[[nodiscard]] inline bool cpu_kernel_supported(CpuKernel k) noexcept {
  switch (k) {
    case CpuKernel::automatic:
    case CpuKernel::portable: return true;
    case CpuKernel::avx2: return detail::cpu_has_avx2();
    case CpuKernel::avx512: return detail::cpu_has_avx512();
  }
  return false;
}

// What the classifier does with a request longer than max_tokens.
enum class LongInput : std::uint8_t {
  truncate,  // read its first max_tokens tokens and say so: Prediction::truncated, and
             // Classifier::truncated_requests() counts it (the default)
  reject,    // throw std::length_error naming the request, before computing anything
};

// "truncate" or "reject". Thread-safe.
[[nodiscard]] constexpr std::string_view to_string(LongInput l) noexcept {
  return l == LongInput::reject ? "reject" : "truncate";
}

struct ClassifierConfig {
  // Every weight is a function of the seed (and of the lexicon).
  std::uint64_t seed = 20240611;
  // Rows of the embedding table, the lexicon's reserved rows included (> lexicon size).
  std::uint32_t vocab_size = 8192;
  // Width of the embedding and of the first layer's input; a multiple of 16.
  std::uint32_t embed_dim = 512;
  // Hidden units; a multiple of 32 and >= 32.
  std::uint32_t hidden_dim = 16384;
  // Tokens per request that the model reads. A longer request is truncated and flagged,
  // or rejected, as long_input says; never silently cut.
  std::size_t max_tokens = 128;
  LongInput long_input = LongInput::truncate;
  CpuKernel cpu_kernel = CpuKernel::automatic;
};

// The model's output for one request.
struct Prediction {
  std::array<float, sentiment_count> logits{};
  std::array<float, sentiment_count> probabilities{};  // softmax of logits, summing to ~1
  Sentiment label = Sentiment::neutral;                // argmax (the first on a tie)
  // The request had more than max_tokens tokens and only its first max_tokens were read
  // (LongInput::truncate). Set for every such request; false otherwise.
  bool truncated = false;

  // The probability of the label. Thread-safe.
  [[nodiscard]] float confidence() const noexcept { return probabilities[static_cast<std::size_t>(label)]; }
};

// The same computation in double precision, for checking the float kernels.
struct ReferencePrediction {
  std::array<double, sentiment_count> logits{};
  std::array<double, sentiment_count> probabilities{};
  Sentiment label = Sentiment::neutral;
  bool truncated = false;  // as Prediction::truncated
};

// Read-only views of the weights, for copying them to a device. Layouts:
//   embeddings  [vocab_size][embed_dim]
//   w1          panels of 32 hidden units: the weight from input k to hidden unit h is
//               w1[(h / 32) * embed_dim * 32 + k * 32 + h % 32]
//   b1          [hidden_dim]
//   w2          [3][hidden_dim] (label-major)
//   b2          [3]
struct ClassifierWeights {
  std::uint32_t vocab_size = 0;
  std::uint32_t embed_dim = 0;
  std::uint32_t hidden_dim = 0;
  std::span<const float> embeddings;
  std::span<const float> w1;
  std::span<const float> b1;
  std::span<const float> w2;
  std::span<const float> b2;
};

// Scratch memory for Classifier::forward. Reused across calls, it grows to the largest
// batch seen and then stops allocating. Not thread-safe: one per thread (or lane).
class ClassifierWorkspace {
 public:
  ClassifierWorkspace() = default;

 private:
  friend class Classifier;
  std::vector<float> x_;
  std::vector<float> hidden_;
};

namespace detail {

[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A counter-based stream of uniform values in [-1, 1) with 24 bits of resolution (exact
// in float): value i of stream s under seed depends on (seed, s, i) alone.
class UniformStream {
 public:
  UniformStream(std::uint64_t seed, std::uint64_t stream) noexcept
      : base_(splitmix64(seed ^ splitmix64(stream * 0xd1b54a32d192ed03ULL))) {}
  [[nodiscard]] float operator()(std::uint64_t i) const noexcept {
    const auto top = static_cast<std::int32_t>(splitmix64(base_ + i) >> 40);  // 0 .. 2^24-1
    return static_cast<float>(top - (1 << 23)) / static_cast<float>(1 << 23);
  }

 private:
  std::uint64_t base_;
};

// 64-byte aligned float storage (a cache line; an AVX-512 register).
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(std::size_t n)
      : data_(static_cast<float*>(::operator new(n * sizeof(float), std::align_val_t{64}))), size_(n) {
    for (std::size_t i = 0; i < n; ++i) data_.get()[i] = 0.0f;
  }
  [[nodiscard]] float* data() noexcept { return data_.get(); }
  [[nodiscard]] const float* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  float& operator[](std::size_t i) noexcept { return data_.get()[i]; }
  const float& operator[](std::size_t i) const noexcept { return data_.get()[i]; }
  [[nodiscard]] std::span<const float> span() const noexcept { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(float* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, Free> data_;
  std::size_t size_ = 0;
};

inline std::vector<std::string_view> lexicon_words() {
  std::vector<std::string_view> words;
  words.reserve(sentiment_lexicon.size());
  for (const auto& e : sentiment_lexicon) words.push_back(e.word);
  return words;
}

// A relaxed event counter that a const, shared object may bump; copying or moving the
// object copies the count.
class EventCounter {
 public:
  EventCounter() = default;
  EventCounter(const EventCounter& o) noexcept : n_(o.get()) {}
  EventCounter& operator=(const EventCounter& o) noexcept {
    n_.store(o.get(), std::memory_order_relaxed);
    return *this;
  }
  void add(std::uint64_t k) const noexcept { n_.fetch_add(k, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t get() const noexcept { return n_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<std::uint64_t> n_{0};
};

// The tokenizer a model with this max_tokens uses: it keeps one id past max_tokens, never
// read, so that the forward pass can tell that a text was longer.
[[nodiscard]] constexpr std::size_t tokenizer_limit(std::size_t max_tokens) noexcept {
  return max_tokens < static_cast<std::size_t>(-1) ? max_tokens + 1 : max_tokens;
}

inline Sentiment argmax3(const float* v) noexcept {
  std::size_t best = 0;
  for (std::size_t l = 1; l < sentiment_count; ++l) best = v[l] > v[best] ? l : best;
  return static_cast<Sentiment>(best);
}

}  // namespace detail

// The classifier's weights and its CPU forward pass.
//
// Immutable after construction (but for the truncated_requests() counter, which is atomic):
// forward, classify and reference_forward may be called from many threads at once, each
// with its own ClassifierWorkspace. The weights come from one of two sources: generated in
// memory from the seed (the default constructor), or views into memory that something
// else owns and keeps alive, such as a file mapped by weights_file.hpp (the
// ClassifierWeights constructor). Move-only: the weights are not copied.
class Classifier {
 public:
  // How the lexicon enters the weights (docs/reference-model.md explains the numbers).
  static constexpr float polarity_scale = 1.0f;   // embedding channel 0 of a lexicon word
  static constexpr float sentiment_gain = 4.0f;   // logit per unit of mean polarity
  static constexpr float neutral_margin = 1.0f;   // the neutral logit's bias
  static constexpr float noise_logit_std = 0.25f; // spread of the random part of a logit

  // Generates the weights from config.seed: allocates about (vocab_size + hidden_dim) *
  // embed_dim floats (48 MiB by default, 0.1 to 0.3 s) and writes every one of them, so
  // they are resident when construction returns. Throws std::invalid_argument naming the
  // field of a bad config, std::bad_alloc when out of memory.
  explicit Classifier(ClassifierConfig config = {})
      : config_(validate(config)),
        tokenizer_(TokenizerConfig{config_.vocab_size, detail::tokenizer_limit(config_.max_tokens)},
                   detail::lexicon_words()),
        kernel_(resolve(config_.cpu_kernel)) {
    generate_weights();
  }

  // Uses weights that already exist (in the layout of ClassifierWeights) instead of
  // generating them: nothing is copied and no weight is read here, so weights mapped from
  // a file are first touched by the first forward pass (or by warmup). owner keeps the
  // memory alive for as long as this Classifier (it may be null when the caller guarantees
  // that). The dimensions in weights must equal config's and every view must have the
  // size its layout implies; config.seed is only recorded. Outputs are bitwise those of
  // a generated Classifier whose weights hold the same values. Allocates (the tokenizer).
  // Throws std::invalid_argument naming the field that does not match, std::bad_alloc.
  Classifier(ClassifierConfig config, const ClassifierWeights& weights, std::shared_ptr<const void> owner)
      : config_(validate(config)),
        tokenizer_(TokenizerConfig{config_.vocab_size, detail::tokenizer_limit(config_.max_tokens)},
                   detail::lexicon_words()),
        kernel_(resolve(config_.cpu_kernel)),
        storage_(std::move(owner)) {
    adopt_weights(weights);
  }

  Classifier(const Classifier&) = delete;
  Classifier& operator=(const Classifier&) = delete;
  Classifier(Classifier&&) noexcept = default;
  Classifier& operator=(Classifier&&) noexcept = default;
  ~Classifier() = default;

  // Classifies a batch: out[i] is the prediction for batch[i], a request's token ids. A
  // request longer than max_tokens is read up to max_tokens and flagged (out[i].truncated,
  // counted in truncated_requests()), or, with LongInput::reject, refused. Allocates only
  // when ws must grow. Throws std::invalid_argument if the sizes differ,
  // std::out_of_range for a token id >= vocab_size, std::length_error for a request over
  // max_tokens under LongInput::reject (both before computing anything), std::bad_alloc.
  // Thread-safe (ws is not).
  void forward(std::span<const std::span<const std::uint32_t>> batch, std::span<Prediction> out,
               ClassifierWorkspace& ws) const {
    if (batch.size() != out.size()) {
      tailbatch::detail::throw_invalid_argument("Classifier::forward: batch and out differ in size");
    }
    std::uint64_t long_requests = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].size() > config_.max_tokens) {
        if (config_.long_input == LongInput::reject) throw too_long("Classifier::forward", i);
        ++long_requests;
      }
      for (std::uint32_t t : truncated(batch[i])) {
        if (t >= config_.vocab_size) {
          tailbatch::detail::throw_error<std::out_of_range>("Classifier::forward: token id " + std::to_string(t) + " of request " +
                                  std::to_string(i) + " is >= vocab_size " +
                                  std::to_string(config_.vocab_size));
        }
      }
    }
    const std::size_t n = batch.size();
    const std::size_t e = config_.embed_dim;
    const std::size_t h = config_.hidden_dim;
    if (ws.x_.size() < n * e) ws.x_.resize(n * e);
    if (ws.hidden_.size() < n * h) ws.hidden_.resize(n * h);
    for (std::size_t i = 0; i < n; ++i) {
      detail::embedding_bag(embeddings_.data(), e, truncated(batch[i]), ws.x_.data() + i * e);
    }
    dense_relu(ws.x_.data(), n, ws.hidden_.data());
    for (std::size_t i = 0; i < n; ++i) {
      Prediction& p = out[i];
      detail::output_logits(ws.hidden_.data() + i * h, h, w2_.data(), b2_.data(), p.logits.data());
      detail::softmax3(p.logits.data(), p.probabilities.data());
      p.label = detail::argmax3(p.logits.data());
      p.truncated = batch[i].size() > config_.max_tokens;
    }
    if (long_requests > 0) truncated_.add(long_requests);
  }

  // Tokenizes text and classifies it alone; a text of more than max_tokens words is
  // flagged (Prediction::truncated) or refused as forward says. Allocates (a workspace and
  // the token ids). Throws std::bad_alloc, std::length_error (LongInput::reject). Thread-safe.
  [[nodiscard]] Prediction classify(std::string_view text) const {
    const std::vector<std::uint32_t> ids = tokenizer_.tokenize(text);
    const std::span<const std::uint32_t> one[1] = {ids};
    Prediction p;
    ClassifierWorkspace ws;
    forward(one, std::span<Prediction>(&p, 1), ws);
    return p;
  }

  // The same model in double precision (weights as stored, every sum in double), for
  // checking the float kernels; long requests as forward treats them, but not counted.
  // Slow; allocates. Throws std::out_of_range for a token id >= vocab_size,
  // std::length_error as forward does. Thread-safe.
  [[nodiscard]] ReferencePrediction reference_forward(std::span<const std::uint32_t> tokens) const {
    const bool was_long = tokens.size() > config_.max_tokens;
    if (was_long && config_.long_input == LongInput::reject) {
      throw too_long("Classifier::reference_forward", 0);
    }
    tokens = truncated(tokens);
    const std::size_t e = config_.embed_dim;
    const std::size_t h = config_.hidden_dim;
    std::vector<double> x(e, 0.0);
    for (std::uint32_t t : tokens) {
      if (t >= config_.vocab_size) tailbatch::detail::throw_error<std::out_of_range>("Classifier::reference_forward: token id out of range");
      for (std::size_t k = 0; k < e; ++k) x[k] += embeddings_[std::size_t{t} * e + k];
    }
    if (!tokens.empty()) {
      for (double& v : x) v /= static_cast<double>(tokens.size());
    }
    ReferencePrediction r;
    std::vector<double> hidden(h);
    for (std::size_t j = 0; j < h; ++j) {
      const float* panel = w1_.data() + (j / detail::panel_width) * e * detail::panel_width;
      double acc = b1_[j];
      for (std::size_t k = 0; k < e; ++k) acc += x[k] * panel[k * detail::panel_width + j % detail::panel_width];
      hidden[j] = acc > 0.0 ? acc : 0.0;
    }
    for (std::size_t l = 0; l < sentiment_count; ++l) {
      double acc = b2_[l];
      for (std::size_t j = 0; j < h; ++j) acc += hidden[j] * w2_[l * h + j];
      r.logits[l] = acc;
    }
    double m = r.logits[0];
    for (double z : r.logits) m = z > m ? z : m;
    double sum = 0.0;
    for (std::size_t l = 0; l < sentiment_count; ++l) sum += (r.probabilities[l] = std::exp(r.logits[l] - m));
    std::size_t best = 0;
    for (std::size_t l = 0; l < sentiment_count; ++l) {
      r.probabilities[l] /= sum;
      if (r.logits[l] > r.logits[best]) best = l;
    }
    r.label = static_cast<Sentiment>(best);
    r.truncated = was_long;
    return r;
  }

  // The configuration, as given. Thread-safe.
  [[nodiscard]] const ClassifierConfig& config() const noexcept { return config_; }
  // Requests read only up to max_tokens (flagged truncated) by forward and classify since
  // construction. Never blocks; a relaxed read. Thread-safe.
  [[nodiscard]] std::uint64_t truncated_requests() const noexcept { return truncated_.get(); }
  // The tokenizer matching this model (lexicon words reserved). It keeps max_tokens + 1
  // ids of a text: the model never reads the last one, which tells it the text was longer
  // than it reads. Thread-safe.
  [[nodiscard]] const Tokenizer& tokenizer() const noexcept { return tokenizer_; }
  // The CPU kernel that runs (automatic resolved). Thread-safe.
  [[nodiscard]] CpuKernel kernel() const noexcept { return kernel_; }
  // Bytes of the first layer's weights: what a batch of one must read. Thread-safe.
  [[nodiscard]] std::size_t first_layer_bytes() const noexcept { return w1_.size() * sizeof(float); }

  // Views of the weights (valid while this Classifier lives), for uploading them to a
  // device. Thread-safe.
  [[nodiscard]] ClassifierWeights weights() const noexcept {
    return {config_.vocab_size, config_.embed_dim, config_.hidden_dim, embeddings_, w1_, b1_, w2_, b2_};
  }

 private:
  static ClassifierConfig validate(ClassifierConfig c) {
    if (c.embed_dim < 16 || c.embed_dim % 16 != 0) {
      tailbatch::detail::throw_invalid_argument("Classifier: embed_dim must be a positive multiple of 16");
    }
    if (c.hidden_dim < 32 || c.hidden_dim % 32 != 0) {
      tailbatch::detail::throw_invalid_argument("Classifier: hidden_dim must be a positive multiple of 32");
    }
    if (c.vocab_size <= sentiment_lexicon.size()) {
      tailbatch::detail::throw_invalid_argument("Classifier: vocab_size must exceed the lexicon size (" +
                                  std::to_string(sentiment_lexicon.size()) + ")");
    }
    if (c.max_tokens < 1) tailbatch::detail::throw_invalid_argument("Classifier: max_tokens must be >= 1");
    if (!cpu_kernel_supported(c.cpu_kernel)) {
      tailbatch::detail::throw_invalid_argument("Classifier: cpu_kernel " + std::string(to_string(c.cpu_kernel)) +
                                  " is not supported by this CPU or build");
    }
    return c;
  }

  static CpuKernel resolve(CpuKernel k) noexcept {
    if (k != CpuKernel::automatic) return k;
    if (detail::cpu_has_avx512()) return CpuKernel::avx512;
    if (detail::cpu_has_avx2()) return CpuKernel::avx2;
    return CpuKernel::portable;
  }

  [[nodiscard]] std::length_error too_long(const char* where, std::size_t request) const {
    return std::length_error(std::string(where) + ": request " + std::to_string(request) +
                             " has more than max_tokens (" + std::to_string(config_.max_tokens) +
                             ") tokens, and ClassifierConfig::long_input is reject");
  }

  [[nodiscard]] std::span<const std::uint32_t> truncated(std::span<const std::uint32_t> t) const noexcept {
    return t.size() > config_.max_tokens ? t.first(config_.max_tokens) : t;
  }

  void dense_relu(const float* x, std::size_t n, float* hidden) const noexcept {
    const std::size_t e = config_.embed_dim;
    const std::size_t h = config_.hidden_dim;
    switch (kernel_) {
#if TAILBATCH_DETAIL_X86_DISPATCH
      case CpuKernel::avx512: detail::dense_relu_avx512(x, n, e, w1_.data(), b1_.data(), h, hidden); return;
      case CpuKernel::avx2: detail::dense_relu_avx2(x, n, e, w1_.data(), b1_.data(), h, hidden); return;
#endif
      default: detail::dense_relu_portable(x, n, e, w1_.data(), b1_.data(), h, hidden); return;
    }
  }

  // Random weights scaled so that a hidden pre-activation has unit spread for a one-token
  // input and the random part of a logit has spread noise_logit_std; then the lexicon
  // direction: embedding channel 0 holds a lexicon word's polarity (0 for every other
  // word), hidden unit 0 is relu(+channel 0), unit 1 is relu(-channel 0), and they push
  // the positive and negative logits apart by sentiment_gain per unit of mean polarity.
  void generate_weights() {
    const std::size_t v = config_.vocab_size;
    const std::size_t e = config_.embed_dim;
    const std::size_t h = config_.hidden_dim;
    const std::uint64_t seed = config_.seed;
    auto owned = std::make_shared<GeneratedWeights>();
    GeneratedWeights& g = *owned;
    g.embeddings = detail::AlignedFloats(v * e);
    g.w1 = detail::AlignedFloats(e * h);
    g.b1 = detail::AlignedFloats(h);
    g.w2 = detail::AlignedFloats(sentiment_count * h);
    g.b2 = detail::AlignedFloats(sentiment_count);

    const detail::UniformStream emb(seed, 1), w1(seed, 2), b1(seed, 3), w2(seed, 4);
    for (std::size_t r = 0; r < v; ++r) {
      for (std::size_t k = 1; k < e; ++k) g.embeddings[r * e + k] = emb(r * e + k);
    }
    for (std::size_t r = 0; r < sentiment_lexicon.size(); ++r) {
      g.embeddings[r * e] = polarity_scale * static_cast<float>(sentiment_lexicon[r].polarity);
    }

    const float w1_amp = 3.0f / std::sqrt(static_cast<float>(e));
    for (std::size_t j = 2; j < h; ++j) {
      float* panel = g.w1.data() + (j / detail::panel_width) * e * detail::panel_width;
      for (std::size_t k = 1; k < e; ++k) panel[k * detail::panel_width + j % detail::panel_width] = w1_amp * w1(j * e + k);
      g.b1[j] = 0.1f * b1(j);
    }
    g.w1[0 * detail::panel_width + 0] = 1.0f;   // unit 0 reads +channel 0
    g.w1[0 * detail::panel_width + 1] = -1.0f;  // unit 1 reads -channel 0

    const float w2_amp = std::sqrt(3.0f) * noise_logit_std / std::sqrt(0.5f * static_cast<float>(h));
    for (std::size_t l = 0; l < sentiment_count; ++l) {
      for (std::size_t j = 2; j < h; ++j) g.w2[l * h + j] = w2_amp * w2(l * h + j);
    }
    const std::size_t neg = static_cast<std::size_t>(Sentiment::negative);
    const std::size_t pos = static_cast<std::size_t>(Sentiment::positive);
    g.w2[pos * h + 0] = sentiment_gain;
    g.w2[pos * h + 1] = -sentiment_gain;
    g.w2[neg * h + 0] = -sentiment_gain;
    g.w2[neg * h + 1] = sentiment_gain;
    g.b2[static_cast<std::size_t>(Sentiment::neutral)] = neutral_margin;

    embeddings_ = g.embeddings.span();
    w1_ = g.w1.span();
    b1_ = g.b1.span();
    w2_ = g.w2.span();
    b2_ = g.b2.span();
    storage_ = std::move(owned);
  }

  void adopt_weights(const ClassifierWeights& w) {
    const std::size_t v = config_.vocab_size;
    const std::size_t e = config_.embed_dim;
    const std::size_t h = config_.hidden_dim;
    auto check = [](bool ok, const char* what) {
      if (!ok) tailbatch::detail::throw_invalid_argument(std::string("Classifier: weights.") + what + " does not match the config");
    };
    check(w.vocab_size == config_.vocab_size, "vocab_size");
    check(w.embed_dim == config_.embed_dim, "embed_dim");
    check(w.hidden_dim == config_.hidden_dim, "hidden_dim");
    check(w.embeddings.size() == v * e, "embeddings (size)");
    check(w.w1.size() == e * h, "w1 (size)");
    check(w.b1.size() == h, "b1 (size)");
    check(w.w2.size() == sentiment_count * h, "w2 (size)");
    check(w.b2.size() == sentiment_count, "b2 (size)");
    embeddings_ = w.embeddings;
    w1_ = w.w1;
    b1_ = w.b1;
    w2_ = w.w2;
    b2_ = w.b2;
  }

  // The generated weights, owned through storage_ like any other source.
  struct GeneratedWeights {
    detail::AlignedFloats embeddings;
    detail::AlignedFloats w1;
    detail::AlignedFloats b1;
    detail::AlignedFloats w2;
    detail::AlignedFloats b2;
  };

  ClassifierConfig config_;
  Tokenizer tokenizer_;
  CpuKernel kernel_;
  detail::EventCounter truncated_;
  std::shared_ptr<const void> storage_;  // what keeps the views below valid
  std::span<const float> embeddings_;
  std::span<const float> w1_;
  std::span<const float> b1_;
  std::span<const float> w2_;
  std::span<const float> b2_;
};

}  // namespace tailbatch::reference
