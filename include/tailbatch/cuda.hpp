// tailbatch's CUDA subtree: StreamPool (CUDA streams as execution lanes), FallbackLanes
// (streams when a GPU can be used, host lanes otherwise), the error-checking macro and the
// RAII owners of streams, events and buffers; under nvcc also the reference classifier's
// kernels and its CUDA adapter, and the reference generator's kernels (DeviceGenerator).
//
// The core umbrella <tailbatch/tailbatch.hpp> never includes this: only code that opts in
// sees <cuda_runtime.h>. Link tailbatch::cuda (CUDA::cudart). The parts outside
// `#if defined(__CUDACC__)` compile with a plain C++ compiler too, so a .cpp file can run
// a Pipeline on a StreamPool whose model calls kernels compiled elsewhere.
#pragma once

#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/fallback_lanes.hpp>
#include <tailbatch/cuda/resources.hpp>
#include <tailbatch/cuda/stream_pool.hpp>

#if defined(__CUDACC__)
#include <tailbatch/cuda/classifier.hpp>
#include <tailbatch/cuda/classifier_kernels.cuh>
#include <tailbatch/cuda/generator_kernels.cuh>
#endif
