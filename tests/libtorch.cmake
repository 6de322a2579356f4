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
if(TAILBATCH_HAS_TORCH AND TAILBATCH_BUILD_EXAMPLES)
  find_package(Boost 1.70 QUIET)
  find_package(nlohmann_json 3 QUIET)
  find_package(CLI11 QUIET)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Boost_FOUND AND nlohmann_json_FOUND AND CLI11_FOUND AND Python3_Interpreter_FOUND)
    add_test(NAME tailbatch_serve_embed_libtorch
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/server/test_embed_libtorch.py
                     $<TARGET_FILE:tailbatch-serve>)
    set_tests_properties(tailbatch_serve_embed_libtorch PROPERTIES LABELS "libtorch;server" TIMEOUT 90)
  endif()
endif()
