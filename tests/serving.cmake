# The tailbatch-serve end-to-end test (label `server`): tests/server/test_server.py starts
# the server with --port 0 on 127.0.0.1, drives every route with curl and raw sockets,
# forces each outcome, checks SSE framing, disconnect cancellation, promtool on /metrics
# and the SIGTERM drain, and kills every server it started. Needs python3 and curl; where
# either or the server itself is missing, nothing is registered (the server's CMake says
# why it was skipped).
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()
# tests/ is configured before examples/: look for what examples/server.cmake needs to
# build the server, rather than for its target.
find_package(Boost 1.70 QUIET)
find_package(nlohmann_json 3 QUIET)
find_package(CLI11 QUIET)
if(NOT Boost_FOUND OR NOT nlohmann_json_FOUND OR NOT CLI11_FOUND)
  return()
endif()
find_package(Python3 COMPONENTS Interpreter QUIET)
find_program(TAILBATCH_CURL curl)
if(NOT Python3_Interpreter_FOUND OR NOT TAILBATCH_CURL)
  message(STATUS "tailbatch: not registering the tailbatch-serve test: it needs python3 and curl")
  return()
endif()
add_test(NAME tailbatch_serve_e2e
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_server.py $<TARGET_FILE:tailbatch-serve>)
set_tests_properties(tailbatch_serve_e2e PROPERTIES LABELS server TIMEOUT 60)

# tailbatch-serve's Autoscaler, live (label `server`): tests/server/test_autoscale.py runs
# the server with a 0.2 s --autoscale-interval-s, loads it and checks that /metrics carries
# tailbatch_autoscaler_desired_replicas and that its inputs moved.
add_test(NAME tailbatch_serve_autoscale
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_autoscale.py $<TARGET_FILE:tailbatch-serve>)
set_tests_properties(tailbatch_serve_autoscale PROPERTIES LABELS server TIMEOUT 60)

# examples/minimal_server.cpp, the smallest server to copy from (label `server`).
add_test(NAME minimal_server
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_minimal_server.py $<TARGET_FILE:minimal_server>)
set_tests_properties(minimal_server PROPERTIES LABELS server TIMEOUT 30)

# tailbatch-serve's generation on a KV cache (label `server`): tests/server/test_kv_serve.py
# checks --kv-mode grow (preempting) and reserve give the texts of a server without one,
# prefix reuse, and 413 for a prompt larger than the cache.
add_test(NAME tailbatch_serve_kv
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_kv_serve.py $<TARGET_FILE:tailbatch-serve>)
set_tests_properties(tailbatch_serve_kv PROPERTIES LABELS server TIMEOUT 60)
