# tailbatch-load --url (label `server`): tests/server/test_http_load.py sweeps
# tailbatch-serve --port 0 and checks the JSON and the status counts, then runs against a
# tiny server of its own on 127.0.0.1 that stalls once for 300 ms, checking that the stall
# shows in the open-loop p99 and not in the closed-loop view of the same requests. Every
# server it starts is stopped when it ends. Needs python3 and Boost (for --url and the
# server); nothing is registered without them (tests/server/server_test.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
tailbatch_server_test(NAME tailbatch_load_http SCRIPT test_http_load.py
                      ARGS $<TARGET_FILE:tailbatch-load> $<TARGET_FILE:tailbatch-serve> LABELS server TIMEOUT 90)

# tailbatch-serve's /dashboard in headless Chromium (label `browser`): the server under
# load from tailbatch-load --url; the rendered DOM must show a live p95 and every chart
# drawn by Chart.js. `python3 tests/server/test_dashboard.py <tailbatch-load>
# <tailbatch-serve> --screenshot docs/img/dashboard.png` also makes the README's
# screenshot. Needs chromium (skipped, exit 77, without it).
find_program(TAILBATCH_CHROMIUM NAMES chromium chromium-browser)
if(TAILBATCH_CHROMIUM)
  tailbatch_server_test(NAME tailbatch_serve_dashboard SCRIPT test_dashboard.py
                        ARGS $<TARGET_FILE:tailbatch-load> $<TARGET_FILE:tailbatch-serve>
                        LABELS browser TIMEOUT 60 SKIP_RETURN_CODE 77)
else()
  message(STATUS "tailbatch: not registering the /dashboard browser test: chromium not found")
endif()
