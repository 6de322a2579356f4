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
# The same goals with HPA's target utilisation raised to 87 %, where its replica-seconds
# come near the Autoscaler's (docs/scaling.md, "At equal cost"): there HPA violates the SLO
# and the Autoscaler must violate it strictly less.
add_test(NAME autoscale_demo_equal_cost
         COMMAND ${CMAKE_COMMAND} -DDEMO=$<TARGET_FILE:autoscale_demo>
                 -DOUT_DIR=${CMAKE_CURRENT_BINARY_DIR}/autoscale_demo_equal_cost
                 "-DARGS=--hpa-target 0.87" -DSTRICT=ON
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/autoscale/check_goals.cmake)
set_tests_properties(autoscale_demo_equal_cost PROPERTIES LABELS cli TIMEOUT 120)
