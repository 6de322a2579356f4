# tests/libtorch/: the libtorch encoder example behind a Pipeline (ctest label libtorch),
# built only where libtorch is (cmake/TailbatchTorch.cmake). The test writes its own
# weights file with torch::save.
if(TAILBATCH_HAS_TORCH)
  add_executable(test_libtorch_encoder libtorch/test_libtorch_encoder.cpp)
  target_link_libraries(test_libtorch_encoder PRIVATE tailbatch_test_main tailbatch_libtorch_example)
  add_test(NAME test_libtorch_encoder COMMAND test_libtorch_encoder)
  set_tests_properties(test_libtorch_encoder PROPERTIES LABELS libtorch TIMEOUT ${TAILBATCH_TEST_TIMEOUT})
endif()
