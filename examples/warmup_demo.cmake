# A short run of warmup_demo as a test (a small model, 100 requests per mode, about a
# second): both modes start, warm up or not, serve and print the table.
if(TAILBATCH_BUILD_TESTS AND TARGET warmup_demo)
  add_test(NAME warmup_demo_smoke COMMAND warmup_demo --smoke)
  set_tests_properties(warmup_demo_smoke PROPERTIES LABELS example TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "no warmup[^\n]*\nwarmup ")
  # The same with cold weights: mapped from a file (18 MiB, in the build tree) that each
  # run first drops from the page cache. Checks that it runs and prints the table and the
  # resident fractions, not what they are (that depends on the file system).
  if(UNIX)
    add_test(NAME warmup_demo_cold_smoke
             COMMAND warmup_demo --smoke --weights-file ${CMAKE_CURRENT_BINARY_DIR}/warmup_demo_smoke.weights --cold)
    set_tests_properties(warmup_demo_cold_smoke PROPERTIES LABELS example TIMEOUT 120
                         PASS_REGULAR_EXPRESSION
                         "no warmup[^\n]*\nwarmup [^\n]*\n\nweights mapped from [^\n]*\nweights resident at start[^\n]*\nweights resident before first request: no warmup [0-9.]+ %, warmup [0-9.]+ %")
  endif()
endif()
