# prometheus_fleet (label `prometheus`): a real Prometheus server scrapes two tailbatch-serve
# replicas under open-loop load from tailbatch-load --url, and the test checks through its
# HTTP API that the fleet's p99 from summed histogram buckets matches the load generators'
# own p99s within the buckets' error, that request counts add up across replicas, that the
# Autoscaler's desired-replicas gauge is visible, that the rules of deploy/prometheus/
# evaluate, and that every query of deploy/grafana/tailbatch.json returns data
# (tests/prometheus/fleet_test.py). About 20 s; every process it starts binds 127.0.0.1 and
# is stopped by it.
#
# Needs what the server and tailbatch-load's HTTP mode build from (Boost, nlohmann-json,
# CLI11), python3, and Debian's prometheus package (scripts/deps.sh --test): where
# prometheus is missing the test fails and says how to install it. tests/ is configured
# before examples/ and tools/cli/: look for what they need rather than for their targets.
find_package(Python3 COMPONENTS Interpreter QUIET)
find_package(Boost 1.70 QUIET)
find_package(nlohmann_json 3 QUIET)
find_package(CLI11 QUIET)
if(NOT (TAILBATCH_BUILD_EXAMPLES AND Python3_Interpreter_FOUND AND Boost_FOUND AND nlohmann_json_FOUND
        AND CLI11_FOUND))
  message(STATUS "tailbatch: not registering prometheus_fleet: it needs tailbatch-serve and tailbatch-load --url "
                 "(Boost, nlohmann-json, CLI11) and python3")
  return()
endif()
add_test(NAME prometheus_fleet
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/prometheus/fleet_test.py
                 --serve $<TARGET_FILE:tailbatch-serve> --load $<TARGET_FILE:tailbatch-load>
                 --rules ${PROJECT_SOURCE_DIR}/deploy/prometheus/tailbatch-rules.yaml
                 --dashboard ${PROJECT_SOURCE_DIR}/deploy/grafana/tailbatch.json
                 --work ${CMAKE_CURRENT_BINARY_DIR}/prometheus_fleet)
set_tests_properties(prometheus_fleet PROPERTIES LABELS prometheus TIMEOUT 180)
