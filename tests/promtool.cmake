# `promtool check metrics` on what tailbatch's components really emit:
# tests/metrics_exposition_main.cpp constructs the Pipeline, the ConcurrencyLimiter, the
# ContinuousBatcher, a TokenStreamer and the registry's latency histograms with their metrics
# on one MetricsRegistry (and, where CUDA is enabled, cuda::FallbackLanes), drives a little
# traffic through each on a ManualClock, and prints the exposition. It must be valid text
# format 0.0.4 and pass promtool's lint (HELP on every family, `_total` on counters, base
# units, snake_case, histogram buckets, ...). The program also fails if a component did not
# behave as driven. It runs twice: latency as Prometheus histograms (the registry's
# default: every latency family must be a `histogram` with `_bucket` lines) and as
# summaries (LatencyExport::summary, `--summary`: no histogram left).
#
# promtool comes with Debian's `prometheus` package, which `scripts/deps.sh --test`
# installs (scripts/test.sh runs it first). Where promtool is missing the test FAILS and
# says how to install it: a lint that did not run must never look like one that passed.
#
# A second test, `prometheus_rules`, checks the recording and alerting rules under
# deploy/prometheus/: `promtool check rules`, then `promtool test rules` on every unit test
# in deploy/prometheus/tests/ (each burn-rate alert fires on a series that burns the error
# budget and stays quiet on one that does not), and yamllint --strict where it is installed.
#
# This file plays two parts: included by tests/CMakeLists.txt it registers the program
# and the tests; run by a test with `cmake -P` it runs the program, then promtool (or, with
# -DRULES=dir, checks and tests the rules).

if(CMAKE_SCRIPT_MODE_FILE AND RULES)
  find_program(_promtool promtool)
  if(NOT _promtool)
    message(FATAL_ERROR "promtool not found, so the rules were not checked. Install Debian's "
                        "prometheus package (scripts/deps.sh --test) and run the test again.")
  endif()
  file(GLOB _rules ${RULES}/*.yaml)
  file(GLOB _unit_tests ${RULES}/tests/*.yaml)
  if(NOT _rules OR NOT _unit_tests)
    message(FATAL_ERROR "no rules (${RULES}/*.yaml) or no unit tests (${RULES}/tests/*.yaml)")
  endif()
  execute_process(COMMAND ${_promtool} check rules ${_rules} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  message("${_out}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "promtool check rules failed (exit ${_rc})")
  endif()
  execute_process(COMMAND ${_promtool} test rules ${_unit_tests} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  message("${_out}")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "promtool test rules failed (exit ${_rc})")
  endif()
  find_program(_yamllint yamllint)
  if(_yamllint)
    execute_process(COMMAND ${_yamllint} --strict -c ${RULES}/.yamllint ${_rules} ${_unit_tests}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "yamllint rejected the rules (exit ${_rc}):\n${_out}")
    endif()
    message("yamllint: the rules and their unit tests are clean")
  else()
    message("yamllint not found: the rules were checked by promtool only (Debian's yamllint adds the lint)")
  endif()
elseif(CMAKE_SCRIPT_MODE_FILE)
  find_program(_promtool promtool)
  if(NOT _promtool)
    message(FATAL_ERROR "promtool not found, so the exposition was not checked. Install Debian's "
                        "prometheus package (scripts/deps.sh --test) and run the test again.")
  endif()
  string(REPLACE "@@" ";" _families "${FAMILIES}")
  foreach(_mode histogram summary)
    set(_output ${OUTPUT}.${_mode}.prom)
    set(_args)
    if(_mode STREQUAL "summary")
      set(_args --summary)
    endif()
    execute_process(COMMAND ${PROGRAM} ${_args} OUTPUT_FILE ${_output} RESULT_VARIABLE _rc)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "${PROGRAM} ${_args} failed (${_rc})")
    endif()
    execute_process(COMMAND ${_promtool} check metrics INPUT_FILE ${_output}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    file(READ ${_output} _text)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "promtool check metrics rejected the exposition (exit ${_rc}):\n"
                          "${_out}\n--- exposition (${_output}) ---\n${_text}")
    endif()
    # Every component's families are there (a component that registered nothing would
    # otherwise pass the lint unnoticed).
    foreach(_family IN LISTS _families)
      if(NOT _text MATCHES "# TYPE ${_family} ")
        message(FATAL_ERROR "the exposition has no ${_family} family:\n${_text}")
      endif()
    endforeach()
    # Latency is exported one way only, as asked; as histograms with the SLO's extra bound.
    if(_mode STREQUAL "histogram")
      if(_text MATCHES "# TYPE [a-z_]+ summary")
        message(FATAL_ERROR "a summary is left in the histogram exposition:\n${_text}")
      endif()
      if(NOT _text MATCHES "tailbatch_server_request_seconds_bucket{route=\"classify\",le=\"0.15\"} [0-9]+\n")
        message(FATAL_ERROR "no le=\"0.15\" bucket in the histogram exposition:\n${_text}")
      endif()
    elseif(_text MATCHES "# TYPE [a-z_]+ histogram" OR _text MATCHES "_bucket{")
      message(FATAL_ERROR "a histogram is left in the summary exposition:\n${_text}")
    endif()
    string(LENGTH "${_text}" _len)
    message("promtool check metrics accepted ${_output} (${_len} bytes)")
  endforeach()
else()
  add_executable(metrics_exposition_main ${CMAKE_CURRENT_LIST_DIR}/metrics_exposition_main.cpp)
  target_link_libraries(metrics_exposition_main PRIVATE tailbatch_dev)
  # One family per component, checked to be present.
  set(_families
      tailbatch_pipeline_requests_total tailbatch_pipeline_queue_depth tailbatch_pipeline_end_to_end_seconds
      tailbatch_limiter_rejections_total tailbatch_limiter_limit tailbatch_limiter_window_rtt_seconds
      tailbatch_generation_sequences_total tailbatch_generation_active_sequences
      tailbatch_generation_time_to_first_token_seconds tailbatch_generation_tokens_total
      tailbatch_server_request_seconds)
  if(TAILBATCH_HAS_CUDA)
    # cuda::FallbackLanes includes <cuda_runtime.h> and links the CUDA runtime: linted only
    # where CUDA is enabled. Without a GPU it falls back and exports its fallback gauge.
    target_link_libraries(metrics_exposition_main PRIVATE tailbatch::cuda)
    target_compile_definitions(metrics_exposition_main PRIVATE TAILBATCH_EXPOSITION_CUDA=1)
    list(APPEND _families tailbatch_lanes_host_fallback)
  endif()
  list(JOIN _families "@@" _families_arg)  # a ';' would not survive add_test
  add_test(NAME promtool_check_metrics
           COMMAND ${CMAKE_COMMAND}
                   -DPROGRAM=$<TARGET_FILE:metrics_exposition_main>
                   -DOUTPUT=${CMAKE_CURRENT_BINARY_DIR}/metrics_exposition
                   "-DFAMILIES=${_families_arg}"
                   -P ${CMAKE_CURRENT_LIST_FILE})
  set_tests_properties(promtool_check_metrics PROPERTIES LABELS unit TIMEOUT 120)

  add_test(NAME prometheus_rules
           COMMAND ${CMAKE_COMMAND} -DRULES=${PROJECT_SOURCE_DIR}/deploy/prometheus -P ${CMAKE_CURRENT_LIST_FILE})
  set_tests_properties(prometheus_rules PROPERTIES LABELS "unit;deploy" TIMEOUT 120)
endif()
