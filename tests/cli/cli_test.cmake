# tailbatch_cli_test: one ctest that runs a command-line tool and checks its exit code and
# output (tests/cli/expect.cmake does the checking). Shared by tests/cli.cmake and
# tests/load_cli.cmake.
include_guard(GLOBAL)

# tailbatch_cli_test(NAME tool RC rc ARGS a b c EXPECT re re [FORBID re])
function(tailbatch_cli_test name tool)
  cmake_parse_arguments(T "" "RC" "ARGS;EXPECT;FORBID" ${ARGN})
  list(JOIN T_ARGS "@@" _args)
  list(JOIN T_EXPECT "@@" _expect)
  set(_cmd "$<TARGET_FILE:${tool}>")
  if(_args)
    set(_cmd "${_cmd}@@${_args}")
  endif()
  set(_defs -DCOMMAND=${_cmd} -DEXPECT_RC=${T_RC} -DEXPECT=${_expect}
            -DWORKDIR=${CMAKE_CURRENT_BINARY_DIR}/cli_${name})
  if(T_FORBID)
    list(JOIN T_FORBID "@@" _forbid)
    list(APPEND _defs -DFORBID=${_forbid})
  endif()
  add_test(NAME cli_${name} COMMAND ${CMAKE_COMMAND} ${_defs} -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.cmake)
  set_tests_properties(cli_${name} PROPERTIES LABELS cli TIMEOUT 120)
endfunction()
