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

# Sanitized builds: line tables only (-g1: a report's stack still names functions, files and
# lines) at -O0 (TAILBATCH_SANITIZE_OPT). On 2 cores, from clean, against -g -O1: the asan
# preset's build and tests 6.9 min instead of 11.2, the tsan preset's 4.6 instead of 6.7 (the
# tests run 2-4x slower unoptimised, the build is 2-3x faster). What -O0 gives up: speed,
# and UBSan's object-size check, which clang runs only with optimisation (AddressSanitizer
# still catches an access outside its allocation). -DTAILBATCH_SANITIZE_OPT=-O1 (one flag)
# restores both.
set(TAILBATCH_SANITIZE_OPT "-O0" CACHE STRING "Optimization level of the sanitized builds")
if(TAILBATCH_SANITIZE STREQUAL "thread")
  target_compile_options(tailbatch_dev INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -g1 ${TAILBATCH_SANITIZE_OPT}>)
  target_link_options(tailbatch_dev INTERFACE -fsanitize=thread)
  target_compile_definitions(tailbatch_dev INTERFACE TAILBATCH_TEST_SANITIZED=1)
elseif(TAILBATCH_SANITIZE STREQUAL "address")
  target_compile_options(tailbatch_dev INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1
                             ${TAILBATCH_SANITIZE_OPT}>)
  target_link_options(tailbatch_dev INTERFACE -fsanitize=address,undefined)
  target_compile_definitions(tailbatch_dev INTERFACE TAILBATCH_TEST_SANITIZED=1)
elseif(NOT TAILBATCH_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TAILBATCH_SANITIZE must be '', 'thread' or 'address', not '${TAILBATCH_SANITIZE}'")
endif()

# fmt serves examples, CLIs and report writers; the core headers never include it.
if(TAILBATCH_BUILD_EXAMPLES OR TAILBATCH_BUILD_BENCHMARKS OR TAILBATCH_BUILD_TESTS)
  find_package(fmt REQUIRED)
endif()

# tailbatch_add_programs(OUT_VAR var [PREFIX p] [EXCLUDE regex] GLOB pattern... LINK target...
#                        [INCLUDE dir...])
# One executable per file matching the GLOB patterns, named after the file (with PREFIX:
# benchmarks/cuda/bench_x.cu builds cuda_bench_x), linked to LINK, with INCLUDE as private
# include directories; files whose path matches EXCLUDE are left out. The names go to OUT_VAR. Used by tests/, examples/ and benchmarks/,
# whose programs are one file each.
function(tailbatch_add_programs)
  cmake_parse_arguments(P "" "OUT_VAR;PREFIX;EXCLUDE" "GLOB;LINK;INCLUDE" ${ARGN})
  file(GLOB _sources CONFIGURE_DEPENDS ${P_GLOB})
  if(P_EXCLUDE)
    list(FILTER _sources EXCLUDE REGEX "${P_EXCLUDE}")
  endif()
  set(_names)
  foreach(_src IN LISTS _sources)
    get_filename_component(_name ${_src} NAME_WE)
    set(_name ${P_PREFIX}${_name})
    add_executable(${_name} ${_src})
    target_link_libraries(${_name} PRIVATE ${P_LINK})
    if(P_INCLUDE)
      target_include_directories(${_name} PRIVATE ${P_INCLUDE})
    endif()
    list(APPEND _names ${_name})
  endforeach()
  if(P_OUT_VAR)
    set(${P_OUT_VAR} ${_names} PARENT_SCOPE)
  endif()
endfunction()

# Includes every *.cmake file of the calling directory (the extra registrations of tests/,
# examples/ and benchmarks/), in name order. A macro, so that they run in the caller's scope.
# Under a sanitizer (TAILBATCH_SANITIZE) the files named in SKIP_UNDER_SANITIZERS (stems,
# e.g. header_check) are left out: checks that only compile or read files, which a
# sanitizer cannot make find anything more, and which the plain build already runs.
macro(tailbatch_include_extras)
  cmake_parse_arguments(_tie "" "" "SKIP_UNDER_SANITIZERS" ${ARGN})
  file(GLOB _tailbatch_extras CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cmake)
  foreach(_extra IN LISTS _tailbatch_extras)
    get_filename_component(_tie_stem ${_extra} NAME_WE)
    if(NOT TAILBATCH_SANITIZE STREQUAL "" AND _tie_stem IN_LIST _tie_SKIP_UNDER_SANITIZERS)
      continue()
    endif()
    include(${_extra})
  endforeach()
endmacro()
include(${CMAKE_CURRENT_LIST_DIR}/TailbatchTorch.cmake)
