// The reference classifier on a CUDA lane, and its Pipeline adapter for either backend.
//
//   reference::Classifier clf;                        // CPU twin: weights, tokenizer
//   cuda::FallbackLanes lanes({.log = print});        // CUDA streams, or host lanes
//   std::optional<cuda::DeviceClassifier> gpu;
//   if (lanes.on_device()) gpu.emplace(clf, lanes.stream_pool()->device_info().device);
//   cuda::DeviceClassifierModel model(clf, gpu ? &*gpu : nullptr);
//   Pipeline<std::string, reference::Prediction, FixedWindow, cuda::FallbackLanes> p(model, window, {}, lanes);
//
// A batch on a CUDA lane: token ids packed into the lane's pinned staging buffer, one
// host-to-device copy, three kernels (classifier_kernels.cuh), one device-to-host copy of
// the logits and probabilities, lane.synchronize(). The logits are designed to equal the
// CPU twin's bit for bit and the probabilities to agree within a few ulp (expf differs from
// the host's); the tests checked both on an NVIDIA H200.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <tailbatch/detail/throw.hpp>
#include <tailbatch/reference/cuda/classifier_kernels.cuh>
#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/fallback_lanes.hpp>
#include <tailbatch/cuda/resources.hpp>
#include <tailbatch/cuda/stream_pool.hpp>
#include <tailbatch/reference/classifier.hpp>
#include <tailbatch/reference/classifier_model.hpp>

namespace tailbatch::cuda {

namespace detail {
inline constexpr std::size_t align_up(std::size_t n, std::size_t a = 256) noexcept { return (n + a - 1) / a * a; }
}  // namespace detail

// The classifier's weights on a device and its forward pass on a StreamLane.
//
// Immutable after construction: forward may run on many lanes (threads) at once, each on
// its own lane. Exceptions: the constructor throws CudaError (no device, out of memory),
// forward throws CudaError, std::invalid_argument and std::out_of_range as documented.
class DeviceClassifier {
 public:
  // Uploads cpu's weights to `device` (blocks for the copies; about 48 MiB by default).
  // cpu must outlive this object. Throws CudaError.
  explicit DeviceClassifier(const reference::Classifier& cpu, int device = 0) : cpu_(&cpu), device_(device) {
    TAILBATCH_CUDA_CHECK_IN("DeviceClassifier", cudaSetDevice(device));
    const reference::ClassifierWeights w = cpu.weights();
    try {
      embeddings_ = upload(w.embeddings);
      w1_ = upload(w.w1);
      b1_ = upload(w.b1);
      w2_ = upload(w.w2);
      b2_ = upload(w.b2);
      const std::size_t smem = dense_shared_bytes();
      if (smem > 48 * 1024) {
        TAILBATCH_CUDA_CHECK(cudaFuncSetAttribute(kernels::dense_relu_kernel<>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(smem)));
      }
    } catch (const CudaError& e) {
      throw CudaError("DeviceClassifier: uploading the weights to device " + std::to_string(device), e);
    }
  }

  // Pinned staging bytes a batch of `batch` requests needs at most (for
  // StreamPoolConfig::staging_bytes). Thread-safe.
  [[nodiscard]] std::size_t staging_bytes(std::size_t batch) const noexcept {
    return layout(batch, batch * cpu_->config().max_tokens).host_total;
  }
  // Device scratch bytes a batch of `batch` requests needs at most (for
  // StreamPoolConfig::scratch_bytes). Thread-safe.
  [[nodiscard]] std::size_t scratch_bytes(std::size_t batch) const noexcept {
    return layout(batch, batch * cpu_->config().max_tokens).device_total;
  }

  // Classifies a batch of token-id requests on `lane` and waits for it: out[i] for
  // batch[i]. A request longer than max_tokens is read up to max_tokens and flagged
  // (out[i].truncated, counted in truncated_requests()), or refused under
  // LongInput::reject, as on the CPU twin. Grows the lane's buffers if needed. Blocks until
  // the device is done. Throws std::invalid_argument (sizes differ, a lane on another
  // device), std::out_of_range (a token id >= vocab_size), std::length_error (a long
  // request under LongInput::reject) — these two before anything is enqueued — and
  // CudaError. Thread-safe (the lane is not).
  void forward(std::span<const std::span<const std::uint32_t>> batch, std::span<reference::Prediction> out,
               StreamLane& lane) const {
    if (batch.size() != out.size()) tailbatch::detail::throw_invalid_argument("DeviceClassifier::forward: batch and out differ in size");
    if (lane.device() != device_) tailbatch::detail::throw_invalid_argument("DeviceClassifier::forward: the lane is on another device");
    const std::size_t n = batch.size();
    if (n == 0) return;
    const reference::ClassifierConfig& cfg = cpu_->config();
    std::size_t tokens = 0;
    std::uint64_t long_requests = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (batch[i].size() > cfg.max_tokens) {
        if (cfg.long_input == reference::LongInput::reject) {
          tailbatch::detail::throw_error<std::length_error>("DeviceClassifier::forward: request " + std::to_string(i) +
                                  " has more than max_tokens (" + std::to_string(cfg.max_tokens) +
                                  ") tokens, and ClassifierConfig::long_input is reject");
        }
        ++long_requests;
      }
      const std::size_t len = batch[i].size() < cfg.max_tokens ? batch[i].size() : cfg.max_tokens;
      for (std::size_t t = 0; t < len; ++t) {
        if (batch[i][t] >= cfg.vocab_size) {
          tailbatch::detail::throw_error<std::out_of_range>("DeviceClassifier::forward: token id " + std::to_string(batch[i][t]) +
                                  " of request " + std::to_string(i) + " is >= vocab_size");
        }
      }
      tokens += len;
    }
    const Layout l = layout(n, tokens);
    PinnedBuffer& host = lane.staging(l.host_total);
    DeviceBuffer& dev = lane.scratch(l.device_total);

    auto* h_offsets = reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(host.data()) + l.offsets);
    auto* h_tokens = reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(host.data()) + l.tokens);
    std::uint32_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      h_offsets[i] = at;
      const std::size_t len = batch[i].size() < cfg.max_tokens ? batch[i].size() : cfg.max_tokens;
      if (len > 0) std::memcpy(h_tokens + at, batch[i].data(), len * sizeof(std::uint32_t));
      at += static_cast<std::uint32_t>(len);
    }
    h_offsets[n] = at;

    std::byte* d = static_cast<std::byte*>(dev.data());
    auto* d_offsets = reinterpret_cast<std::uint32_t*>(d + l.offsets);
    auto* d_tokens = reinterpret_cast<std::uint32_t*>(d + l.tokens);
    auto* d_x = reinterpret_cast<float*>(d + l.x);
    auto* d_hidden = reinterpret_cast<float*>(d + l.hidden);
    auto* d_out = reinterpret_cast<float*>(d + l.out);
    const int e = static_cast<int>(cfg.embed_dim);
    const int h = static_cast<int>(cfg.hidden_dim);
    const int b = static_cast<int>(n);

    const cudaStream_t s = lane.stream();
    TAILBATCH_CUDA_CHECK(cudaMemcpyAsync(d, host.data(), l.tokens + tokens * sizeof(std::uint32_t),
                                         cudaMemcpyHostToDevice, s));
    kernels::embedding_bag_kernel<<<b, embed_threads(), 0, s>>>(embeddings_.as<float>(), e, d_tokens, d_offsets, d_x);
    TAILBATCH_CUDA_CHECK(cudaGetLastError());
    constexpr int items = kernels::dense_items_per_block;
    constexpr int warps = kernels::dense_warps_per_block;
    const dim3 dense_grid(static_cast<unsigned>((h + 32 * warps - 1) / (32 * warps)),
                          static_cast<unsigned>((b + items - 1) / items));
    kernels::dense_relu_kernel<<<dense_grid, 32 * warps, dense_shared_bytes(), s>>>(d_x, b, e, w1_.as<float>(),
                                                                                    b1_.as<float>(), h, d_hidden);
    TAILBATCH_CUDA_CHECK(cudaGetLastError());
    constexpr int per_block = kernels::output_items_per_block;
    kernels::output_softmax_kernel<<<(b + per_block - 1) / per_block, 32 * per_block, 0, s>>>(
        d_hidden, b, h, w2_.as<float>(), b2_.as<float>(), d_out, d_out + n * 3);
    TAILBATCH_CUDA_CHECK(cudaGetLastError());
    TAILBATCH_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(host.data()) + l.out, d_out,
                                         2 * n * 3 * sizeof(float), cudaMemcpyDeviceToHost, s));
    lane.synchronize();

    const auto* h_out = reinterpret_cast<const float*>(static_cast<const std::byte*>(host.data()) + l.out);
    for (std::size_t i = 0; i < n; ++i) {
      reference::Prediction& p = out[i];
      for (std::size_t k = 0; k < 3; ++k) {
        p.logits[k] = h_out[i * 3 + k];
        p.probabilities[k] = h_out[n * 3 + i * 3 + k];
      }
      p.label = reference::detail::argmax3(p.logits.data());
      p.truncated = batch[i].size() > cfg.max_tokens;
    }
    if (long_requests > 0) truncated_.add(long_requests);
  }

  // Requests this device copy read only up to max_tokens (flagged truncated) since
  // construction; the CPU twin counts its own. Never blocks. Thread-safe.
  [[nodiscard]] std::uint64_t truncated_requests() const noexcept { return truncated_.get(); }

  // The CPU twin whose weights these are. Thread-safe.
  [[nodiscard]] const reference::Classifier& cpu() const noexcept { return *cpu_; }
  // The device holding the weights. Thread-safe.
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  struct Layout {
    std::size_t offsets = 0, tokens = 0, out = 0, x = 0, hidden = 0;
    std::size_t host_total = 0, device_total = 0;
  };

  // Host staging: [offsets][tokens] ... [logits][probabilities]; the device scratch has the
  // same offsets for what is copied, plus the activations.
  [[nodiscard]] Layout layout(std::size_t n, std::size_t tokens) const noexcept {
    const reference::ClassifierConfig& cfg = cpu_->config();
    Layout l;
    l.offsets = 0;
    l.tokens = detail::align_up((n + 1) * sizeof(std::uint32_t));
    l.out = l.tokens + detail::align_up(tokens * sizeof(std::uint32_t));
    l.host_total = l.out + detail::align_up(2 * n * 3 * sizeof(float));
    l.x = l.host_total;
    l.hidden = l.x + detail::align_up(n * cfg.embed_dim * sizeof(float));
    l.device_total = l.hidden + detail::align_up(n * cfg.hidden_dim * sizeof(float));
    return l;
  }

  [[nodiscard]] std::size_t dense_shared_bytes() const noexcept {
    return std::size_t{kernels::dense_items_per_block} * cpu_->config().embed_dim * sizeof(float);
  }

  [[nodiscard]] int embed_threads() const noexcept {
    const std::size_t e = cpu_->config().embed_dim;
    return e >= 256 ? 256 : static_cast<int>(detail::align_up(e, 32));
  }

  static DeviceBuffer upload(std::span<const float> host) {
    DeviceBuffer d(host.size_bytes());
    TAILBATCH_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
    return d;
  }

  const reference::Classifier* cpu_;
  int device_;
  DeviceBuffer embeddings_, w1_, b1_, w2_, b2_;
  reference::detail::EventCounter truncated_;
};

// The classifier as a Pipeline model on any backend: a StreamLane runs it on the GPU, a
// HostLane on the CPU twin, an AnyLane (FallbackLanes) on whichever it is.
//
// Requests are texts; they are tokenized in the worker thread (pinned staging takes the
// ids). Copies share their scratch. Thread-safety: calls may run concurrently, each on its
// own lane. Exceptions: a call throws what the forward pass throws, and std::logic_error for
// a CUDA lane when no DeviceClassifier was given; the Pipeline fails that batch.
class DeviceClassifierModel {
 public:
  // gpu may be nullptr when only host lanes will be used. Both must outlive the model.
  // Allocates. Throws std::bad_alloc.
  DeviceClassifierModel(const reference::Classifier& cpu, const DeviceClassifier* gpu) : cpu_(cpu), gpu_(gpu) {}

  // On a CUDA lane: tokenize, then DeviceClassifier::forward. Blocks. Thread-safe.
  void operator()(std::span<const std::string> texts, std::span<reference::Prediction> out, StreamLane& lane) const {
    if (gpu_ == nullptr) tailbatch::detail::throw_error<std::logic_error>("cuda::DeviceClassifierModel: a CUDA lane but no DeviceClassifier");
    auto scratch = scratch_->take();
    scratch->tokenize(cpu_.classifier().tokenizer(), texts);
    gpu_->forward(scratch->requests, out, lane);
  }

  // On a host lane: the CPU twin. Blocks. Thread-safe.
  void operator()(std::span<const std::string> texts, std::span<reference::Prediction> out, HostLane&) const {
    cpu_.run_on_cpu(texts, out);
  }

  // On a FallbackLanes lane: whichever it is. Blocks. Thread-safe.
  void operator()(std::span<const std::string> texts, std::span<reference::Prediction> out, AnyLane& lane) const {
    if (StreamLane* d = lane.device_lane()) {
      (*this)(texts, out, *d);
    } else {
      cpu_.run_on_cpu(texts, out);
    }
  }

 private:
  reference::ClassifierModel cpu_;
  const DeviceClassifier* gpu_;
  std::shared_ptr<reference::detail::ScratchPool> scratch_ = std::make_shared<reference::detail::ScratchPool>();
};

}  // namespace tailbatch::cuda
