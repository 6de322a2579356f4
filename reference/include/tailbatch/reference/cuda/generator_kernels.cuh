// The reference generator on a CUDA device: its kernels and DeviceGenerator, the device
// counterpart of reference::Generator (tailbatch/reference/generator.hpp).
//
//   reference::Generator cpu;                      // weights, sampling
//   cuda::DeviceGenerator gpu(cpu);                // uploads the weights to device 0
//   ContinuousBatcher<std::int32_t, reference::GeneratorState> batcher(
//       [&](auto batch) { gpu.step_sequences(batch, stream); }, config);
//
// One step: the fed tokens, the lanes' states and offsets go to the device in one copy;
// four kernels run the input projection, the recurrence, the output projection and the
// logits; the new states and the logits come back in one copy; the host samples with the
// CPU twin's sample(), so tokens are equal wherever the logits are.
//
// Same numbers as the CPU twin: every product and sum is written with __fmul_rn /
// __fadd_rn / __fdiv_rn, which nvcc never fuses into an FMA or replaces with an
// approximation (whatever -fmad or --use_fast_math say), in the CPU twin's order: bias,
// then + w[0]*x[0], + w[1]*x[1], ... in k order. Each (row, output) has its own thread and
// accumulator, so a sequence's sums never depend on the batch. Where the CPU twin's
// compiler contracts nothing (the shipped kernels prevent it), the logits are designed to
// be equal bit for bit (tests/cuda/test_generator.cu checks tokens equal and logits within
// 1e-5; on an NVIDIA H200 they were bit-equal).
//
// Compiled by the user's nvcc (include this from a .cu file).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/resources.hpp>
#include <tailbatch/detail/throw.hpp>
#include <tailbatch/reference/generator.hpp>

namespace tailbatch::cuda {
namespace kernels {

// Threads per block of the generator's kernels.
inline constexpr int generator_threads = 128;

// x[r][k] = embeddings[tokens[r]][k]. Launch: grid = rows, block = generator_threads.
// (Templates, so that a header included by several .cu files defines each kernel once.)
template <class Token = std::int32_t>
__global__ void generator_gather_kernel(const float* __restrict__ embeddings, int hidden,
                                        const Token* __restrict__ tokens, float* __restrict__ x) {
  const int r = static_cast<int>(blockIdx.x);
  const float* row = embeddings + static_cast<std::size_t>(tokens[r]) * hidden;
  for (int k = static_cast<int>(threadIdx.x); k < hidden; k += static_cast<int>(blockDim.x)) {
    x[static_cast<std::size_t>(r) * hidden + k] = row[k];
  }
}

// out[r][n] = act(bias[n] + sum_k w[n][k] * x[r][k]), k ascending; act: 0 none, 1 softsign.
// bias may be null (0). Launch: grid = (ceil(out_dim / generator_threads), rows).
template <int Activation>
__global__ void generator_dense_kernel(const float* __restrict__ x, int in_dim, const float* __restrict__ w,
                                       const float* __restrict__ bias, int out_dim, float* __restrict__ out) {
  const int n = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int r = static_cast<int>(blockIdx.y);
  if (n >= out_dim) return;
  const float* xr = x + static_cast<std::size_t>(r) * in_dim;
  const float* wn = w + static_cast<std::size_t>(n) * in_dim;
  float acc = bias != nullptr ? bias[n] : 0.0f;
  for (int k = 0; k < in_dim; ++k) acc = __fadd_rn(acc, __fmul_rn(wn[k], xr[k]));
  if (Activation == 1) {
    const float d = __fadd_rn(1.0f, fabsf(acc));
    acc = __fdiv_rn(acc, d);
  }
  out[static_cast<std::size_t>(r) * out_dim + n] = acc;
}

// For each lane l and unit d: h = decay[d] * h + keep[d] * u[r][d] for the lane's rows
// r = offsets[l] .. offsets[l+1]-1 in order. Launch: grid = (ceil(hidden / threads), lanes).
template <int Unused = 0>
__global__ void generator_recurrence_kernel(float* __restrict__ hidden_states, int hidden,
                                                   const float* __restrict__ decay, const float* __restrict__ keep,
                                                   const float* __restrict__ u, const std::uint32_t* __restrict__ offsets) {
  const int d = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int l = static_cast<int>(blockIdx.y);
  if (d >= hidden) return;
  float h = hidden_states[static_cast<std::size_t>(l) * hidden + d];
  for (std::uint32_t r = offsets[l]; r < offsets[l + 1]; ++r) {
    const float p = __fmul_rn(decay[d], h);
    const float q = __fmul_rn(keep[d], u[static_cast<std::size_t>(r) * hidden + d]);
    h = __fadd_rn(p, q);
  }
  hidden_states[static_cast<std::size_t>(l) * hidden + d] = h;
}

// x[e][k] = hidden_states[emitting[e]][k]. Launch: grid = emitting lanes, block = threads.
template <int Unused = 0>
__global__ void generator_select_kernel(const float* __restrict__ hidden_states, int hidden,
                                               const std::uint32_t* __restrict__ emitting, float* __restrict__ x) {
  const int e = static_cast<int>(blockIdx.x);
  const float* h = hidden_states + static_cast<std::size_t>(emitting[e]) * hidden;
  for (int k = static_cast<int>(threadIdx.x); k < hidden; k += static_cast<int>(blockDim.x)) {
    x[static_cast<std::size_t>(e) * hidden + k] = h[k];
  }
}

}  // namespace kernels

// The generator's weights on a device and its decode step there.
//
// Thread-safety: step() and step_sequences() use this object's buffers: one step at a time
// per DeviceGenerator (make one per stream for concurrent steps). Exceptions: the
// constructor throws CudaError (no device, out of memory); step throws CudaError and what
// reference::Generator::step throws for bad lanes.
class DeviceGenerator {
 public:
  // Uploads cpu's weights (about 10 MiB at the default size) to `device`; blocks for the
  // copies. cpu must outlive this object. Throws CudaError.
  explicit DeviceGenerator(const reference::Generator& cpu, int device = 0) : cpu_(&cpu), device_(device) {
    TAILBATCH_CUDA_CHECK_IN("DeviceGenerator", cudaSetDevice(device));
    const reference::GeneratorWeights w = cpu.weights();
    try {
      embeddings_ = upload(w.embeddings);
      w_in_ = upload(w.w_in);
      b_in_ = upload(w.b_in);
      decay_ = upload(w.decay);
      keep_ = upload(w.keep);
      w_out_ = upload(w.w_out);
      b_out_ = upload(w.b_out);
      w_vocab_ = upload(w.w_vocab);
    } catch (const CudaError& e) {
      throw CudaError("DeviceGenerator: uploading the weights to device " + std::to_string(device), e);
    }
  }

  // The same contract as reference::Generator::step, on `stream`: feeds each lane's tokens,
  // then samples the emitting lanes (on the host, with the CPU twin's sample()); logits_out
  // as there. Blocks until the device is done. Throws std::invalid_argument (a token outside
  // the vocabulary or a lane without a state, before anything is enqueued), CudaError.
  void step(std::span<reference::GeneratorLane> lanes, cudaStream_t stream = nullptr, std::span<float> logits_out = {}) {
    const std::size_t H = cpu_->config().hidden_dim;
    const std::size_t V = cpu_->config().vocab_size;
    if (lanes.empty()) return;
    std::size_t rows = 0, emitting = 0;
    for (auto& lane : lanes) {
      if (!lane.state) tailbatch::detail::throw_invalid_argument("DeviceGenerator::step: lane without a state");
      if (lane.state->hidden.size() != H) lane.state->hidden.assign(H, 0.0f);
      for (std::int32_t t : lane.feed) {
        if (t < 0 || static_cast<std::size_t>(t) >= V)
          tailbatch::detail::throw_invalid_argument("DeviceGenerator::step: token " + std::to_string(t) + " outside the vocabulary");
      }
      rows += lane.feed.size();
      emitting += lane.emit ? 1 : 0;
    }
    if (!logits_out.empty() && logits_out.size() < emitting * V)
      tailbatch::detail::throw_invalid_argument("DeviceGenerator::step: logits_out is too small");
    const std::size_t L = lanes.size();

    // Host staging: [offsets L+1][emitting E][tokens R] [hidden L*H] [logits E*V].
    Layout lay = layout(L, rows, emitting);
    host_.reserve(lay.host_total);
    dev_.reserve(lay.device_total);
    std::byte* h = static_cast<std::byte*>(host_.data());
    auto* h_offsets = reinterpret_cast<std::uint32_t*>(h + lay.offsets);
    auto* h_emitting = reinterpret_cast<std::uint32_t*>(h + lay.emitting);
    auto* h_tokens = reinterpret_cast<std::int32_t*>(h + lay.tokens);
    auto* h_hidden = reinterpret_cast<float*>(h + lay.hidden);
    std::uint32_t at = 0, e = 0;
    for (std::size_t l = 0; l < L; ++l) {
      h_offsets[l] = at;
      for (std::int32_t t : lanes[l].feed) h_tokens[at++] = t;
      if (lanes[l].emit) h_emitting[e++] = static_cast<std::uint32_t>(l);
      std::memcpy(h_hidden + l * H, lanes[l].state->hidden.data(), H * sizeof(float));
    }
    h_offsets[L] = at;

    std::byte* d = static_cast<std::byte*>(dev_.data());
    auto* d_offsets = reinterpret_cast<std::uint32_t*>(d + lay.offsets);
    auto* d_emitting = reinterpret_cast<std::uint32_t*>(d + lay.emitting);
    auto* d_tokens = reinterpret_cast<std::int32_t*>(d + lay.tokens);
    auto* d_hidden = reinterpret_cast<float*>(d + lay.hidden);
    auto* d_logits = reinterpret_cast<float*>(d + lay.logits);
    auto* d_x = reinterpret_cast<float*>(d + lay.x);
    auto* d_u = reinterpret_cast<float*>(d + lay.u);

    const int Hi = static_cast<int>(H);
    const int Vi = static_cast<int>(V);
    constexpr int T = kernels::generator_threads;
    const unsigned h_blocks = static_cast<unsigned>((H + T - 1) / T);
    TAILBATCH_CUDA_CHECK(cudaMemcpyAsync(d, h, lay.logits, cudaMemcpyHostToDevice, stream));
    if (rows > 0) {
      kernels::generator_gather_kernel<<<static_cast<unsigned>(rows), T, 0, stream>>>(embeddings_.as<float>(), Hi,
                                                                                     d_tokens, d_x);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
      kernels::generator_dense_kernel<1><<<dim3(h_blocks, static_cast<unsigned>(rows)), T, 0, stream>>>(
          d_x, Hi, w_in_.as<float>(), b_in_.as<float>(), Hi, d_u);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
      kernels::generator_recurrence_kernel<><<<dim3(h_blocks, static_cast<unsigned>(L)), T, 0, stream>>>(
          d_hidden, Hi, decay_.as<float>(), keep_.as<float>(), d_u, d_offsets);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
    }
    if (emitting > 0) {
      kernels::generator_select_kernel<><<<static_cast<unsigned>(emitting), T, 0, stream>>>(d_hidden, Hi, d_emitting,
                                                                                         d_x);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
      kernels::generator_dense_kernel<1><<<dim3(h_blocks, static_cast<unsigned>(emitting)), T, 0, stream>>>(
          d_x, Hi, w_out_.as<float>(), b_out_.as<float>(), Hi, d_u);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
      kernels::generator_dense_kernel<0>
          <<<dim3(static_cast<unsigned>((V + T - 1) / T), static_cast<unsigned>(emitting)), T, 0, stream>>>(
              d_u, Hi, w_vocab_.as<float>(), nullptr, Vi, d_logits);
      TAILBATCH_CUDA_CHECK(cudaGetLastError());
    }
    TAILBATCH_CUDA_CHECK(cudaMemcpyAsync(h + lay.hidden, d_hidden, lay.host_total - lay.hidden, cudaMemcpyDeviceToHost,
                                         stream));
    TAILBATCH_CUDA_CHECK(cudaStreamSynchronize(stream));

    const auto* h_logits = reinterpret_cast<const float*>(h + lay.logits);
    e = 0;
    for (std::size_t l = 0; l < L; ++l) {
      auto& lane = lanes[l];
      std::memcpy(lane.state->hidden.data(), h_hidden + l * H, H * sizeof(float));
      if (!lane.emit) continue;
      const std::span<const float> z(h_logits + static_cast<std::size_t>(e) * V, V);
      lane.token = cpu_->sample(z, *lane.state);
      lane.state->next_input = lane.token;
      if (!logits_out.empty()) std::copy(z.begin(), z.end(), logits_out.begin() + static_cast<std::ptrdiff_t>(e * V));
      ++e;
    }
  }

  // The step function for a ContinuousBatcher<std::int32_t, reference::GeneratorState>, as
  // reference::Generator::step_sequences, on `stream`. Not thread-safe: one step at a time.
  template <class Sequence>
  void step_sequences(std::span<Sequence> batch, cudaStream_t stream = nullptr) {
    reference::step_sequences_through_lanes(batch, lanes_, cpu_->config().eos_token,
                                            [&](std::span<reference::GeneratorLane> lanes) { step(lanes, stream); });
  }

  // The CPU twin whose weights these are. Thread-safe.
  [[nodiscard]] const reference::Generator& cpu() const noexcept { return *cpu_; }
  // The device holding the weights. Thread-safe.
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  struct Layout {
    std::size_t offsets = 0, emitting = 0, tokens = 0, hidden = 0, logits = 0, host_total = 0;
    std::size_t x = 0, u = 0, device_total = 0;
  };

  static std::size_t align_up(std::size_t n) noexcept { return (n + 255) / 256 * 256; }

  // The host staging and the device scratch share offsets up to host_total; the device
  // adds the activations after it.
  [[nodiscard]] Layout layout(std::size_t lanes, std::size_t rows, std::size_t emitting) const noexcept {
    const std::size_t H = cpu_->config().hidden_dim;
    const std::size_t V = cpu_->config().vocab_size;
    Layout l;
    l.emitting = align_up((lanes + 1) * sizeof(std::uint32_t));
    l.tokens = l.emitting + align_up(emitting * sizeof(std::uint32_t) + 1);
    l.hidden = l.tokens + align_up(rows * sizeof(std::int32_t) + 1);
    l.logits = l.hidden + align_up(lanes * H * sizeof(float));
    l.host_total = l.logits + align_up(emitting * V * sizeof(float) + 1);
    const std::size_t widest = std::max(rows, emitting);
    l.x = l.host_total;
    l.u = l.x + align_up(widest * H * sizeof(float) + 1);
    l.device_total = l.u + align_up(widest * H * sizeof(float) + 1);
    return l;
  }

  static DeviceBuffer upload(std::span<const float> host) {
    DeviceBuffer d(host.size_bytes());
    TAILBATCH_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
    return d;
  }

  const reference::Generator* cpu_;
  int device_;
  DeviceBuffer embeddings_, w_in_, b_in_, decay_, keep_, w_out_, b_out_, w_vocab_;
  PinnedBuffer host_;
  DeviceBuffer dev_;
  std::vector<reference::GeneratorLane> lanes_;
};

}  // namespace tailbatch::cuda
