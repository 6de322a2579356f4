# ctests that run tailbatch-load as a user would: bad numbers and empty profiles give a
# clear message and a non-zero exit, and --json prints one object per run with the
# contract's fields in every mode. The tool is an example, so these exist only when
# examples are built. (tests/cli.cmake holds the other tool's tests.)
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()

include(${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_test.cmake)

# tailbatch_load_cli_test(NAME RC rc ARGS a b c EXPECT re re [FORBID re])
function(tailbatch_load_cli_test name)
  tailbatch_cli_test(${name} tailbatch-load ${ARGN})
endfunction()

# ---- bad arguments: what is wrong, said plainly; never a 309-digit bound ------------------
tailbatch_load_cli_test(load_rate_zero RC 1 ARGS --simulate --rate 0
  EXPECT "--rate: must be > 0, got 0" FORBID "[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]")
tailbatch_load_cli_test(load_rate_negative RC 1 ARGS --simulate --rate -5
  EXPECT "--rate: must be > 0, got -5" FORBID "[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]")
tailbatch_load_cli_test(load_rate_not_a_number RC 1 ARGS --simulate --rate abc
  EXPECT "--rate: \"abc\" is not a number" FORBID "range")
tailbatch_load_cli_test(load_sweep_not_a_number RC 1 ARGS --simulate --sweep 10,abc
  EXPECT "\"abc\" is not a number" FORBID "range")
tailbatch_load_cli_test(load_max_batch_not_a_number RC 1 ARGS --simulate --rate 10 --max-batch x
  EXPECT "\"x\" is not a whole number")
# `--steps ""`: an empty argument, which a list cannot carry through add_test, so this one
# runs from a small script of its own.
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/load_cli_steps_empty.cmake [=[
execute_process(COMMAND ${TOOL} --simulate --steps "" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "--steps: empty")
  message(FATAL_ERROR "expected a non-zero exit and \"--steps: empty\", got exit ${rc}")
endif()
]=])
add_test(NAME cli_load_steps_empty
         COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:tailbatch-load> -P ${CMAKE_CURRENT_BINARY_DIR}/load_cli_steps_empty.cmake)
set_tests_properties(cli_load_steps_empty PROPERTIES LABELS cli TIMEOUT 60)
tailbatch_load_cli_test(load_steps_zero_seconds RC 1 ARGS --simulate --steps 100:0
  EXPECT "--steps: \"100:0\": RATE must be >= 0 and SECONDS in")
tailbatch_load_cli_test(load_best_static_needs_simulate RC 1 ARGS --policy best-static --rate 10
  EXPECT "best-static searches by simulation: add --simulate")
tailbatch_load_cli_test(load_network_needs_simulate RC 1 ARGS --network-ms 5 --rate 10
  EXPECT "--network-ms is modelled by the simulator only")

# ---- --json: one object per run, in every mode -------------------------------------------
set(_load_fields "\"offered_rps\": [0-9.]+, \"achieved_rps\": [0-9.]+, \"p50_ms\": [0-9.]+, \"p95_ms\": [0-9.]+, \"p99_ms\": [0-9.]+, \"mean_batch\": [0-9.]+, \"errors\": [0-9]+")
# (CMake's regular expressions have no {n} repetition: a sweep's lines are spelled out.)
# Every run object ends with the goodput and the tenants (empty without --tenant-mix).
set(_good ", \"goodput_rps\": [0-9.]+, \"tenants\": \\[\\]")
set(_sim_adaptive "{\"mode\": \"simulate\", \"policy\": \"adaptive\", ${_load_fields}${_good}}")
set(_live_adaptive "{\"mode\": \"live\", \"policy\": \"adaptive\", ${_load_fields}${_good}}")
set(_example1 --base-ms 20 --per-item-ms 3 --network-ms 5 --lanes 2 --slo-p95-ms 150)
tailbatch_load_cli_test(load_json_simulate_fixed RC 0
  ARGS --simulate ${_example1} --max-batch 16 --window-ms 8 --rate 200 --duration 4 --warmup 1 --json
  EXPECT "^{\"mode\": \"simulate\", \"policy\": \"fixed\", ${_load_fields}, \"window_ms\": 8, \"max_batch\": 16${_good}}\n$")
tailbatch_load_cli_test(load_json_simulate_adaptive RC 0
  ARGS --simulate ${_example1} --max-batch 64 --policy adaptive --rate 200 --duration 4 --warmup 1 --json
  EXPECT "^{\"mode\": \"simulate\", \"policy\": \"adaptive\", ${_load_fields}${_good}}\n$" FORBID "window_ms")
tailbatch_load_cli_test(load_json_simulate_best_static RC 0
  ARGS --simulate ${_example1} --max-batch 16 --policy best-static --rate 200 --duration 3 --warmup 1 --json
  EXPECT "^{\"mode\": \"simulate\", \"policy\": \"best-static\", ${_load_fields}, \"window_ms\": [0-9.]+, \"max_batch\": [0-9]+${_good}}\n$")
tailbatch_load_cli_test(load_json_simulate_sweep RC 0
  ARGS --simulate ${_example1} --policy adaptive --sweep 50,100,200 --duration 3 --warmup 1 --json
  EXPECT "^${_sim_adaptive}\n${_sim_adaptive}\n${_sim_adaptive}\nplot: ")
tailbatch_load_cli_test(load_json_simulate_steps RC 0
  ARGS --simulate ${_example1} --policy adaptive --steps 50:2,300:2 --json
  EXPECT "^{\"mode\": \"simulate\", \"policy\": \"adaptive\", ${_load_fields}${_good}}\n")
tailbatch_load_cli_test(load_json_live RC 0
  ARGS --base-ms 2 --per-item-ms 0.5 --rate 100 --duration 1 --warmup 0.2 --json --quiet
  EXPECT "^{\"mode\": \"live\", \"policy\": \"fixed\", ${_load_fields}, \"window_ms\": 8, \"max_batch\": 16${_good}}\nplot: ")
tailbatch_load_cli_test(load_json_live_sweep RC 0
  ARGS --base-ms 2 --per-item-ms 0.5 --policy adaptive --sweep 50,100 --duration 1 --warmup 0.2 --json --quiet
       --slo-p95-ms 60000  # the sweep stops at the first rate over the SLO: a busy machine must not end it early
  EXPECT "^${_live_adaptive}\n${_live_adaptive}\nplot: ")

# ---- --tenant-mix: parsing, and each tenant's figures in the run object -----------------
tailbatch_load_cli_test(load_tenant_mix_twice RC 1 ARGS --simulate --tenant-mix a:300,a:5
  EXPECT "--tenant-mix: \"a:5\": tenant a is named twice")
tailbatch_load_cli_test(load_tenant_mix_bad_weight RC 1 ARGS --simulate --tenant-mix a:300:0,b:5
  EXPECT "--tenant-mix: \"a:300:0\": WEIGHT must be a number > 0")
tailbatch_load_cli_test(load_tenant_mix_not_with_rate RC 1 ARGS --simulate --tenant-mix a:3 --rate 5
  EXPECT "excludes")
set(_tenant "{\"name\": \"[ab]\", \"offered_rps\": [0-9.]+, \"achieved_rps\": [0-9.]+, \"p50_ms\": [0-9.]+, \"p95_ms\": [0-9.]+, \"p99_ms\": [0-9.]+, \"goodput_rps\": [0-9.]+, \"errors\": [0-9]+}")
tailbatch_load_cli_test(load_json_tenants_simulate RC 0
  ARGS --simulate ${_example1} --tenant-mix a:150:2,b:50 --scheduling fair --queue-policy adaptive-lifo
       --duration 3 --warmup 1 --json
  EXPECT "^{\"mode\": \"simulate\", .*\"goodput_rps\": [0-9.]+, \"tenants\": \\[${_tenant}, ${_tenant}\\]}\n$"
         "\"name\": \"a\", \"offered_rps\": 1[3-6][0-9]\\.")
tailbatch_load_cli_test(load_json_tenants_live RC 0
  ARGS --base-ms 2 --per-item-ms 0.5 --tenant-mix a:60,b:40 --scheduling fair --duration 1 --warmup 0.2
       --json --quiet
  EXPECT "^{\"mode\": \"live\", .*\"tenants\": \\[${_tenant}, ${_tenant}\\]}\nplot: ")

# ---- --record and --simulate --replay: a short live run recorded, then replayed ----------
tailbatch_load_cli_test(load_replay_needs_simulate RC 1 ARGS --replay x.trace
  EXPECT "--replay runs the simulator: add --simulate")
tailbatch_load_cli_test(load_record_not_with_sweep RC 1 ARGS --record x.trace --sweep 10,20
  EXPECT "--record records one live run")
tailbatch_load_cli_test(load_replay_missing_file RC 1 ARGS --simulate --replay no-such.trace
  EXPECT "--replay: cannot open no-such.trace")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/load_cli_record_replay.cmake [=[
set(dir ${WORK}/cli_load_record_replay)
file(MAKE_DIRECTORY ${dir})
execute_process(COMMAND ${TOOL} --rate 100 --duration 1.5 --warmup 0.5 --base-ms 2 --per-item-ms 0.5 --quiet
                        --record ${dir}/run.trace --out ${dir}/out
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "recording failed (exit ${rc}): ${out}${err}")
endif()
file(STRINGS ${dir}/run.trace head LIMIT_COUNT 2)
if(NOT head MATCHES "^tailbatch-trace 1;setup .*policy=fixed")
  message(FATAL_ERROR "not a trace: ${head}")
endif()
execute_process(COMMAND ${TOOL} --simulate --replay ${dir}/run.trace --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
set(n "[0-9]+\\.[0-9]+")
if(NOT rc EQUAL 0 OR NOT out MATCHES "\"measured_p50_ms\": ${n}, \"measured_p95_ms\": ${n}, \"measured_p99_ms\": ${n}, \"predicted_p50_ms\": ${n}, \"predicted_p95_ms\": ${n}, \"predicted_p99_ms\": ${n}")
  message(FATAL_ERROR "expected the replay's JSON object, got exit ${rc}")
endif()
execute_process(COMMAND ${TOOL} --simulate --replay ${dir}/run.trace
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "p95 +[0-9.]+ +[0-9.]+" OR NOT out MATCHES "where the measured latency went")
  message(FATAL_ERROR "expected the side-by-side table, got exit ${rc}")
endif()
]=])
add_test(NAME cli_load_record_replay
         COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:tailbatch-load> -DWORK=${CMAKE_CURRENT_BINARY_DIR}
                 -P ${CMAKE_CURRENT_BINARY_DIR}/load_cli_record_replay.cmake)
set_tests_properties(cli_load_record_replay PROPERTIES LABELS cli TIMEOUT 120)

# ---- --model generator: the generation simulator and its workload flags -------------------
tailbatch_load_cli_test(load_gen_output_len_bad RC 1 ARGS --simulate --model generator --rate 10 --output-len geometric:0
  EXPECT "--output-len: \"geometric:0\": geometric:MEAN needs a number MEAN >= 1")
tailbatch_load_cli_test(load_gen_output_len_unknown RC 1 ARGS --simulate --model generator --rate 10 --output-len uniform:5
  EXPECT "expected fixed:N or geometric:MEAN")
tailbatch_load_cli_test(load_gen_max_tokens_zero RC 1 ARGS --simulate --model generator --rate 10 --max-tokens 0
  EXPECT "--max-tokens: must be in \\[1, 1048576\\], got 0")
tailbatch_load_cli_test(load_gen_needs_simulate RC 1 ARGS --model generator --rate 10
  EXPECT "--model generator is simulated: add --simulate")
tailbatch_load_cli_test(load_gen_flag_needs_generator RC 1 ARGS --simulate --rate 10 --shared-prefix 100
  EXPECT "--shared-prefix shapes a generation workload")
tailbatch_load_cli_test(load_gen_kv_flag_needs_generator RC 1 ARGS --simulate --rate 10 --kv-blocks 64
  EXPECT "--kv-blocks configures the simulated generator")
tailbatch_load_cli_test(load_gen_reserve_too_large RC 1
  ARGS --simulate --model generator --rate 10 --kv-mode reserve --kv-blocks 8 --max-tokens 512
  EXPECT "need 36 blocks of 16, more than --kv-blocks 8: every request would be rejected too_large")
tailbatch_load_cli_test(load_gen_watermark RC 1 ARGS --simulate --model generator --rate 10 --kv-blocks 8 --kv-watermark 8
  EXPECT "--kv-watermark \\(8\\) must be less than --kv-blocks \\(8\\)")
tailbatch_load_cli_test(load_json_gen_simulate RC 0
  ARGS --simulate --model generator --kv-blocks 192 --output-len geometric:128 --shared-prefix 32 --rate 50 --duration 2 --json
  EXPECT "^{\"mode\": \"simulate\", \"model\": \"generator\", \"kv_mode\": \"grow\", \"prefix_caching\": true, \"offered_rps\": [0-9.]+, \"requests\": [0-9]+, \"achieved_rps\": [0-9.]+, \"tokens_per_s\": [0-9.]+, \"ttft_p50_ms\": [0-9.]+, \"ttft_p95_ms\": [0-9.]+, \"ttft_p99_ms\": [0-9.]+, \"e2e_p50_ms\": [0-9.]+, \"e2e_p95_ms\": [0-9.]+, \"e2e_p99_ms\": [0-9.]+, \"preemptions\": [0-9]+, \"recomputed_tokens\": [0-9]+, \"prompt_tokens\": [0-9]+, \"prefill_tokens\": [0-9]+, \"prefix_hit_rate\": [0-9.]+, \"mean_batch\": [0-9.]+, \"mean_output_tokens\": [0-9.]+, \"errors\": 0, \"meets_slo\": (true|false)}\n$")
