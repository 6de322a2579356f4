# prometheus_fleet (label `prometheus`): a real Prometheus server scrapes two tailbatch-serve
# replicas under open-loop load from tailbatch-load --url, and the test checks through its
# HTTP API that the fleet's p99 from summed histogram buckets matches the load generators'
# own p99s within the buckets' error, that request counts add up across replicas, that the
# Autoscaler's desired-replicas gauge is visible, that the rules of deploy/prometheus/
# evaluate, and that every query of deploy/grafana/tailbatch.json returns data
# (tests/prometheus/fleet_test.py). About 20 s; every process it starts binds 127.0.0.1 and
# is stopped by it.
#
# It runs alone (RUN_SERIAL), even under `ctest -j`: it compares the server's latency with
# its clients', and another test's processes on the same cores delay the replicas' I/O
# threads, which clients see and the Pipeline's end-to-end histogram does not (under
# `ctest -j 2` on 2 cores it once read a replica's Pipeline p99 at 11.8 ms against a client
# p99 from send of 39.6 ms, outside the check's allowance for the way in and out).
#
# Needs what the server and tailbatch-load's HTTP mode build from (Boost, nlohmann-json,
# CLI11), python3, and Debian's prometheus package (scripts/deps.sh --test): where
# prometheus is missing the test fails and says how to install it.
# tailbatch_serve_buildable (tests/server/server_test.cmake) says whether the programs are built.
include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
find_package(Python3 COMPONENTS Interpreter QUIET)
tailbatch_serve_buildable(_tailbatch_serve)
if(NOT (_tailbatch_serve AND Python3_Interpreter_FOUND))
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
set_tests_properties(prometheus_fleet PROPERTIES LABELS prometheus TIMEOUT 180 RUN_SERIAL ON)
