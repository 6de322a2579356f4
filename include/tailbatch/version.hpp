// tailbatch: the library's version, in one place.
// CMake reads these three macros to version the package.
#pragma once

#define TAILBATCH_VERSION_MAJOR 0
#define TAILBATCH_VERSION_MINOR 1
#define TAILBATCH_VERSION_PATCH 0

// One integer that grows with every release: major * 10000 + minor * 100 + patch.
#define TAILBATCH_VERSION \
  (TAILBATCH_VERSION_MAJOR * 10000 + TAILBATCH_VERSION_MINOR * 100 + TAILBATCH_VERSION_PATCH)

namespace tailbatch {

struct Version {
  int major;
  int minor;
  int patch;
};

// The version of the headers this translation unit was compiled against. Thread-safe.
inline constexpr Version version{TAILBATCH_VERSION_MAJOR, TAILBATCH_VERSION_MINOR,
                                 TAILBATCH_VERSION_PATCH};

}  // namespace tailbatch
