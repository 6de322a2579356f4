# autoscale_demo's goals, checked on its --json output: the simulation is deterministic for
# its seed, so the relations between the three policies are asserted, not timed.
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()
add_test(NAME autoscale_demo_goals
         COMMAND ${CMAKE_COMMAND} -DDEMO=$<TARGET_FILE:autoscale_demo>
                 -DOUT_DIR=${CMAKE_CURRENT_BINARY_DIR}/autoscale_demo
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/autoscale/check_goals.cmake)
set_tests_properties(autoscale_demo_goals PROPERTIES LABELS cli TIMEOUT 120)
