// The reference classifier's CUDA kernels: the same model as the CPU twin
// (tailbatch/reference/classifier.hpp), in the same order of operations.
//
// Compiled by the user's nvcc (this header is included from a .cu file). Every product
// and sum is written with __fmul_rn / __fadd_rn / __fdiv_rn, which nvcc never fuses into
// an FMA or replaces with an approximation, whatever -fmad or --use_fast_math say; so the
// logits are designed to be the IEEE float results of the same sequence of operations the
// CPU twin performs, equal to them bit for bit (tests/cuda/test_classifier_gpu.cu checks
// it; it passed on an NVIDIA H200). Only expf
// in the softmax differs from the host libm (by a few ulp), which is why the probabilities
// are compared within 1e-5.
//
// Batch invariance on the device (checked on an NVIDIA H200): an item's sums never mix
// with another item's (the
// embedding bag and the output layer give each item its own block or warp; the dense layer
// gives each (item, hidden unit) its own accumulator, whatever tile the item lands in).
//
// Layouts are the CPU twin's (see reference::ClassifierWeights).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tailbatch::cuda::kernels {

inline constexpr int warp_size = 32;
// Items per block of the dense kernel: each weight loaded is used for this many items.
inline constexpr int dense_items_per_block = 8;
// Warps (panels of 32 hidden units) per block of the dense kernel.
inline constexpr int dense_warps_per_block = 4;
// Items (one warp each) per block of the output kernel.
inline constexpr int output_items_per_block = 4;
inline constexpr int label_count = 3;

// x[b] = mean of the embedding rows of item b's tokens, summed in token order.
// Tokens of item b are tokens[offsets[b] .. offsets[b+1]).
// Launch: grid = batch, block = any multiple of 32 (256 suits embed_dim 256).
// (The kernels are templates so that a header included by several .cu files of one
// program defines each of them once.)
template <class TokenId = std::uint32_t>
__global__ void embedding_bag_kernel(const float* __restrict__ table, int dim, const TokenId* __restrict__ tokens,
                                     const std::uint32_t* __restrict__ offsets, float* __restrict__ x) {
  const int b = static_cast<int>(blockIdx.x);
  const std::uint32_t begin = offsets[b];
  const std::uint32_t end = offsets[b + 1];
  for (int k = static_cast<int>(threadIdx.x); k < dim; k += static_cast<int>(blockDim.x)) {
    float sum = 0.0f;
    for (std::uint32_t t = begin; t < end; ++t) {
      sum = __fadd_rn(sum, table[static_cast<std::size_t>(tokens[t]) * dim + k]);
    }
    x[static_cast<std::size_t>(b) * dim + k] = end > begin ? __fdiv_rn(sum, static_cast<float>(end - begin)) : 0.0f;
  }
}

// hidden[b][h] = relu(b1[h] + sum_k x[b][k] * w1(k, h)), k ascending.
// Launch: block = 32 * Warps threads, grid = (ceil(out_dim / (32 * Warps)), ceil(batch /
// Items)), dynamic shared memory = Items * in_dim * sizeof(float).
template <int Items = dense_items_per_block, int Warps = dense_warps_per_block>
__global__ void dense_relu_kernel(const float* __restrict__ x, int batch, int in_dim, const float* __restrict__ panels,
                                  const float* __restrict__ bias, int out_dim, float* __restrict__ out) {
  extern __shared__ float xs[];
  constexpr int tb = Items;
  const int item0 = static_cast<int>(blockIdx.y) * tb;
  const int rest = batch - item0;
  const int nb = rest < tb ? rest : tb;
  for (int i = static_cast<int>(threadIdx.x); i < nb * in_dim; i += static_cast<int>(blockDim.x)) {
    xs[i] = x[static_cast<std::size_t>(item0) * in_dim + i];
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const int panel = static_cast<int>(blockIdx.x) * Warps + warp;
  if (panel >= out_dim / warp_size) return;
  const int h = panel * warp_size + lane;
  const float* w = panels + static_cast<std::size_t>(panel) * in_dim * warp_size + lane;
  float acc[tb];
  const float b = bias[h];
#pragma unroll
  for (int t = 0; t < tb; ++t) acc[t] = b;
  if (nb == tb) {
    for (int k = 0; k < in_dim; ++k) {
      const float wk = w[static_cast<std::size_t>(k) * warp_size];
#pragma unroll
      for (int t = 0; t < tb; ++t) acc[t] = __fadd_rn(acc[t], __fmul_rn(xs[t * in_dim + k], wk));
    }
  } else {
    for (int k = 0; k < in_dim; ++k) {
      const float wk = w[static_cast<std::size_t>(k) * warp_size];
#pragma unroll
      for (int t = 0; t < tb; ++t) {
        if (t < nb) acc[t] = __fadd_rn(acc[t], __fmul_rn(xs[t * in_dim + k], wk));
      }
    }
  }
#pragma unroll
  for (int t = 0; t < tb; ++t) {
    if (t < nb) out[static_cast<std::size_t>(item0 + t) * out_dim + h] = acc[t] > 0.0f ? acc[t] : 0.0f;
  }
}

// logits[b][l] = b2[l] + tree(partials), where lane j's partial sums elements j, j+32, ...
// of hidden[b] * w2[l] in order and the tree is __shfl_down_sync's (offsets 16..1); then
// the softmax. Launch: block = 32 * Items, grid = ceil(batch / Items).
template <int Items = output_items_per_block>
__global__ void output_softmax_kernel(const float* __restrict__ hidden, int batch, int dim, const float* __restrict__ w2,
                                      const float* __restrict__ b2, float* __restrict__ logits,
                                      float* __restrict__ probabilities) {
  const int item = static_cast<int>(blockIdx.x) * Items + static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  if (item >= batch) return;  // a whole warp leaves together
  const float* hrow = hidden + static_cast<std::size_t>(item) * dim;
  float z[label_count];
#pragma unroll
  for (int l = 0; l < label_count; ++l) {
    const float* wrow = w2 + static_cast<std::size_t>(l) * dim;
    float p = 0.0f;
    for (int i = lane; i < dim; i += warp_size) p = __fadd_rn(p, __fmul_rn(hrow[i], wrow[i]));
#pragma unroll
    for (int off = warp_size / 2; off >= 1; off /= 2) p = __fadd_rn(p, __shfl_down_sync(0xffffffffu, p, off));
    z[l] = __fadd_rn(b2[l], p);
  }
  if (lane != 0) return;
  float m = z[0];
#pragma unroll
  for (int l = 1; l < label_count; ++l) m = z[l] > m ? z[l] : m;
  float e[label_count];
  float sum = 0.0f;
#pragma unroll
  for (int l = 0; l < label_count; ++l) {
    e[l] = expf(__fsub_rn(z[l], m));
    sum = __fadd_rn(sum, e[l]);
  }
#pragma unroll
  for (int l = 0; l < label_count; ++l) {
    logits[static_cast<std::size_t>(item) * label_count + l] = z[l];
    probabilities[static_cast<std::size_t>(item) * label_count + l] = __fdiv_rn(e[l], sum);
  }
}

}  // namespace tailbatch::cuda::kernels
