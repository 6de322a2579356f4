// The reference generator's CPU kernels. Machinery for generator.hpp; no user names it.
//
// The rules of detail/cpu_kernels.hpp hold here too: every output of a dense layer is
// bias, then + w[0]*x[0], then + w[1]*x[1], ... in k order, each product rounded to float
// before it is added (keep_rounded / TAILBATCH_DETAIL_NO_CONTRACT keep the compiler from
// fusing a multiply-add). Here SIMD lanes run across the rows of a batch (sequences, or
// prompt tokens), 16 to a group, and every lane performs the same operations in the same
// order; rows never share a sum. So a sequence's numbers do not depend on the batch it
// rides in, on its lane, or on the vector width of the kernel, and the CUDA kernels
// (tailbatch/reference/cuda/generator_kernels.cuh) reproduce them with __fmul_rn/__fadd_rn/__fdiv_rn.
#pragma once

#include <cstddef>
#include <cstring>

#include <tailbatch/reference/detail/cpu_kernels.hpp>

namespace tailbatch::reference::detail {

// What a dense layer applies to each output.
enum class GenActivation { none, softsign };

// softsign(x) = x / (1 + |x|): bounded like tanh, built from exactly rounded operations
// only, so that every platform computes the same bits.
[[nodiscard]] inline float gen_softsign(float x) noexcept {
  const float a = x < 0.0f ? -x : x;
  const float d = 1.0f + a;
  return x / d;
}

// h = decay * h + keep * u, element by element (the recurrent state update), each product
// rounded before the add.
inline void gen_blend(float* h, const float* decay, const float* keep, const float* u, std::size_t n) noexcept {
#if TAILBATCH_DETAIL_VECTOR_EXT
  TAILBATCH_DETAIL_NO_CONTRACT
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    f32x4 hv, dv, kv, uv;
    load(hv, h + i);
    load(dv, decay + i);
    load(kv, keep + i);
    load(uv, u + i);
    f32x4 p = dv * hv;
    keep_rounded(p);
    f32x4 q = kv * uv;
    keep_rounded(q);
    store(h + i, p + q);
  }
  for (; i < n; ++i) {
    f32x4 hv{}, dv{}, kv{}, uv{};
    hv[0] = h[i];
    dv[0] = decay[i];
    kv[0] = keep[i];
    uv[0] = u[i];
    f32x4 p = dv * hv;
    keep_rounded(p);
    f32x4 q = kv * uv;
    keep_rounded(q);
    h[i] = (p + q)[0];
  }
#else
  for (std::size_t i = 0; i < n; ++i) {
    const float p = decay[i] * h[i];
    const float q = keep[i] * u[i];
    h[i] = p + q;
  }
#endif
}

// Sequences (or prompt tokens) per lane group: one AVX-512 register of floats, as a GPU warp
// runs its threads. A dense layer computes a whole group at once, so a step over 1 to 16
// rows reads each weight once and costs the same; more rows add groups.
inline constexpr std::size_t gen_group = 16;

#if TAILBATCH_DETAIL_VECTOR_EXT

// Every lane of v = s, as one broadcast (`V{} + s` would cost an add, and GCC builds a
// lane-by-lane splat through memory). Through a reference: returning a wide vector would
// change the ABI between targets.
template <class V>
[[gnu::always_inline]] inline void gen_splat(V& v, float s) noexcept {
  const V t{s};
  if constexpr (sizeof(V) == 16) {
    v = __builtin_shufflevector(t, t, 0, 0, 0, 0);
  } else if constexpr (sizeof(V) == 32) {
    v = __builtin_shufflevector(t, t, 0, 0, 0, 0, 0, 0, 0, 0);
  } else {
    static_assert(sizeof(V) == 64);
    v = __builtin_shufflevector(t, t, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  }
}

// GCC 12 reports the accumulators below as maybe-uninitialized once the splat's shuffle
// is inlined into a target-specific function; every one is written before it is read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// out_t[n][16] = act(bias[n] + sum_k w[n][k] * x_t[k][16]) for NN outputs n0.. at a time:
// the 16 rows of a group ride in the lanes of NV vectors; each weight is loaded once and
// broadcast to all of them.
template <class V, std::size_t NN>
[[gnu::always_inline]] inline void gen_dense_impl(const float* xt, std::size_t in_dim, const float* w,
                                                  const float* bias, std::size_t out_dim, float* out_t,
                                                  GenActivation act) noexcept {
  TAILBATCH_DETAIL_NO_CONTRACT
  constexpr std::size_t lanes = sizeof(V) / sizeof(float);
  constexpr std::size_t NV = gen_group / lanes;
  static_assert(gen_group % lanes == 0);
  const V zero{};
  V one;
  gen_splat(one, 1.0f);
  for (std::size_t n0 = 0; n0 < out_dim; n0 += NN) {
    V acc[NN][NV];
    for (std::size_t j = 0; j < NN; ++j) {
      V b;
      gen_splat(b, bias ? bias[n0 + j] : 0.0f);
      for (std::size_t v = 0; v < NV; ++v) acc[j][v] = b;
    }
    const float* row = w + n0 * in_dim;
    for (std::size_t k = 0; k < in_dim; ++k) {
      V x[NV];
      for (std::size_t v = 0; v < NV; ++v) load(x[v], xt + k * gen_group + v * lanes);
      for (std::size_t j = 0; j < NN; ++j) {
        V wv;
        gen_splat(wv, row[j * in_dim + k]);
        for (std::size_t v = 0; v < NV; ++v) {
          V p = wv * x[v];
          keep_rounded(p);
          acc[j][v] = acc[j][v] + p;
        }
      }
    }
    for (std::size_t j = 0; j < NN; ++j) {
      for (std::size_t v = 0; v < NV; ++v) {
        V r = acc[j][v];
        if (act == GenActivation::softsign) {
          const V a = r < zero ? -r : r;
          const V d = one + a;
          r = r / d;
        }
        store(out_t + (n0 + j) * gen_group + v * lanes, r);
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

inline void gen_dense_portable(const float* xt, std::size_t in_dim, const float* w, const float* bias,
                               std::size_t out_dim, float* out_t, GenActivation act) noexcept {
  gen_dense_impl<f32x4, 2>(xt, in_dim, w, bias, out_dim, out_t, act);
}

#if TAILBATCH_DETAIL_X86_DISPATCH
[[gnu::target("avx2")]] inline void gen_dense_avx2(const float* xt, std::size_t in_dim, const float* w,
                                                   const float* bias, std::size_t out_dim, float* out_t,
                                                   GenActivation act) noexcept {
  gen_dense_impl<f32x8, 4>(xt, in_dim, w, bias, out_dim, out_t, act);
}

[[gnu::target("avx512f")]] inline void gen_dense_avx512(const float* xt, std::size_t in_dim, const float* w,
                                                        const float* bias, std::size_t out_dim, float* out_t,
                                                        GenActivation act) noexcept {
  gen_dense_impl<f32x16, 8>(xt, in_dim, w, bias, out_dim, out_t, act);
}
#endif

#else  // no vector extensions: the same order in plain loops

inline void gen_dense_portable(const float* xt, std::size_t in_dim, const float* w, const float* bias,
                               std::size_t out_dim, float* out_t, GenActivation act) noexcept {
  for (std::size_t n = 0; n < out_dim; ++n) {
    float acc[gen_group];
    for (std::size_t l = 0; l < gen_group; ++l) acc[l] = bias ? bias[n] : 0.0f;
    for (std::size_t k = 0; k < in_dim; ++k) {
      const float wv = w[n * in_dim + k];
      for (std::size_t l = 0; l < gen_group; ++l) {
        const float prod = wv * xt[k * gen_group + l];
        acc[l] = acc[l] + prod;
      }
    }
    for (std::size_t l = 0; l < gen_group; ++l) {
      out_t[n * gen_group + l] = act == GenActivation::softsign ? gen_softsign(acc[l]) : acc[l];
    }
  }
}

#endif

}  // namespace tailbatch::reference::detail
