// A small transformer-encoder text model written with libtorch's C++ API (torch::nn): a
// classifier and an embedder over the same encoder, its weights saved with torch::save and
// loaded with torch::load, and the batch call a Pipeline makes: a batch of ragged token
// sequences as one padded tensor with a src_key_padding_mask, run under
// torch::InferenceMode.
//
//   text --tokenize()--> TokenizedText (ids, [CLS] first; its length is the request's cost)
//   a batch of them --encode_batch()--> ids [B, T] (0 = padding) and mask [B, T] (true = pad)
//     --> token + position embeddings --> TransformerEncoder (masked) --> mean over the real
//     tokens --> embedding (unit length) and logits (a linear head) --> one Encoding per row
//
// Padding never changes a row's result: the mask keeps padded keys out of every attention
// and out of the pooling, so a request gives the same output alone and inside a batch of
// longer neighbours (tests/libtorch/test_libtorch_encoder.cpp checks it to 1e-5).
//
// Nothing here touches global state: the initial weights come from a generator of their own
// (seeded), not from torch's default generator; the intra-op thread count is set by the
// caller (torch_lanes.hpp, set_intra_op_threads).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tailbatch/reference/tokenizer.hpp>
#include <utility>
#include <vector>

namespace tailbatch_libtorch {

// The model's shape. Saved with the weights, so a weights file says what it is.
struct EncoderConfig {
  std::int64_t vocab_size = 8192;  // ids 0 (padding) and 1 ([CLS]) included
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t ffn = 256;
  std::int64_t layers = 2;
  std::int64_t max_tokens = 64;  // per text, [CLS] included; longer texts are cut
  std::int64_t classes = 3;

  friend bool operator==(const EncoderConfig&, const EncoderConfig&) = default;
};

inline constexpr std::int64_t pad_id = 0;
inline constexpr std::int64_t cls_id = 1;

// A request: a text's token ids, [CLS] first, at most max_tokens of them. `id` is the
// caller's, echoed in the Encoding.
struct TokenizedText {
  std::vector<std::int64_t> ids;
  std::uint64_t id = 0;
};

// A response: the class, its logits and the text's embedding (unit length).
struct Encoding {
  std::uint64_t id = 0;
  std::int32_t label = -1;
  std::vector<float> logits;
  std::vector<float> embedding;
};

// Text to ids: the reference tokenizer's words (hashed vocabulary, lowercased), shifted past
// the padding and [CLS] ids. Immutable after construction: thread-safe.
class TextTokenizer {
 public:
  explicit TextTokenizer(const EncoderConfig& c)
      : words_({.vocab_size = static_cast<std::uint32_t>(c.vocab_size - 2),
                .max_tokens = static_cast<std::size_t>(c.max_tokens - 1)}) {}

  // Allocates. Thread-safe.
  [[nodiscard]] TokenizedText operator()(std::string_view text, std::uint64_t id = 0) const {
    TokenizedText t;
    t.id = id;
    t.ids.push_back(cls_id);
    for (std::uint32_t w : words_.tokenize(text)) t.ids.push_back(static_cast<std::int64_t>(w) + 2);
    return t;
  }

 private:
  tailbatch::reference::Tokenizer words_;
};

// The module: token and position embeddings, a TransformerEncoder, a linear head.
struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const EncoderConfig& c)
      : config(c),
        tokens(register_module("tokens", torch::nn::Embedding(c.vocab_size, c.d_model))),
        positions(register_module("positions", torch::nn::Embedding(c.max_tokens, c.d_model))),
        encoder(register_module("encoder",
                                torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(
                                    torch::nn::TransformerEncoderLayerOptions(c.d_model, c.heads)
                                        .dim_feedforward(c.ffn)
                                        .dropout(0.0),
                                    c.layers)))),
        head(register_module("head", torch::nn::Linear(c.d_model, c.classes))) {
    // The shape travels with the weights (load_encoder reads it first).
    register_buffer("config", torch::tensor({c.vocab_size, c.d_model, c.heads, c.ffn, c.layers,
                                             c.max_tokens, c.classes},
                                            torch::kLong));
  }

  // ids and pad_mask: [B, T] (int64; bool, true at padding). Returns the embeddings [B, D]
  // (unit length) and the logits [B, classes].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& ids,
                                                  const torch::Tensor& pad_mask) {
    const std::int64_t t = ids.size(1);
    torch::Tensor x = tokens(ids) + positions(torch::arange(t, torch::kLong)).unsqueeze(0);
    // torch::nn's encoder takes [T, B, D].
    x = encoder->forward(x.transpose(0, 1), /*src_mask=*/torch::Tensor(), pad_mask).transpose(0, 1);
    const torch::Tensor keep = pad_mask.logical_not().unsqueeze(-1).to(x.scalar_type());
    const torch::Tensor pooled = (x * keep).sum(1) / keep.sum(1);
    return {torch::nn::functional::normalize(pooled,
                                             torch::nn::functional::NormalizeFuncOptions().dim(1)),
            head(pooled)};
  }

  EncoderConfig config;
  torch::nn::Embedding tokens;
  torch::nn::Embedding positions;
  torch::nn::TransformerEncoder encoder;
  torch::nn::Linear head;
};
TORCH_MODULE(Encoder);

// A fresh model whose weights are drawn from `seed` alone (a generator of its own: torch's
// default generator is neither read nor moved). Weights uniform in +-1/sqrt(fan_in),
// embeddings normal(0, 0.5), biases zero, layer norms one. In eval mode. Allocates.
inline Encoder make_encoder(const EncoderConfig& c, std::uint64_t seed) {
  Encoder m(c);
  m->eval();
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    torch::Tensor& t = p.value();
    if (name.find("norm") != std::string::npos) {
      t.fill_(name.ends_with("weight") ? 1.0 : 0.0);
    } else if (name.ends_with("bias")) {
      t.zero_();
    } else if (name.starts_with("tokens") || name.starts_with("positions")) {
      t.normal_(0.0, 0.5, gen);
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(t.dim() - 1)));
      t.uniform_(-bound, bound, gen);
    }
  }
  return m;
}

namespace detail {
[[noreturn]] inline void load_error(const std::filesystem::path& path, const std::string& why) {
  throw std::runtime_error("libtorch encoder: cannot load weights from '" + path.string() +
                           "': " + why);
}

// The first line of a c10::Error's message (the rest is a C++ stack trace).
inline std::string first_line(const char* what) {
  std::string s(what);
  return s.substr(0, s.find('\n'));
}
}  // namespace detail

// Writes the model with torch::save: its parameters and its config (a buffer), in torch's
// archive format (a zip file). Throws std::runtime_error naming the path when it cannot
// write.
inline void save_encoder(const Encoder& m, const std::filesystem::path& path) {
  try {
    torch::save(m, path.string());
  } catch (const c10::Error& e) {
    throw std::runtime_error("libtorch encoder: cannot write weights to '" + path.string() +
                             "': " + detail::first_line(e.what()));
  }
}

// Reads a model written by save_encoder, as torch::load does (InputArchive::load_from, then
// Module::load), reading the config first so that the module is built in the file's shape,
// and checking every parameter's shape against it (Module::load alone would take a tensor
// of any shape). The model comes back in eval mode. Throws std::runtime_error, with the path
// and the reason, when the file is missing, is not an archive torch::save wrote (truncated,
// overwritten, another format), has no encoder config, or lacks a parameter or holds one of
// the wrong shape. Allocates.
inline Encoder load_encoder(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) detail::load_error(path, "no such file");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path.string());
  } catch (const c10::Error& e) {
    detail::load_error(
        path, "not a weights file written by torch::save (" + detail::first_line(e.what()) + ")");
  }
  torch::Tensor cfg;
  if (!archive.try_read("config", cfg, /*is_buffer=*/true) || cfg.dim() != 1 || cfg.size(0) != 7 ||
      cfg.scalar_type() != torch::kLong) {
    detail::load_error(path, "no encoder config in the archive (not written by save_encoder)");
  }
  const auto* v = cfg.data_ptr<std::int64_t>();
  const EncoderConfig c{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
  if (c.vocab_size < 3 || c.d_model < 1 || c.heads < 1 || c.d_model % c.heads != 0 || c.ffn < 1 ||
      c.layers < 1 || c.max_tokens < 2 || c.classes < 1) {
    detail::load_error(path, "the encoder config in the archive is not valid");
  }
  Encoder m(c);
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& p : m->named_parameters()) shapes.push_back(p.value().sizes().vec());
  try {
    m->load(archive);
  } catch (const c10::Error& e) {
    detail::load_error(path, detail::first_line(e.what()));
  }
  std::size_t i = 0;
  for (const auto& p : m->named_parameters()) {
    if (p.value().sizes().vec() != shapes[i++]) {
      detail::load_error(path, "parameter '" + p.key() + "' has shape " +
                                   c10::str(p.value().sizes()) + ", the config gives " +
                                   c10::str(c10::IntArrayRef(shapes[i - 1])));
    }
  }
  m->eval();
  return m;
}

// Reusable buffers for encode_batch: a lane keeps one, so that a batch allocates only its
// tensors. Not thread-safe: one per lane.
struct BatchScratch {
  std::vector<std::int64_t> ids;
  std::vector<std::uint8_t> pad;
};

// Runs one batch: builds ids [B, T] (T = the longest request) and the padding mask, runs
// the model under torch::InferenceMode, and writes out[i] for in[i]. Throws
// std::invalid_argument for an empty request or one longer than max_tokens, and what
// libtorch throws (c10::Error). Not thread-safe for one module: a lane owns its module.
inline void encode_batch(Encoder& m, std::span<const TokenizedText> in, std::span<Encoding> out,
                         BatchScratch& scratch) {
  const auto b = static_cast<std::int64_t>(in.size());
  std::int64_t t = 1;
  for (const TokenizedText& r : in) {
    if (r.ids.empty()) throw std::invalid_argument("encode_batch: a request has no tokens");
    t = std::max<std::int64_t>(t, static_cast<std::int64_t>(r.ids.size()));
  }
  if (t > m->config.max_tokens)
    throw std::invalid_argument("encode_batch: a request is longer than max_tokens");
  scratch.ids.assign(static_cast<std::size_t>(b * t), pad_id);
  scratch.pad.assign(static_cast<std::size_t>(b * t), 1);
  for (std::int64_t i = 0; i < b; ++i) {
    const auto& ids = in[static_cast<std::size_t>(i)].ids;
    std::copy(ids.begin(), ids.end(), scratch.ids.begin() + i * t);
    std::fill_n(scratch.pad.begin() + i * t, ids.size(), std::uint8_t{0});
  }
  torch::InferenceMode guard;
  // from_blob wraps the scratch without a copy; the tensors do not outlive this call.
  const torch::Tensor ids = torch::from_blob(scratch.ids.data(), {b, t}, torch::kLong);
  const torch::Tensor mask =
      torch::from_blob(scratch.pad.data(), {b, t}, torch::kUInt8).to(torch::kBool);
  auto [emb, logits] = m->forward(ids, mask);
  emb = emb.contiguous();
  logits = logits.contiguous();
  const auto d = static_cast<std::size_t>(emb.size(1));
  const auto k = static_cast<std::size_t>(logits.size(1));
  const float* e = emb.data_ptr<float>();
  const float* l = logits.data_ptr<float>();
  const torch::Tensor labels = logits.argmax(1);
  const std::int64_t* lab = labels.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < in.size(); ++i) {
    Encoding& o = out[i];
    o.id = in[i].id;
    o.label = static_cast<std::int32_t>(lab[i]);
    o.logits.assign(l + i * k, l + (i + 1) * k);
    o.embedding.assign(e + i * d, e + (i + 1) * d);
  }
}

}  // namespace tailbatch_libtorch
