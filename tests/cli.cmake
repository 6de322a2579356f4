# ctests that run the command-line tools (tailbatch-plan, tailbatch-load) as a user would:
# a good run, the --json contract fields, and bad arguments (a clear message and a non-zero
# exit). The tools are examples, so these exist only when examples are built.
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()

# tailbatch_cli_test(NAME tool RC rc ARGS a b c EXPECT re re [FORBID re])
function(tailbatch_cli_test name tool)
  cmake_parse_arguments(T "" "RC" "ARGS;EXPECT;FORBID" ${ARGN})
  list(JOIN T_ARGS "@@" _args)
  list(JOIN T_EXPECT "@@" _expect)
  set(_cmd "$<TARGET_FILE:${tool}>")
  if(_args)
    set(_cmd "${_cmd}@@${_args}")
  endif()
  set(_defs -DCOMMAND=${_cmd} -DEXPECT_RC=${T_RC} -DEXPECT=${_expect}
            -DWORKDIR=${CMAKE_CURRENT_BINARY_DIR}/cli_${name})
  if(T_FORBID)
    list(JOIN T_FORBID "@@" _forbid)
    list(APPEND _defs -DFORBID=${_forbid})
  endif()
  add_test(NAME cli_${name} COMMAND ${CMAKE_COMMAND} ${_defs} -P ${CMAKE_CURRENT_SOURCE_DIR}/cli/expect.cmake)
  set_tests_properties(cli_${name} PROPERTIES LABELS cli TIMEOUT 120)
endfunction()

# ---- tailbatch-plan ----------------------------------------------------------------------
set(_example1 --base-ms 20 --per-item-ms 3 --network-ms 5 --window-ms 8 --streams 2 --slo-p95-ms 150)

tailbatch_cli_test(plan_example1 tailbatch-plan RC 0
  ARGS ${_example1} --preferred 8,16
  EXPECT "recommended [(][*][)]: batch 16, estimated p95 93.6 ms, 410.3 rps"
         "[*] +16 +65.0 +78.0 +93.6 +205.1 +410.3"
         " 8 +41.0 +54.0 +64.8 +148.1 +296.3")

tailbatch_cli_test(plan_json_contract tailbatch-plan RC 0
  ARGS ${_example1} --target-rps 600 --json
  EXPECT "\"recommended\": {\"batch_size\": 31,"
         "\"recommended\": {[^}]*\"p95_ms\": [0-9.]+"
         "\"recommended\": {[^}]*\"instance_rps\": [0-9.]+"
         "\"recommended\": {[^}]*\"replicas\": [0-9]+"
         "\"recommended\": {[^}]*\"replicas_with_headroom\": [0-9]+"
         "\"candidates\": [^{]*{\"batch_size\": 1,"
         "{\"batch_size\": 16, [^}]*\"p95_ms\": 93.6, [^}]*\"instance_rps\": 410.256, \"replicas\": 2, \"replicas_with_headroom\": 2,")

tailbatch_cli_test(plan_profile_table tailbatch-plan RC 0
  ARGS --profile 1:20,8:41,16:65 --network-ms 5 --window-ms 8 --streams 2 --slo-p95-ms 150
  EXPECT "recommended [(][*][)]: batch 16")

tailbatch_cli_test(plan_exercise tailbatch-plan RC 0
  ARGS --base-ms 18 --per-item-ms 2.5 --network-ms 4 --window-ms 6 --streams 2 --tail 1.2
       --slo-p95-ms 150 --target-rps 600 --preferred 8,16,32
  EXPECT "recommended [(][*][)]: batch 32, estimated p95 126.6 ms, 606.6 rps per instance, 1 replica [(]2 with headroom[)]"
         "Batch 16 needs the same 2 replicas")

tailbatch_cli_test(plan_instance_json tailbatch-plan RC 0
  ARGS --instance-rps 350 --p95-ms 120 --target-rps 2000 --headroom 0.3 --json
  EXPECT "\"mode\": \"instance\""
         "\"recommended\": {[^}]*\"replicas\": 6, \"replicas_with_headroom\": 8, \"concurrency\": 42, \"max_in_flight\": 50}")

tailbatch_cli_test(plan_bad_number tailbatch-plan RC nonzero
  ARGS --base-ms fast EXPECT "--base-ms")
tailbatch_cli_test(plan_no_profile tailbatch-plan RC nonzero
  ARGS --network-ms 5 EXPECT "give a latency profile")
tailbatch_cli_test(plan_bad_profile tailbatch-plan RC nonzero
  ARGS --profile 1:20,8 EXPECT "cannot read \"8\"")
tailbatch_cli_test(plan_bad_streams tailbatch-plan RC nonzero
  ARGS --base-ms 20 --streams 0 EXPECT "streams must be >= 1")
tailbatch_cli_test(plan_conflicting_modes tailbatch-plan RC nonzero
  ARGS --instance-rps 350 --p95-ms 120 --base-ms 20 --target-rps 10 EXPECT "excludes")
tailbatch_cli_test(plan_slo_unreachable tailbatch-plan RC 3
  ARGS --base-ms 20 --slo-p95-ms 10 EXPECT "no candidate meets the SLO")

# ---- tailbatch-load ----------------------------------------------------------------------
# A fast synthetic model (2 ms + 0.5 ms per extra item) and short runs: each test takes
# about a second or two.
set(_fast_model --base-ms 2 --per-item-ms 0.5 --lanes 2 --max-batch 8 --window-ms 2)

tailbatch_cli_test(load_run tailbatch-load RC 0
  ARGS ${_fast_model} --rate 100 --duration 1 --warmup 0.2 --out plots --quiet
  EXPECT "latency from intended send: p50 [0-9.]+ ms  p95 [0-9.]+ ms"
         "p95 meets the SLO of 100 ms"
         "plots/p95_over_time.svg")

tailbatch_cli_test(load_sweep tailbatch-load RC 0
  ARGS ${_fast_model} --sweep 50,100 --duration 0.8 --warmup 0.2 --slo-p95-ms 200 --out plots
  EXPECT "offered +achieved +p50 +p95"
         "saturation point: 100 rps offered"
         "[[]load 50 rps 1/2[]]"
         "plots/latency_vs_load.svg"
         "plots/throughput_vs_load.svg")

tailbatch_cli_test(load_steps tailbatch-load RC 0
  ARGS ${_fast_model} --steps 50:0.5,200:0.5 --warmup 0 --arrivals constant --out plots --quiet
  EXPECT "offered [0-9.]+ rps, throughput [0-9.]+ rps")

tailbatch_cli_test(load_no_mode tailbatch-load RC nonzero
  ARGS --duration 1 EXPECT "give --rate, --sweep or --steps")
tailbatch_cli_test(load_conflicting_modes tailbatch-load RC nonzero
  ARGS --rate 100 --sweep 100,200 EXPECT "excludes")
tailbatch_cli_test(load_bad_rate tailbatch-load RC nonzero
  ARGS --rate -5 EXPECT "--rate")
tailbatch_cli_test(load_bad_arrivals tailbatch-load RC nonzero
  ARGS --rate 10 --arrivals bursty EXPECT "--arrivals")
tailbatch_cli_test(load_bad_steps tailbatch-load RC nonzero
  ARGS --steps 100 --quiet EXPECT "cannot read \"100\"")
tailbatch_cli_test(load_cap_starves_batcher tailbatch-load RC nonzero
  ARGS --rate 10 --max-in-flight 4 --max-batch 16 --lanes 2 --quiet EXPECT "admission limit is below")

# ---- before_after_demo -------------------------------------------------------------------
# The flagship demo in its short form (about 15 s): it runs, measures both setups, and
# prints a verdict computed from its measurements (which verdict depends on the machine).
tailbatch_cli_test(demo_quick before_after_demo RC 0
  ARGS --quick --out plots
  EXPECT "BEFORE: batching off"
         "AFTER: dynamic batching"
         "saturation point [(]highest offered rate"
         "mini challenge [(]reduce p95 by 20 % without increasing cost per request[)]: (MET|NOT MET)"
         "plots/latency_vs_load.svg"
         "plots/cost_vs_load.svg")
tailbatch_cli_test(demo_bad_window before_after_demo RC nonzero
  ARGS --window-ms -1 EXPECT "--window-ms")

tailbatch_cli_test(load_simulated_sweep tailbatch-load RC 0
  ARGS --sweep 100,200,300,400,450,500 --duration 6 --warmup 1 --slo-p95-ms 100 --simulate --out plots
  EXPECT "simulated: synthetic model"
         "saturation point: 400 rps offered"
         "plots/latency_vs_load.svg")
tailbatch_cli_test(load_simulated_run tailbatch-load RC 0
  ARGS --rate 300 --max-in-flight 40 --simulate --out plots
  EXPECT "requests: [0-9]+ due, [0-9]+ ok"
         "mean batch [0-9.]+; lanes busy [0-9]+ % of the time")
