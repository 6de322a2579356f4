# Every public header of the three include roots (include/ the core, tools/include/ the
# tools, reference/include/ the reference models) compiles on its own, twice in one TU (its
# guard works), and cleanly under the warnings a strict consumer builds with:
#
#   test_headers_standalone   one TU per header, built with the project's compiler and the
#                             strict flags below; building it is the check.
#   test_headers_strict       all of them in one TU under the other compiler of g++ and
#                             clang++ (-fsyntax-only, the strict flags): both compilers hold
#                             every header to the strict flags, whichever builds the project.
#   test_cuda_headers_standalone  (CUDA only) the CUDA subtree alone, and the umbrella under nvcc.
#
# This file plays two parts: included by tests/CMakeLists.txt it registers the targets and
# tests; run by test_headers_strict with `cmake -P` it runs the compilers.

set(_tailbatch_strict_flags -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion -Werror)

if(CMAKE_SCRIPT_MODE_FILE)
  string(REPLACE "@@" ";" _compilers "${COMPILERS}")
  string(REPLACE "@@" ";" _tus "${TUS}")
  string(REPLACE "@@" ";" _args "${ARGS}")
  set(_ran 0)
  set(_failed "")
  foreach(_cxx IN LISTS _compilers)
    if(NOT _cxx OR NOT EXISTS "${_cxx}")
      continue()
    endif()
    foreach(_tu IN LISTS _tus)
      execute_process(COMMAND ${_cxx} -std=c++20 -fsyntax-only ${_tailbatch_strict_flags} ${_args} ${_tu}
                      RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
      math(EXPR _ran "${_ran} + 1")
      if(NOT _rc EQUAL 0)
        list(APPEND _failed "${_cxx} ${_tu}")
        message("--- ${_cxx} on ${_tu}:\n${_out}")
      else()
        message("${_cxx}: ${_tu}: clean")
      endif()
    endforeach()
  endforeach()
  if(_ran EQUAL 0)
    # The test's SKIP_REGULAR_EXPRESSION matches this line: ctest reports "Skipped".
    message("TAILBATCH_SKIP: no second compiler (g++ or clang++) was found")
  elseif(_failed)
    message(FATAL_ERROR "public headers warn under ${_tailbatch_strict_flags}: ${_failed}")
  endif()
  return()
endif()

# Headers (spelled as included, e.g. tailbatch/pipeline.hpp) that still warn under the strict
# flags. They, and every header that includes them, are checked under the project's usual
# flags only until they are fixed; the configure step lists what is left out. Keep it empty.
set(_tailbatch_strict_pending)

set(_hc_dir ${CMAKE_CURRENT_BINARY_DIR}/header_check)
set(_hc_roots ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/tools/include
              ${PROJECT_SOURCE_DIR}/reference/include)

# Every header, with the root it lives in and the tailbatch headers it includes.
set(_hc_headers)
foreach(_root IN LISTS _hc_roots)
  file(GLOB_RECURSE _found CONFIGURE_DEPENDS RELATIVE ${_root}
       ${_root}/tailbatch/*.hpp ${_root}/tailbatch/*.cuh)
  foreach(_h IN LISTS _found)
    list(APPEND _hc_headers ${_h})
    set(_hc_root_${_h} ${_root})
    file(STRINGS ${_root}/${_h} _lines REGEX "^#include <tailbatch/")
    set(_deps)
    foreach(_line IN LISTS _lines)
      string(REGEX MATCH "<(tailbatch/[^>]+)>" _ "${_line}")
      list(APPEND _deps ${CMAKE_MATCH_1})
    endforeach()
    set(_hc_deps_${_h} ${_deps})
  endforeach()
endforeach()

# A header that includes a pending one is pending too (its TU would show the same warnings).
set(_hc_pending ${_tailbatch_strict_pending})
set(_changed TRUE)
while(_changed)
  set(_changed FALSE)
  foreach(_h IN LISTS _hc_headers)
    if(_h IN_LIST _hc_pending)
      continue()
    endif()
    foreach(_d IN LISTS _hc_deps_${_h})
      if(_d IN_LIST _hc_pending)
        list(APPEND _hc_pending ${_h})
        set(_changed TRUE)
        break()
      endif()
    endforeach()
  endforeach()
endwhile()
if(_hc_pending)
  list(JOIN _hc_pending ", " _pending_text)
  message(STATUS "tailbatch: headers not yet held to the strict warnings: ${_pending_text}")
endif()

set(_core_checks)
set(_cuda_checks)
set(_strict_includes)       # every strict header except the CUDA subtree
set(_strict_cuda_includes)  # the CUDA subtree's host-only headers
foreach(_h IN LISTS _hc_headers)
  string(MAKE_C_IDENTIFIER ${_h} _id)
  set(_strict TRUE)
  if(_h IN_LIST _hc_pending)
    set(_strict FALSE)
  endif()
  if(_h MATCHES "^tailbatch/(reference/)?cuda[/.]" OR _h MATCHES "\\.cuh$")
    if(NOT TAILBATCH_HAS_CUDA)
      continue()
    endif()
    # Headers with device code compile under nvcc; the CUDA subtree's host-only headers
    # (error checking, RAII owners, the stream pool) under the host compiler, which is how
    # a plain .cpp file uses them, and far quicker to check.
    file(READ ${_hc_root_${_h}}/${_h} _text)
    if(_h MATCHES "\\.cuh$" OR _text MATCHES "__global__|__device__|<<<")
      set(_tu ${_hc_dir}/${_id}.cu)
    else()
      set(_tu ${_hc_dir}/${_id}.cpp)
      if(_strict)
        string(APPEND _strict_cuda_includes "#include <${_h}>\n")
      endif()
    endif()
    list(APPEND _cuda_checks ${_tu})
  else()
    set(_tu ${_hc_dir}/${_id}.cpp)
    list(APPEND _core_checks ${_tu})
    if(_strict)
      set_source_files_properties(${_tu} PROPERTIES COMPILE_OPTIONS "${_tailbatch_strict_flags}")
      string(APPEND _strict_includes "#include <${_h}>\n")
    endif()
  endif()
  file(CONFIGURE OUTPUT ${_tu} CONTENT "#include <${_h}>\n#include <${_h}>\n")
endforeach()
file(CONFIGURE OUTPUT ${_hc_dir}/main.cpp CONTENT "int main() { return 0; }\n")
add_executable(test_headers_standalone ${_core_checks} ${_hc_dir}/main.cpp)
target_link_libraries(test_headers_standalone PRIVATE tailbatch_dev tailbatch::tools tailbatch::reference)
add_test(NAME test_headers_standalone COMMAND test_headers_standalone)

# Both compilers, whichever one builds the project.
file(CONFIGURE OUTPUT ${_hc_dir}/strict_all.cpp CONTENT "${_strict_includes}")
set(_strict_tus ${_hc_dir}/strict_all.cpp)
set(_strict_args)
foreach(_root IN LISTS _hc_roots)
  list(APPEND _strict_args -I${_root})
endforeach()
if(TAILBATCH_HAS_CUDA AND _strict_cuda_includes)
  file(CONFIGURE OUTPUT ${_hc_dir}/strict_cuda_host.cpp CONTENT "${_strict_cuda_includes}")
  list(APPEND _strict_tus ${_hc_dir}/strict_cuda_host.cpp)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _strict_args -isystem ${_dir})
  endforeach()
endif()
# The build's own compiler already checked each header above; the test runs the other one.
set(_strict_compilers)
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  find_program(TAILBATCH_GXX NAMES g++ g++-12 DOC "g++ for test_headers_strict")
  list(APPEND _strict_compilers ${TAILBATCH_GXX})
endif()
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  find_program(TAILBATCH_CLANGXX NAMES clang++ clang++-14 DOC "clang++ for test_headers_strict")
  list(APPEND _strict_compilers ${TAILBATCH_CLANGXX})
endif()
list(JOIN _strict_compilers "@@" _compilers_arg)
list(JOIN _strict_tus "@@" _tus_arg)
list(JOIN _strict_args "@@" _args_arg)
add_test(NAME test_headers_strict
         COMMAND ${CMAKE_COMMAND} "-DCOMPILERS=${_compilers_arg}"
                 "-DTUS=${_tus_arg}" "-DARGS=${_args_arg}" -P ${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(test_headers_strict PROPERTIES SKIP_REGULAR_EXPRESSION "TAILBATCH_SKIP: "
                                                    LABELS unit TIMEOUT 300)

if(TAILBATCH_HAS_CUDA)
  # The CUDA headers alone, and the core umbrella header under nvcc.
  file(CONFIGURE OUTPUT ${_hc_dir}/umbrella_under_nvcc.cu
       CONTENT "#include <tailbatch/tailbatch.hpp>\n#include <tailbatch/cuda.hpp>\nint main() { return 0; }\n")
  add_executable(test_cuda_headers_standalone ${_cuda_checks} ${_hc_dir}/umbrella_under_nvcc.cu)
  target_link_libraries(test_cuda_headers_standalone PRIVATE tailbatch::cuda tailbatch::reference tailbatch_dev)
  add_test(NAME test_cuda_headers_standalone COMMAND test_cuda_headers_standalone)
  set_tests_properties(test_cuda_headers_standalone PROPERTIES LABELS cuda)
endif()
