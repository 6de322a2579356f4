# tests/libtorch/: the libtorch encoder example behind a Pipeline (ctest label libtorch),
# built only where libtorch is (cmake/TailbatchTorch.cmake). The test writes its own
# weights file with torch::save.
if(TAILBATCH_HAS_TORCH)
  add_executable(test_libtorch_encoder libtorch/test_libtorch_encoder.cpp)
  target_link_libraries(test_libtorch_encoder PRIVATE tailbatch_test_main tailbatch_libtorch_example)
  add_test(NAME test_libtorch_encoder COMMAND test_libtorch_encoder)
  set_tests_properties(test_libtorch_encoder PROPERTIES LABELS libtorch TIMEOUT ${TAILBATCH_TEST_TIMEOUT})
endif()

# tailbatch-serve --embed-model libtorch, end to end (tests/server/test_embed_libtorch.py,
# labels libtorch and server): 127.0.0.1, --port 0, bounded, stopped by the test.
# Registered where tailbatch-serve is built (examples/server.cmake's dependencies).
if(TAILBATCH_HAS_TORCH)
  include(${CMAKE_CURRENT_LIST_DIR}/server/server_test.cmake)
  tailbatch_server_test(NAME tailbatch_serve_embed_libtorch SCRIPT test_embed_libtorch.py
                        ARGS $<TARGET_FILE:tailbatch-serve> LABELS libtorch server TIMEOUT 90)
endif()
