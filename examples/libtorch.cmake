# examples/libtorch/: a libtorch encoder behind a Pipeline, built only where libtorch is
# (cmake/TailbatchTorch.cmake). The build writes the weights file with torch::save
# (libtorch_make_weights, seed 7); the programs load it with torch::load.
if(TAILBATCH_HAS_TORCH)
  find_package(CLI11 REQUIRED)
  set(TAILBATCH_LIBTORCH_WEIGHTS ${CMAKE_CURRENT_BINARY_DIR}/libtorch/encoder.pt)
  add_executable(libtorch_make_weights libtorch/make_weights.cpp)
  target_link_libraries(libtorch_make_weights PRIVATE tailbatch_libtorch_example)
  add_custom_command(OUTPUT ${TAILBATCH_LIBTORCH_WEIGHTS}
                     COMMAND libtorch_make_weights ${TAILBATCH_LIBTORCH_WEIGHTS} 7
                     DEPENDS libtorch_make_weights
                     COMMENT "Writing the libtorch encoder's weights (torch::save)")
  add_custom_target(libtorch_weights ALL DEPENDS ${TAILBATCH_LIBTORCH_WEIGHTS})

  foreach(_name libtorch_encoder before_after_libtorch)
    add_executable(${_name} libtorch/${_name}.cpp)
    target_link_libraries(${_name} PRIVATE tailbatch_libtorch_example tailbatch::tools fmt::fmt CLI11::CLI11)
    target_compile_definitions(${_name} PRIVATE TAILBATCH_LIBTORCH_WEIGHTS="${TAILBATCH_LIBTORCH_WEIGHTS}")
    add_dependencies(${_name} libtorch_weights)
  endforeach()

  if(TAILBATCH_BUILD_TESTS)
    add_test(NAME libtorch_encoder_smoke COMMAND libtorch_encoder --requests 300)
    set_tests_properties(libtorch_encoder_smoke PROPERTIES LABELS "libtorch;example" TIMEOUT 300
                         PASS_REGULAR_EXPRESSION "ready: yes\n.*burst: 300 of 300 ok")
    add_test(NAME before_after_libtorch_smoke COMMAND before_after_libtorch --smoke)
    set_tests_properties(before_after_libtorch_smoke PROPERTIES LABELS "libtorch;example" TIMEOUT 300
                         PASS_REGULAR_EXPRESSION "ADAPTIVE: [^\n]*\n.*saturation \\(")
  endif()
endif()
