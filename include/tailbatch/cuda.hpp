// tailbatch's CUDA subtree (tailbatch::cuda): StreamPool (CUDA streams as execution lanes),
// FallbackLanes (streams when a GPU can be used, host lanes otherwise), the error-checking
// macro and the RAII owners of streams, events and buffers. Runs a Pipeline's batches
// on CUDA streams; its tests have run on an NVIDIA H200 (docs/stream-pool.md).
//
// The core umbrella <tailbatch/tailbatch.hpp> never includes this: only code that opts in
// sees <cuda_runtime.h>. Link tailbatch::cuda (CUDA::cudart). Everything here compiles with
// a plain C++ compiler too, so a .cpp file can run a Pipeline on a StreamPool whose model
// calls kernels compiled elsewhere. The reference models' kernels and CUDA classifier are
// not part of it: <tailbatch/reference/cuda/...> (tailbatch::reference).
#pragma once

#include <tailbatch/cuda/error.hpp>
#include <tailbatch/cuda/fallback_lanes.hpp>
#include <tailbatch/cuda/resources.hpp>
#include <tailbatch/cuda/stream_pool.hpp>
