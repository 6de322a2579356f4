# libtorch, optional: examples/libtorch/, its tests (ctest label libtorch) and bench_libtorch
# are built only where find_package(Torch) succeeds (Debian: libtorch-dev, which
# `scripts/deps.sh --all` installs). Where it is absent, configure says so once.
# Not under the sanitizers: libtorch and its OpenMP runtime are not instrumented.
set(TAILBATCH_HAS_TORCH OFF)
if(NOT TAILBATCH_SANITIZE STREQUAL "")
  message(STATUS "tailbatch: libtorch targets not built under TAILBATCH_SANITIZE=${TAILBATCH_SANITIZE}")
else()
  find_package(Torch QUIET)
  if(Torch_FOUND)
    set(TAILBATCH_HAS_TORCH ON)
    message(STATUS "tailbatch: libtorch ${Torch_VERSION} found: building examples/libtorch, its tests (label libtorch) and bench_libtorch")
    # The example's headers and libtorch, its headers as SYSTEM so that the project's
    # -Werror applies to our code only.
    add_library(tailbatch_libtorch_example INTERFACE)
    target_include_directories(tailbatch_libtorch_example INTERFACE ${PROJECT_SOURCE_DIR}/examples/libtorch)
    target_include_directories(tailbatch_libtorch_example SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
    target_link_libraries(tailbatch_libtorch_example INTERFACE ${TORCH_LIBRARIES} tailbatch_dev tailbatch::reference)
  else()
    message(STATUS "tailbatch: libtorch not found: examples/libtorch, its tests (label libtorch) and bench_libtorch are not built (scripts/deps.sh --all installs libtorch-dev)")
  endif()
endif()
