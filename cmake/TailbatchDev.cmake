# Settings for tailbatch's own tests, examples and benchmarks. Consumers never see these:
# nothing here touches the tailbatch target itself.

# Warnings as errors for the project's own code, under g++ and clang (and nvcc's host side).
add_library(tailbatch_dev INTERFACE)
target_link_libraries(tailbatch_dev INTERFACE tailbatch::tailbatch)
# The project's own CUDA files are C++20; where CMake cannot express that as the cuda_std_20
# compile feature (CMake 3.25 with nvcc 12/13), say it to nvcc here, for our targets only.
if(TAILBATCH_HAS_CUDA AND NOT TAILBATCH_CUDA_STD_FEATURE)
  target_compile_options(tailbatch_dev INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endif()
target_compile_options(tailbatch_dev INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra -Werror=all-warnings>)

if(TAILBATCH_SANITIZE STREQUAL "thread")
  target_compile_options(tailbatch_dev INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -g -O1>)
  target_link_options(tailbatch_dev INTERFACE -fsanitize=thread)
  target_compile_definitions(tailbatch_dev INTERFACE TAILBATCH_TEST_SANITIZED=1)
elseif(TAILBATCH_SANITIZE STREQUAL "address")
  target_compile_options(tailbatch_dev INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1>)
  target_link_options(tailbatch_dev INTERFACE -fsanitize=address,undefined)
  target_compile_definitions(tailbatch_dev INTERFACE TAILBATCH_TEST_SANITIZED=1)
elseif(NOT TAILBATCH_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TAILBATCH_SANITIZE must be '', 'thread' or 'address', not '${TAILBATCH_SANITIZE}'")
endif()

# fmt serves examples, CLIs and report writers; the core headers never include it.
if(TAILBATCH_BUILD_EXAMPLES OR TAILBATCH_BUILD_BENCHMARKS OR TAILBATCH_BUILD_TESTS)
  find_package(fmt REQUIRED)
endif()
include(${CMAKE_CURRENT_LIST_DIR}/TailbatchTorch.cmake)
