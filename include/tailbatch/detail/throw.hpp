// How tailbatch reports bad configuration and misuse: by exception where the translation
// unit has exceptions, by a message on stderr and std::abort() where it was compiled with
// -fno-exceptions (so that components that support it stay usable there).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace tailbatch::detail {

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define TAILBATCH_HAS_EXCEPTIONS 1
#else
#define TAILBATCH_HAS_EXCEPTIONS 0
#endif

// Throws std::invalid_argument(what), or prints it and aborts without exceptions.
[[noreturn]] inline void throw_invalid_argument(const char* what) {
#if TAILBATCH_HAS_EXCEPTIONS
  throw std::invalid_argument(what);
#else
  std::fprintf(stderr, "tailbatch: invalid argument: %s\n", what);
  std::abort();
#endif
}

// Throws E(args...), or prints what and aborts without exceptions.
template <class E, class... Args>
[[noreturn]] inline void throw_or_abort([[maybe_unused]] const char* what,
                                         [[maybe_unused]] Args&&... args) {
#if TAILBATCH_HAS_EXCEPTIONS
  throw E(static_cast<Args&&>(args)...);
#else
  std::fprintf(stderr, "tailbatch: %s\n", what);
  std::abort();
#endif
}

}  // namespace tailbatch::detail
