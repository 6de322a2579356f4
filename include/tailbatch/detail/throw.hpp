// How tailbatch reports errors: the one place that throws, and the one place that catches.
//
// The policy: every core component works in a translation unit compiled with
// -fno-exceptions. Bad configuration and misuse are reported here: by exception where the
// translation unit has exceptions, by a message on stderr and std::abort() where it has
// none. What the library guards against at run time (a model call, a callback or a
// user-supplied function throwing; an allocation failing on a path that must not lose a
// request) is caught through call_guarded(), which without exceptions simply calls: nothing
// can throw there, and the recovery path compiles out.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

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

// As above, for a message built at run time.
[[noreturn]] inline void throw_invalid_argument(const std::string& what) { throw_invalid_argument(what.c_str()); }

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

// Throws E(what), or prints what and aborts without exceptions. E is a standard exception
// type constructible from a std::string (std::out_of_range, std::length_error, ...).
template <class E>
[[noreturn]] inline void throw_error(const std::string& what) {
  throw_or_abort<E>(what.c_str(), what);
}

// Calls body(). With exceptions, one that escapes it is caught and on_error(what) is
// called with its what() (nullptr for one not derived from std::exception); what
// on_error throws in turn is dropped. Returns whether body threw. Without exceptions
// this is body() and false: on_error is never called.
template <class Body, class OnError>
bool call_guarded(Body&& body, [[maybe_unused]] OnError&& on_error) noexcept {
#if TAILBATCH_HAS_EXCEPTIONS
  try {
    body();
    return false;
  } catch (const std::exception& e) {
    try {
      on_error(e.what());
    } catch (...) {
    }
  } catch (...) {
    try {
      on_error(static_cast<const char*>(nullptr));
    } catch (...) {
    }
  }
  return true;
#else
  body();
  return false;
#endif
}

}  // namespace tailbatch::detail
