// The reference classifier's CPU kernels. Machinery for classifier.hpp; no user names it.
//
// Every kernel fixes the order of the floating-point operations of each request: a sum
// over k is always bias, then + x[0]*w[0], then + x[1]*w[1], ..., each product rounded to
// float before it is added. SIMD lanes run across outputs (hidden units), never across the
// terms of one sum, and items of a batch never share a sum; so a request's result does not
// depend on the batch it rides in, on its position there, or on which of the kernels below
// ran. The CUDA kernels (tailbatch/reference/cuda/classifier_kernels.cuh) follow the same order with
// __fmul_rn/__fadd_rn.
//
// Fused multiply-add would round once instead of twice and break that sameness wherever
// the compiler fuses in one place and not in another (GCC fuses by default in GNU mode on
// targets with FMA, which AVX-512 is). Under GCC, keep_rounded() pins every product in a
// register with an empty asm statement, which the compiler cannot see through, so it can
// never be fused with the add that follows; it costs no instruction. Clang fuses only
// within one expression by default, and the kernels say `fp contract(off)` besides. Do not
// build them with -ffast-math, or with clang's -ffp-contract=fast (which overrides pragmas).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if !defined(TAILBATCH_DETAIL_VECTOR_EXT)
#if defined(__GNUC__) || defined(__clang__)
#define TAILBATCH_DETAIL_VECTOR_EXT 1
#else
#define TAILBATCH_DETAIL_VECTOR_EXT 0
#endif
#endif
#if TAILBATCH_DETAIL_VECTOR_EXT && defined(__x86_64__)
#define TAILBATCH_DETAIL_X86_DISPATCH 1
#else
#define TAILBATCH_DETAIL_X86_DISPATCH 0
#endif

namespace tailbatch::reference::detail {

// Hidden units per weight panel: the first layer's weights are stored panel by panel, each
// panel holding [k][32] for 32 consecutive hidden units, so that one GPU warp reads a row
// of a panel in one 128-byte transaction and the CPU streams panels contiguously.
inline constexpr std::size_t panel_width = 32;
// Partial sums per logit of the output layer (a warp's lanes on the GPU).
inline constexpr std::size_t output_lanes = 32;
inline constexpr std::size_t label_count = 3;

// The order in which the 32 partial sums of a logit are added: the tree a warp's
// __shfl_down_sync reduction builds (offsets 16, 8, 4, 2, 1).
inline float reduce_partials(float (&p)[output_lanes]) noexcept {
  for (std::size_t off = output_lanes / 2; off >= 1; off /= 2) {
    for (std::size_t j = 0; j < off; ++j) p[j] = p[j] + p[j + off];
  }
  return p[0];
}

// Softmax over the three logits, in float: subtract the max, exponentiate, divide by the
// sum taken in label order.
inline void softmax3(const float* logits, float* probabilities) noexcept {
  float m = logits[0];
  for (std::size_t l = 1; l < label_count; ++l) m = logits[l] > m ? logits[l] : m;
  float e[label_count];
  float sum = 0.0f;
  for (std::size_t l = 0; l < label_count; ++l) {
    e[l] = std::exp(logits[l] - m);
    sum = sum + e[l];
  }
  for (std::size_t l = 0; l < label_count; ++l) probabilities[l] = e[l] / sum;
}

#if TAILBATCH_DETAIL_VECTOR_EXT

using f32x4 = float __attribute__((vector_size(16)));
using f32x8 = float __attribute__((vector_size(32)));
using f32x16 = float __attribute__((vector_size(64)));

#if defined(__clang__)
// Clang checks an asm operand's size against the target of the function template, not of
// the caller it is inlined into, so it gets the pragma instead of the barrier.
#define TAILBATCH_DETAIL_NO_CONTRACT _Pragma("clang fp contract(off)")
template <class V>
[[gnu::always_inline]] inline void keep_rounded(V&) noexcept {}
#else
#define TAILBATCH_DETAIL_NO_CONTRACT
template <class V>
[[gnu::always_inline]] inline void keep_rounded(V& v) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v));
#elif defined(__aarch64__) || defined(__arm__)
  asm("" : "+w"(v));
#else
  asm("" : "+m"(v));
#endif
}
#endif

// Loads and stores through references: passing a wide vector by value to or from a
// function would change the ABI between targets (and GCC warns about it).
template <class V>
[[gnu::always_inline]] inline void load(V& v, const float* p) noexcept {
  std::memcpy(&v, p, sizeof(V));
}

template <class V>
[[gnu::always_inline]] inline void store(float* p, const V& v) noexcept {
  std::memcpy(p, &v, sizeof(V));
}

// NB items x (NV vectors of columns) of one panel: out = relu(bias + sum_k x[k] * w[k]).
template <class V, std::size_t NV, std::size_t NB>
[[gnu::always_inline]] inline void dense_relu_tile(const float* x, std::size_t in_dim, const float* panel,
                                                   std::size_t c0, const float* bias, float* out,
                                                   std::size_t out_stride) noexcept {
  TAILBATCH_DETAIL_NO_CONTRACT
  constexpr std::size_t lanes = sizeof(V) / sizeof(float);
  V acc[NB][NV];
  for (std::size_t v = 0; v < NV; ++v) {
    V b;
    load(b, bias + c0 + v * lanes);
    for (std::size_t i = 0; i < NB; ++i) acc[i][v] = b;
  }
  for (std::size_t k = 0; k < in_dim; ++k) {
    V w[NV];
    for (std::size_t v = 0; v < NV; ++v) load(w[v], panel + k * panel_width + c0 + v * lanes);
    for (std::size_t i = 0; i < NB; ++i) {
      const V xv = V{} + x[i * in_dim + k];
      for (std::size_t v = 0; v < NV; ++v) {
        V p = xv * w[v];
        keep_rounded(p);
        acc[i][v] = acc[i][v] + p;
      }
    }
  }
  const V zero{};
  for (std::size_t i = 0; i < NB; ++i) {
    for (std::size_t v = 0; v < NV; ++v) {
      const V r = acc[i][v] > zero ? acc[i][v] : zero;
      store(out + i * out_stride + c0 + v * lanes, r);
    }
  }
}

// The first layer over a batch: for each panel, for each group of NB items, for each
// column chunk. A panel (in_dim x 32 floats) stays in L1 while every item of the batch
// reads it: batch 1 streams the weights from memory, a batch reuses each panel row for
// all of its items.
template <class V, std::size_t NV, std::size_t NB>
[[gnu::always_inline]] inline void dense_relu_impl(const float* x, std::size_t batch, std::size_t in_dim,
                                                   const float* panels, const float* bias,
                                                   std::size_t out_dim, float* out) noexcept {
  constexpr std::size_t cols = NV * sizeof(V) / sizeof(float);
  static_assert(panel_width % cols == 0);
  for (std::size_t p = 0; p < out_dim / panel_width; ++p) {
    const float* panel = panels + p * in_dim * panel_width;
    const float* pb = bias + p * panel_width;
    float* po = out + p * panel_width;
    for (std::size_t c0 = 0; c0 < panel_width; c0 += cols) {
      std::size_t i = 0;
      for (; i + NB <= batch; i += NB) {
        dense_relu_tile<V, NV, NB>(x + i * in_dim, in_dim, panel, c0, pb, po + i * out_dim, out_dim);
      }
      for (; i < batch; ++i) {
        dense_relu_tile<V, NV, 1>(x + i * in_dim, in_dim, panel, c0, pb, po + i * out_dim, out_dim);
      }
    }
  }
}

inline void dense_relu_portable(const float* x, std::size_t batch, std::size_t in_dim, const float* panels,
                                const float* bias, std::size_t out_dim, float* out) noexcept {
  dense_relu_impl<f32x4, 4, 2>(x, batch, in_dim, panels, bias, out_dim, out);
}

#if TAILBATCH_DETAIL_X86_DISPATCH
[[gnu::target("avx2")]] inline void dense_relu_avx2(const float* x, std::size_t batch, std::size_t in_dim,
                                                    const float* panels, const float* bias, std::size_t out_dim,
                                                    float* out) noexcept {
  dense_relu_impl<f32x8, 2, 4>(x, batch, in_dim, panels, bias, out_dim, out);
}

[[gnu::target("avx512f")]] inline void dense_relu_avx512(const float* x, std::size_t batch, std::size_t in_dim,
                                                         const float* panels, const float* bias,
                                                         std::size_t out_dim, float* out) noexcept {
  dense_relu_impl<f32x16, 2, 4>(x, batch, in_dim, panels, bias, out_dim, out);
}

inline bool cpu_has_avx2() noexcept { return __builtin_cpu_supports("avx2"); }
inline bool cpu_has_avx512() noexcept { return __builtin_cpu_supports("avx512f"); }
#else
inline bool cpu_has_avx2() noexcept { return false; }
inline bool cpu_has_avx512() noexcept { return false; }
#endif

// x = mean of the embedding rows of the tokens, summed in token order.
inline void embedding_bag(const float* table, std::size_t dim, std::span<const std::uint32_t> tokens,
                          float* x) noexcept {
  constexpr std::size_t lanes = 4;
  for (std::size_t k = 0; k < dim; k += lanes) {
    f32x4 sum{};
    for (std::uint32_t t : tokens) {
      f32x4 row;
      load(row, table + std::size_t{t} * dim + k);
      sum = sum + row;
    }
    if (!tokens.empty()) sum = sum / static_cast<float>(tokens.size());
    store(x + k, sum);
  }
}

// The three logits of one item: 32 strided partial sums per label, then the warp's tree.
inline void output_logits(const float* hidden, std::size_t dim, const float* w2, const float* b2,
                          float* logits) noexcept {
  TAILBATCH_DETAIL_NO_CONTRACT
  constexpr std::size_t lanes = 4;
  constexpr std::size_t nv = output_lanes / lanes;
  for (std::size_t l = 0; l < label_count; ++l) {
    const float* w = w2 + l * dim;
    f32x4 acc[nv] = {};
    for (std::size_t i = 0; i < dim; i += output_lanes) {
      for (std::size_t v = 0; v < nv; ++v) {
        f32x4 a, b;
        load(a, hidden + i + v * lanes);
        load(b, w + i + v * lanes);
        f32x4 p = a * b;
        keep_rounded(p);
        acc[v] = acc[v] + p;
      }
    }
    float partial[output_lanes];
    for (std::size_t v = 0; v < nv; ++v) store(partial + v * lanes, acc[v]);
    logits[l] = b2[l] + reduce_partials(partial);
  }
}

#else  // no vector extensions: the same order in plain loops

inline bool cpu_has_avx2() noexcept { return false; }
inline bool cpu_has_avx512() noexcept { return false; }

inline void dense_relu_portable(const float* x, std::size_t batch, std::size_t in_dim, const float* panels,
                                const float* bias, std::size_t out_dim, float* out) noexcept {
  for (std::size_t p = 0; p < out_dim / panel_width; ++p) {
    const float* panel = panels + p * in_dim * panel_width;
    for (std::size_t i = 0; i < batch; ++i) {
      float acc[panel_width];
      for (std::size_t j = 0; j < panel_width; ++j) acc[j] = bias[p * panel_width + j];
      for (std::size_t k = 0; k < in_dim; ++k) {
        const float xv = x[i * in_dim + k];
        for (std::size_t j = 0; j < panel_width; ++j) {
          const float prod = xv * panel[k * panel_width + j];
          acc[j] = acc[j] + prod;
        }
      }
      for (std::size_t j = 0; j < panel_width; ++j) {
        out[i * out_dim + p * panel_width + j] = acc[j] > 0.0f ? acc[j] : 0.0f;
      }
    }
  }
}

inline void embedding_bag(const float* table, std::size_t dim, std::span<const std::uint32_t> tokens,
                          float* x) noexcept {
  for (std::size_t k = 0; k < dim; ++k) {
    float sum = 0.0f;
    for (std::uint32_t t : tokens) sum = sum + table[std::size_t{t} * dim + k];
    x[k] = tokens.empty() ? 0.0f : sum / static_cast<float>(tokens.size());
  }
}

inline void output_logits(const float* hidden, std::size_t dim, const float* w2, const float* b2,
                          float* logits) noexcept {
  for (std::size_t l = 0; l < label_count; ++l) {
    float partial[output_lanes] = {};
    for (std::size_t i = 0; i < dim; i += output_lanes) {
      for (std::size_t j = 0; j < output_lanes; ++j) {
        const float prod = hidden[i + j] * w2[l * dim + i + j];
        partial[j] = partial[j] + prod;
      }
    }
    logits[l] = b2[l] + reduce_partials(partial);
  }
}

#endif

}  // namespace tailbatch::reference::detail
