# The Kubernetes manifests under deploy/kubernetes/, checked (label `deploy`):
#   * every file parses and passes yamllint (Debian's yamllint) with warnings as errors;
#   * every tailbatch metric name they reference is one that the real components export:
#     tests/deploy/exported_metrics.cpp builds a Pipeline, a ConcurrencyLimiter and an
#     Autoscaler on one MetricsRegistry, drives a little traffic and prints the exposition
#     (checked by promtool too, where it is installed);
#   * the Deployment's drain adds up: terminationGracePeriodSeconds covers the preStop
#     sleep plus --drain-timeout-ms, and the probes are /readyz and /healthz.
# Where yamllint is missing the test says why and ctest reports it skipped.
#
# This file plays two parts: included by tests/CMakeLists.txt it registers the program and
# the test; run by that test with `cmake -P` it does the checks.

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.21)  # policies for `cmake -P` (IN_LIST)
  find_program(_yamllint yamllint)
  if(NOT _yamllint)
    message("TAILBATCH_SKIP: yamllint not found, so the manifests are not checked. "
            "Install Debian's yamllint to run this test.")
    return()
  endif()
  file(GLOB _manifests ${MANIFESTS}/*.yaml)
  if(NOT _manifests)
    message(FATAL_ERROR "no manifests under ${MANIFESTS}")
  endif()
  execute_process(COMMAND ${_yamllint} --strict -c ${MANIFESTS}/.yamllint ${_manifests}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "yamllint rejected the manifests (exit ${_rc}):\n${_out}")
  endif()
  list(LENGTH _manifests _n)
  message("yamllint: ${_n} manifests clean")

  execute_process(COMMAND ${PROGRAM} OUTPUT_VARIABLE _expo RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} failed (${_rc})")
  endif()
  find_program(_promtool promtool)
  if(_promtool)
    file(WRITE ${OUTPUT} "${_expo}")
    execute_process(COMMAND ${_promtool} check metrics INPUT_FILE ${OUTPUT}
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(NOT _rc EQUAL 0)
      message(FATAL_ERROR "promtool check metrics rejected the exposition:\n${_out}")
    endif()
  endif()
  # Exported names: each family (# TYPE) and each sample name (summaries add _sum, _count).
  string(REGEX MATCHALL "# TYPE tailbatch_[a-z0-9_]+" _types "${_expo}")
  string(REGEX MATCHALL "\ntailbatch_[a-z0-9_]+" _samples "${_expo}")
  set(_exported)
  foreach(_t IN LISTS _types _samples)
    string(REGEX REPLACE "^(# TYPE |\n)" "" _t "${_t}")
    list(APPEND _exported ${_t})
  endforeach()
  list(REMOVE_DUPLICATES _exported)
  list(LENGTH _exported _n)
  message("exported: ${_n} metric names")

  set(_failed FALSE)
  set(_checked 0)
  foreach(_m IN LISTS _manifests)
    file(READ ${_m} _text)
    string(REGEX MATCHALL "tailbatch_[a-z0-9_]+" _refs "${_text}")
    list(REMOVE_DUPLICATES _refs)
    foreach(_r IN LISTS _refs)
      math(EXPR _checked "${_checked} + 1")
      if(NOT _r IN_LIST _exported)
        message(SEND_ERROR "${_m}: ${_r} is not a metric tailbatch exports")
        set(_failed TRUE)
      endif()
    endforeach()
  endforeach()
  if(_checked EQUAL 0)
    message(SEND_ERROR "the manifests reference no tailbatch metric at all")
    set(_failed TRUE)
  endif()
  message("referenced: ${_checked} metric names (counted per file), each looked up")

  file(READ ${MANIFESTS}/deployment.yaml _dep)
  foreach(_re "path: /readyz" "path: /healthz" "readinessProbe:" "livenessProbe:" "preStop:")
    if(NOT _dep MATCHES "${_re}")
      message(SEND_ERROR "deployment.yaml: no '${_re}'")
      set(_failed TRUE)
    endif()
  endforeach()
  if(_dep MATCHES "terminationGracePeriodSeconds: ([0-9]+)")
    set(_grace ${CMAKE_MATCH_1})
  endif()
  if(_dep MATCHES "--drain-timeout-ms=([0-9]+)")
    math(EXPR _drain_s "(${CMAKE_MATCH_1} + 999) / 1000")
  endif()
  if(_dep MATCHES "command: \\[\"sleep\", \"([0-9]+)\"\\]")
    set(_sleep ${CMAKE_MATCH_1})
  endif()
  if(NOT DEFINED _grace OR NOT DEFINED _drain_s OR NOT DEFINED _sleep)
    message(SEND_ERROR "deployment.yaml: terminationGracePeriodSeconds, --drain-timeout-ms and a preStop sleep are all needed")
    set(_failed TRUE)
  else()
    math(EXPR _need "${_sleep} + ${_drain_s}")
    if(_grace LESS_EQUAL _need)
      message(SEND_ERROR "deployment.yaml: terminationGracePeriodSeconds ${_grace} does not cover preStop ${_sleep} s + drain ${_drain_s} s")
      set(_failed TRUE)
    else()
      message("drain: preStop ${_sleep} s + drain ${_drain_s} s < grace ${_grace} s")
    endif()
  endif()
  if(_failed)
    message(FATAL_ERROR "deploy/kubernetes checks failed")
  endif()
  return()
endif()

add_executable(deploy_exported_metrics ${CMAKE_CURRENT_SOURCE_DIR}/deploy/exported_metrics.cpp)
target_link_libraries(deploy_exported_metrics PRIVATE tailbatch_dev)
add_test(NAME deploy_manifests
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:deploy_exported_metrics>
                 -DMANIFESTS=${PROJECT_SOURCE_DIR}/deploy/kubernetes
                 -DOUTPUT=${CMAKE_CURRENT_BINARY_DIR}/deploy_exposition.txt
                 -P ${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(deploy_manifests PROPERTIES LABELS deploy TIMEOUT 120
                     SKIP_REGULAR_EXPRESSION "TAILBATCH_SKIP:")
