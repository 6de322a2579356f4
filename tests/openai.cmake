# The OpenAI-compatible API against the official `openai` Node client (label `openai`):
# tests/openai/test_openai.mjs starts tailbatch-serve with --port 0 on 127.0.0.1 and drives
# models, completions and chat (streamed and not), embeddings, errors, the API key, stream
# abort and 64 concurrent completions through the SDK pinned in tests/openai/package.json
# and package-lock.json (`npm ci`, which scripts/deps.sh --test runs). Without the package
# installed the test is reported skipped (exit 77). The wire framing the SDK hides ([DONE],
# keep-alive comments, x-request-id, HTTP/1.0 streams, the hardening) is checked with raw
# sockets by tests/server/test_openai_wire.py (labels `openai` and `server`).
include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
tailbatch_serve_buildable(_tailbatch_serve)
if(NOT _tailbatch_serve)
  return()
endif()
find_program(TAILBATCH_NODE node)
if(TAILBATCH_NODE)
  add_test(NAME tailbatch_serve_openai_sdk
           COMMAND ${TAILBATCH_NODE} ${CMAKE_CURRENT_LIST_DIR}/openai/test_openai.mjs $<TARGET_FILE:tailbatch-serve>)
  set_tests_properties(tailbatch_serve_openai_sdk PROPERTIES LABELS openai TIMEOUT 120 SKIP_RETURN_CODE 77)
else()
  message(STATUS "tailbatch: not registering tailbatch_serve_openai_sdk: it needs node (scripts/deps.sh --test)")
endif()
tailbatch_server_test(NAME tailbatch_serve_openai_wire SCRIPT test_openai_wire.py ARGS $<TARGET_FILE:tailbatch-serve>
                      LABELS openai server TIMEOUT 90)
