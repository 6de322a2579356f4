// A deterministic sampler for the reference generator, per sequence: temperature, top_p and
// a seed, so that one request's text is a function of its prompt and its parameters alone,
// whether it runs alone or batched, streamed or not (the generator's logits are
// batch-invariant, and each sequence draws from its own splitmix64 stream).
//
//   temperature 0     greedy: the argmax, the lowest id on a tie. Draws nothing.
//   temperature > 0   softmax(logits / temperature) in double. With top_p < 1, only the
//                     smallest set of most likely ids (by logit, descending; ties by id)
//                     whose probability reaches top_p is kept. One uniform draw u in
//                     [0, mass) from the stream picks the first id, walking the kept ids
//                     in that order, whose cumulative weight exceeds u.
//
// TextGenerator wraps a Generator as a ContinuousBatcher step function for sequences whose
// state is a TextSequenceState: it steps the model, samples each emitting sequence with its
// own parameters, and finishes a sequence whose text reached one of its stop strings.
//
// Thread-safety: sample_token is thread-safe (it only advances the rng it is given);
// TextGenerator::step_sequences is one step at a time (its workspace), like
// Generator::step_sequences. Exceptions: std::bad_alloc, and what Generator::step throws.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <tailbatch/reference/generator.hpp>
#include <tailbatch/reference/text.hpp>
#include <vector>

namespace tailbatch::reference {

struct SamplingParams {
  float temperature = 0.0f;  // >= 0, finite
  float top_p = 1.0f;        // (0, 1]
};

// Samples one id from logits. rng: the sequence's splitmix64 counter, advanced once per
// draw (not at temperature 0). scratch is reused between calls (allocates while it grows).
[[nodiscard]] inline std::int32_t sample_token(std::span<const float> logits,
                                               const SamplingParams& p, std::uint64_t& rng,
                                               std::vector<std::uint32_t>& scratch) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i) best = logits[i] > logits[best] ? i : best;
  if (!(p.temperature > 0.0f) || logits.empty()) return static_cast<std::int32_t>(best);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double top = logits[best];
  auto weight = [&](std::size_t i) {
    return std::exp((static_cast<double>(logits[i]) - top) * inv_t);
  };
  const double u01 = static_cast<double>(detail::splitmix64(rng++) >> 11) * 0x1.0p-53;
  if (p.top_p >= 1.0f) {
    double total = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) total += weight(i);
    const double u = u01 * total;
    double cum = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      cum += weight(i);
      if (cum > u) return static_cast<std::int32_t>(i);
    }
    return static_cast<std::int32_t>(best);
  }
  scratch.resize(logits.size());
  std::iota(scratch.begin(), scratch.end(), 0u);
  std::stable_sort(scratch.begin(), scratch.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
  double total = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) total += weight(i);
  const double want = static_cast<double>(p.top_p) * total;
  double mass = 0.0;
  std::size_t kept = 0;
  while (kept < scratch.size() && (kept == 0 || mass < want)) mass += weight(scratch[kept++]);
  const double u = u01 * mass;
  double cum = 0.0;
  for (std::size_t k = 0; k < kept; ++k) {
    cum += weight(scratch[k]);
    if (cum > u) return static_cast<std::int32_t>(scratch[k]);
  }
  return static_cast<std::int32_t>(scratch[0]);
}

// One text sequence's state in a ContinuousBatcher<std::int32_t, TextSequenceState>.
struct TextSequenceState {
  GeneratorState model;
  SamplingParams sampling;
  std::uint64_t rng = 0;  // the sampling stream's counter, from the request's seed
  StopMatcher stop;       // the sequence finishes once its text reaches a stop string
};

class TextGenerator {
 public:
  // The generator must be greedy (temperature 0); sampling happens here, per sequence.
  // Throws std::invalid_argument otherwise. The generator must outlive this object.
  explicit TextGenerator(const Generator& generator) : gen_(&generator) {
    if (generator.config().temperature != 0.0f)
      tailbatch::detail::throw_invalid_argument(
          "TextGenerator: the generator's temperature must be 0");
  }

  // A fresh state. seed: the request's (the same seed, the same text). Thread-safe.
  [[nodiscard]] TextSequenceState new_state(SamplingParams sampling, std::uint64_t seed,
                                            std::vector<std::string> stops = {}) const {
    TextSequenceState s;
    s.model = gen_->new_state(seed);
    s.sampling = sampling;
    s.rng = detail::splitmix64(seed ^ 0xbb67ae8584caa73bULL);
    s.stop = StopMatcher(std::move(stops));
    return s;
  }

  // The step function of a ContinuousBatcher<std::int32_t, TextSequenceState>. Not
  // thread-safe: one step at a time.
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch) {
    step_sequences(batch, nullptr);
  }

  // The same for a ContinuousBatcher with a KV pool: the sequences' KV lives in `kv`, in
  // their blocks (GeneratorKvStore; Generator::step_sequences(batch, kv) says how). Not
  // thread-safe: one step at a time.
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch, GeneratorKvStore& kv) {
    step_sequences(batch, &kv);
  }

 private:
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch, GeneratorKvStore* kv) {
    const std::size_t V = gen_->config().vocab_size;
    lanes_.resize(batch.size());
    std::size_t emitting = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      auto& seq = batch[i];
      auto& lane = lanes_[i];
      lane.state = &seq.state().model;
      lane.emit = seq.emits();
      lane.feed = seq.decoding() ? std::span<const std::int32_t>(&seq.state().model.next_input, 1)
                                 : seq.prefill_chunk();
      emitting += lane.emit ? 1 : 0;
      lane.kv = kv;
      if (kv != nullptr) {
        lane.blocks = seq.block_table();
        lane.position = seq.position();
        lane.restore = !seq.decoding() && seq.prefilled() == seq.cached_tokens();
      }
    }
    logits_.resize(emitting * V);
    gen_->step(std::span<GeneratorLane>(lanes_), ws_, std::span<float>(logits_));
    std::size_t row = 0;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (!lanes_[i].emit) continue;
      auto& st = batch[i].state();
      const std::int32_t t = sample_token(std::span<const float>(logits_.data() + row * V, V),
                                          st.sampling, st.rng, scratch_);
      ++row;
      st.model.next_input = t;
      batch[i].emit(t);
      if (!st.stop.stops().empty()) {
        piece_.clear();
        TextVocabulary::append_piece(t, piece_);
        (void)st.stop.push(piece_);
        if (st.stop.stopped()) batch[i].finish();
      }
    }
  }

  const Generator* gen_;
  GeneratorWorkspace ws_;
  std::vector<GeneratorLane> lanes_;
  std::vector<float> logits_;
  std::vector<std::uint32_t> scratch_;
  std::string piece_;
};

}  // namespace tailbatch::reference
