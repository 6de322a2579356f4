# A short run of warmup_demo as a test (a small model, 100 requests per mode, about a
# second): both modes start, warm up or not, serve and print the table.
if(TAILBATCH_BUILD_TESTS AND TARGET warmup_demo)
  add_test(NAME warmup_demo_smoke COMMAND warmup_demo --smoke)
  set_tests_properties(warmup_demo_smoke PROPERTIES LABELS example TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "no warmup[^\n]*\nwarmup ")
endif()
