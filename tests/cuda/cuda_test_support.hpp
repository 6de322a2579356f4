// A minimal harness for the CUDA tests (compiled by nvcc, without Catch2): CHECK records a
// failure and carries on; finish() returns the exit code; skip() prints why and exits 77,
// which ctest reports as skipped, never as passed.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace tailbatch::cuda_test {

inline int& failures() {
  static int n = 0;
  return n;
}

inline void check(bool ok, const char* what, const char* file, int line) {
  if (!ok) {
    ++failures();
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what);
  }
}

// Whether `text` contains `part`.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Prints the reason and exits with 77 (skipped).
[[noreturn]] inline void skip(const std::string& reason) {
  std::printf("SKIPPED: %s\n", reason.c_str());
  std::fflush(stdout);
  std::exit(77);
}

// The reason no CUDA device can be used here, or an empty string when one can.
inline std::string why_no_device() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    (void)cudaGetLastError();
    return "no CUDA driver is installed on this machine";
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")";
  }
  if (count == 0) return "no CUDA device found";
  return {};
}

inline int finish(const char* name) {
  if (failures() == 0) {
    std::printf("%s: all checks passed\n", name);
    return 0;
  }
  std::printf("%s: %d check(s) failed\n", name, failures());
  return 1;
}

}  // namespace tailbatch::cuda_test

// By its plain name in every CUDA test, as in the Catch2 tests (tailbatch_test.hpp).
using tailbatch::cuda_test::contains;

#define CHECK(cond) ::tailbatch::cuda_test::check(static_cast<bool>(cond), #cond, __FILE__, __LINE__)

// Runs the statement and CHECKs that it throws E.
#define CHECK_THROWS_AS(stmt, E)                                                    \
  do {                                                                              \
    bool tailbatch_threw_ = false;                                                  \
    try {                                                                           \
      stmt;                                                                         \
    } catch (const E&) {                                                            \
      tailbatch_threw_ = true;                                                      \
    } catch (...) {                                                                 \
    }                                                                               \
    ::tailbatch::cuda_test::check(tailbatch_threw_, #stmt " throws " #E, __FILE__, __LINE__); \
  } while (false)
