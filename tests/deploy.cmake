# The Kubernetes manifests under deploy/kubernetes/, checked (label `deploy`) by
# tests/deploy/check_manifests.py (ctest deploy_manifests):
#   * every file parses and passes yamllint (Debian's yamllint) with warnings as errors;
#   * every tailbatch metric name they reference, and every label selector on one, is
#     matched by what tailbatch-serve really exports: the script starts the server on
#     127.0.0.1 (--port 0, a 0.2 s --autoscale-interval-s), sends it requests and reads its
#     live /metrics once the Autoscaler has evaluated (checked by promtool too, where it is
#     installed). Where the server cannot be built (no Boost, nlohmann-json or CLI11),
#     tests/deploy/exported_metrics.cpp stands in for it: the same components, with the
#     server's labels, on one MetricsRegistry;
#   * the Deployment's drain adds up: terminationGracePeriodSeconds covers the preStop
#     sleep plus --drain-timeout-ms, and the probes are /readyz and /healthz.
# Where yamllint is missing the test says why and ctest reports it skipped. Needs python3.
add_executable(deploy_exported_metrics ${CMAKE_CURRENT_SOURCE_DIR}/deploy/exported_metrics.cpp)
target_link_libraries(deploy_exported_metrics PRIVATE tailbatch_dev)

# deploy_manifests_schema (label `deploy`): every object under deploy/kubernetes/ validated
# against Kubernetes' and KEDA's own schemas (the npm packages kubernetes-models and
# @kubernetes-models/keda), and compiled as its model's TypeScript type so that a misspelt
# field fails too; tests/deploy/schema/validate.mjs. The packages are pinned in
# tests/deploy/schema/package.json and package-lock.json and installed by
# `scripts/deps.sh --test` (npm ci). Without Node or without them the test fails and says
# how to install them: a schema check that did not run must not look like one that passed.
find_program(TAILBATCH_NODE node)
if(TAILBATCH_NODE)
  add_test(NAME deploy_manifests_schema
           COMMAND ${TAILBATCH_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/schema/validate.mjs
                   ${PROJECT_SOURCE_DIR}/deploy/kubernetes ${CMAKE_CURRENT_BINARY_DIR}/deploy_schema)
else()
  add_test(NAME deploy_manifests_schema
           COMMAND sh -c "echo 'FAIL: node not found, so the manifests were not validated. Run scripts/deps.sh --test.'; exit 1")
endif()
set_tests_properties(deploy_manifests_schema PROPERTIES LABELS deploy TIMEOUT 120)

find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "tailbatch: not registering the deploy/kubernetes test: it needs python3")
  return()
endif()
include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
tailbatch_serve_buildable(_tailbatch_serve)
if(_tailbatch_serve)
  set(_tailbatch_exposition --serve $<TARGET_FILE:tailbatch-serve>)
else()
  set(_tailbatch_exposition --program $<TARGET_FILE:deploy_exported_metrics>)
endif()
add_test(NAME deploy_manifests
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/deploy/check_manifests.py
                 ${PROJECT_SOURCE_DIR}/deploy/kubernetes ${_tailbatch_exposition}
                 --save ${CMAKE_CURRENT_BINARY_DIR}/deploy_exposition.txt)
set_tests_properties(deploy_manifests PROPERTIES LABELS deploy TIMEOUT 120
                     SKIP_REGULAR_EXPRESSION "TAILBATCH_SKIP:")
