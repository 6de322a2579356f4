# The tailbatch-serve end-to-end test (label `server`): tests/server/test_server.py starts
# the server with --port 0 on 127.0.0.1, drives every route with curl and raw sockets,
# forces each outcome, checks SSE framing, disconnect cancellation, promtool on /metrics
# and the SIGTERM drain, and kills every server it started. Needs python3 and curl; where
# either or the server itself is missing, nothing is registered (the server's CMake says
# why it was skipped).
include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
tailbatch_server_test(NAME tailbatch_serve_e2e SCRIPT test_server.py ARGS $<TARGET_FILE:tailbatch-serve>
                      LABELS server TIMEOUT 60 NEEDS curl)

# tailbatch-serve's Autoscaler, live (label `server`): tests/server/test_autoscale.py runs
# the server with a 0.2 s --autoscale-interval-s, loads it and checks that /metrics carries
# tailbatch_autoscaler_desired_replicas and that its inputs moved.
tailbatch_server_test(NAME tailbatch_serve_autoscale SCRIPT test_autoscale.py ARGS $<TARGET_FILE:tailbatch-serve>
                      LABELS server TIMEOUT 60)

# examples/minimal_server.cpp, the smallest server to copy from (label `server`).
tailbatch_server_test(NAME minimal_server SCRIPT test_minimal_server.py ARGS $<TARGET_FILE:minimal_server>
                      LABELS server TIMEOUT 30)

# tailbatch-serve's generation on a KV cache (label `server`): tests/server/test_kv_serve.py
# checks --kv-mode grow (preempting) and reserve give the texts of a server without one,
# prefix reuse, and 413 for a prompt larger than the cache.
tailbatch_server_test(NAME tailbatch_serve_kv SCRIPT test_kv_serve.py ARGS $<TARGET_FILE:tailbatch-serve>
                      LABELS server TIMEOUT 60)
