# `promtool check metrics` on the exposition that tests/metrics_exposition_main.cpp writes:
# MetricsRegistry::prometheus() must be valid text format 0.0.4 and pass promtool's lint
# (HELP on every family, `_total` on counters, base units, snake_case, ...). promtool comes
# with Debian's `prometheus` package, which `scripts/deps.sh --test` installs; where it is
# missing the test prints why and ctest reports it skipped, never passed.
#
# This file plays two parts: included by tests/CMakeLists.txt it registers the program
# and the test; run by that test with `cmake -P` it runs the program, then promtool.

if(CMAKE_SCRIPT_MODE_FILE)
  find_program(_promtool promtool)
  if(NOT _promtool)
    # The test's SKIP_REGULAR_EXPRESSION matches this line: ctest reports "Skipped".
    message("TAILBATCH_SKIP: promtool not found, so the exposition is not checked. "
            "Install Debian's prometheus package (scripts/deps.sh --test) to run this test.")
  else()
    execute_process(COMMAND ${PROGRAM} OUTPUT_FILE ${OUTPUT} RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "${PROGRAM} failed (${_rc})")
    endif()
    execute_process(COMMAND ${_promtool} check metrics INPUT_FILE ${OUTPUT}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    file(READ ${OUTPUT} _text)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "promtool check metrics rejected the exposition (exit ${_rc}):\n"
                          "${_out}\n--- exposition (${OUTPUT}) ---\n${_text}")
    endif()
    string(LENGTH "${_text}" _len)
    message("promtool check metrics accepted ${OUTPUT} (${_len} bytes)")
  endif()
else()
  add_executable(metrics_exposition_main ${CMAKE_CURRENT_LIST_DIR}/metrics_exposition_main.cpp)
  target_link_libraries(metrics_exposition_main PRIVATE tailbatch_dev)
  add_test(NAME promtool_check_metrics
           COMMAND ${CMAKE_COMMAND}
                   -DPROGRAM=$<TARGET_FILE:metrics_exposition_main>
                   -DOUTPUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_exposition.prom
                   -P ${CMAKE_CURRENT_LIST_FILE})
  set_tests_properties(promtool_check_metrics PROPERTIES
                       SKIP_REGULAR_EXPRESSION "TAILBATCH_SKIP: "
                       LABELS unit
                       TIMEOUT 120)
endif()
