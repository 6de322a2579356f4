// CUDA runtime errors as exceptions.
//
// TAILBATCH_CUDA_CHECK(call) evaluates a CUDA runtime call and, when it does not return
// cudaSuccess, throws tailbatch::cuda::CudaError carrying the error's name
// (cudaGetErrorName), its message (cudaGetErrorString), the call's text and file:line:
//
//   cudaErrorMemoryAllocation: out of memory (cudaMalloc(&p, bytes) at stream_pool.hpp:120)
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace tailbatch::cuda {

// A CUDA runtime call failed. what() is "<name>: <message> (<call> at <file>:<line>)",
// prefixed with the component when one is given. Copyable; thread-safe to read.
class CudaError : public std::runtime_error {
 public:
  // Builds the message (allocates). Thread-safe.
  CudaError(cudaError_t code, std::string_view call, const char* file, int line, std::string_view context = {})
      : std::runtime_error(format(code, call, file, line, context)), code_(code) {}

  // inner's error, its message prefixed with context ("StreamPool: creating lanes: ...").
  // Allocates. Thread-safe.
  CudaError(std::string_view context, const CudaError& inner)
      : std::runtime_error(std::string(context) + ": " + inner.what()), code_(inner.code()) {}

  // The runtime's error code. Thread-safe.
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }
  // The code's name, e.g. "cudaErrorNoDevice". Thread-safe.
  [[nodiscard]] const char* name() const noexcept { return cudaGetErrorName(code_); }

 private:
  static std::string format(cudaError_t code, std::string_view call, const char* file, int line,
                            std::string_view context) {
    std::string s;
    if (!context.empty()) {
      s += context;
      s += ": ";
    }
    s += cudaGetErrorName(code);
    s += ": ";
    s += cudaGetErrorString(code);
    s += " (";
    s += call;
    s += " at ";
    std::string_view f = file;
    if (const auto slash = f.find_last_of("/\\"); slash != std::string_view::npos) f.remove_prefix(slash + 1);
    s += f;
    s += ':';
    s += std::to_string(line);
    s += ')';
    return s;
  }

  cudaError_t code_;
};

namespace detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line,
                                          std::string_view context = {}) {
  // A failed launch or call can leave the error pending for the next cudaGetLastError();
  // clear it so that it is reported once, here.
  (void)cudaGetLastError();
  throw CudaError(code, call, file, line, context);
}

}  // namespace detail
}  // namespace tailbatch::cuda

// Throws tailbatch::cuda::CudaError unless `call` returns cudaSuccess.
#define TAILBATCH_CUDA_CHECK(call)                                                             \
  do {                                                                                         \
    const cudaError_t tailbatch_cuda_status_ = (call);                                         \
    if (tailbatch_cuda_status_ != cudaSuccess) {                                               \
      ::tailbatch::cuda::detail::throw_cuda_error(tailbatch_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                          \
  } while (false)

// As TAILBATCH_CUDA_CHECK, with the component's name in front of the message
// ("StreamPool: cudaErrorNoDevice: ...").
#define TAILBATCH_CUDA_CHECK_IN(context, call)                                                 \
  do {                                                                                         \
    const cudaError_t tailbatch_cuda_status_ = (call);                                         \
    if (tailbatch_cuda_status_ != cudaSuccess) {                                               \
      ::tailbatch::cuda::detail::throw_cuda_error(tailbatch_cuda_status_, #call, __FILE__, __LINE__, \
                                                  (context));                                  \
    }                                                                                          \
  } while (false)
