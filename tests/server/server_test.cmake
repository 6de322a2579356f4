# What the ctests that drive tailbatch-serve and tailbatch-load --url share: whether those
# programs are built in this tree, and the registration of a test script of tests/server/.
# Included by tests/serving.cmake, openai.cmake, http_load.cmake, libtorch.cmake,
# prometheus.cmake and deploy.cmake.
include_guard(GLOBAL)

set(_tailbatch_server_tests_dir ${CMAKE_CURRENT_LIST_DIR})

# tailbatch_serve_buildable(<out_var>): TRUE where examples/server.cmake builds tailbatch-serve
# (and tools/cli builds tailbatch-load --url): examples on, Boost, nlohmann-json and CLI11
# found (examples/server.cmake says which is missing). tests/ is configured before
# examples/ and tools/cli/: this looks for what the targets need, not for the targets.
function(tailbatch_serve_buildable out_var)
  set(_buildable FALSE)
  if(TAILBATCH_BUILD_EXAMPLES)
    find_package(Boost 1.70 QUIET)
    find_package(nlohmann_json 3 QUIET)
    find_package(CLI11 QUIET)
    if(Boost_FOUND AND nlohmann_json_FOUND AND CLI11_FOUND)
      set(_buildable TRUE)
    endif()
  endif()
  set(${out_var} ${_buildable} PARENT_SCOPE)
endfunction()

# tailbatch_server_test(NAME name SCRIPT test_x.py ARGS a b LABELS l1 l2 TIMEOUT s
#                       [SKIP_RETURN_CODE rc] [NEEDS program ...])
# The ctest NAME runs `python3 tests/server/<SCRIPT> ARGS`. It is registered where
# tailbatch-serve is built (tailbatch_serve_buildable) and python3 and every program NEEDS
# names are found; where one is missing, a message says which.
function(tailbatch_server_test)
  cmake_parse_arguments(T "" "NAME;SCRIPT;TIMEOUT;SKIP_RETURN_CODE" "ARGS;LABELS;NEEDS" ${ARGN})
  tailbatch_serve_buildable(_buildable)
  if(NOT _buildable)
    return()
  endif()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(NOT Python3_Interpreter_FOUND)
    message(STATUS "tailbatch: not registering ${T_NAME}: it needs python3")
    return()
  endif()
  foreach(_program IN LISTS T_NEEDS)
    string(TOUPPER "TAILBATCH_${_program}" _var)
    find_program(${_var} ${_program})
    if(NOT ${_var})
      message(STATUS "tailbatch: not registering ${T_NAME}: it needs ${_program} (scripts/deps.sh --test)")
      return()
    endif()
  endforeach()
  add_test(NAME ${T_NAME} COMMAND ${Python3_EXECUTABLE} ${_tailbatch_server_tests_dir}/${T_SCRIPT} ${T_ARGS})
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
  if(DEFINED T_SKIP_RETURN_CODE)
    set_tests_properties(${T_NAME} PROPERTIES SKIP_RETURN_CODE ${T_SKIP_RETURN_CODE})
  endif()
endfunction()
