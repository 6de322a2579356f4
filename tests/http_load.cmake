# tailbatch-load --url (label `server`): tests/server/test_http_load.py sweeps
# tailbatch-serve --port 0 and checks the JSON and the status counts, then runs against a
# tiny server of its own on 127.0.0.1 that stalls once for 300 ms, checking that the stall
# shows in the open-loop p99 and not in the closed-loop view of the same requests. Every
# server it starts is stopped when it ends. Needs python3 and Boost (for --url and the
# server); nothing is registered without them.
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()
# tests/ is configured before examples/: look for what the targets need, not for them.
find_package(Boost 1.70 QUIET)
find_package(nlohmann_json 3 QUIET)
find_package(CLI11 QUIET)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Boost_FOUND OR NOT nlohmann_json_FOUND OR NOT CLI11_FOUND OR NOT Python3_Interpreter_FOUND)
  message(STATUS "tailbatch: not registering the tailbatch-load --url test: it needs Boost, nlohmann-json, CLI11 and python3")
  return()
endif()
add_test(NAME tailbatch_load_http
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_http_load.py
                 $<TARGET_FILE:tailbatch-load> $<TARGET_FILE:tailbatch-serve>)
set_tests_properties(tailbatch_load_http PROPERTIES LABELS server TIMEOUT 90)

# tailbatch-serve's /dashboard in headless Chromium (label `browser`): the server under
# load from tailbatch-load --url; the rendered DOM must show a live p95 and every chart
# drawn by Chart.js. `python3 tests/server/test_dashboard.py <tailbatch-load>
# <tailbatch-serve> --screenshot docs/img/dashboard.png` also makes the README's
# screenshot. Needs chromium (skipped, exit 77, without it).
find_program(TAILBATCH_CHROMIUM NAMES chromium chromium-browser)
if(TAILBATCH_CHROMIUM)
  add_test(NAME tailbatch_serve_dashboard
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_dashboard.py
                   $<TARGET_FILE:tailbatch-load> $<TARGET_FILE:tailbatch-serve>)
  set_tests_properties(tailbatch_serve_dashboard PROPERTIES LABELS browser TIMEOUT 60 SKIP_RETURN_CODE 77)
else()
  message(STATUS "tailbatch: not registering the /dashboard browser test: chromium not found")
endif()
