# ctests that run the command-line tools (tailbatch-plan, tailbatch-load) as a user would:
# a good run, the --json contract fields, and bad arguments (a clear message and a non-zero
# exit). The tools are examples, so these exist only when examples are built.
if(NOT TAILBATCH_BUILD_EXAMPLES)
  return()
endif()

include(${CMAKE_CURRENT_SOURCE_DIR}/cli/cli_test.cmake)

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

# Counts past INT_MAX are printed exactly; counts past 2^53 - 1 (or infinite) are refused
# with a message; none ever wraps to a negative number.
tailbatch_cli_test(plan_huge_target tailbatch-plan RC 0
  ARGS --base-ms 20 --target-rps 1e12 --all
  EXPECT "312500000 replicas [(]406250000 with headroom[)]"
         "     1 .* 20000000000 +26000000000 "
  FORBID "-[0-9]+ replicas" " -[0-9]+ " "-2147483648")
tailbatch_cli_test(plan_huge_target_json tailbatch-plan RC 0
  ARGS --base-ms 20 --target-rps 1e12 --json
  EXPECT "{\"batch_size\": 1, [^}]*\"replicas\": 20000000000, \"replicas_with_headroom\": 26000000000,"
  FORBID "-2147483648" "\"replicas[a-z_]*\": -")
tailbatch_cli_test(plan_tiny_instance tailbatch-plan RC 1
  ARGS --instance-rps 1e-300 --p95-ms 100 --target-rps 10
  EXPECT "error: replicas_for: .*more than the planner counts" FORBID "-2147483648")
tailbatch_cli_test(plan_tiny_instance_json tailbatch-plan RC 1
  ARGS --instance-rps 1e-300 --p95-ms 100 --target-rps 10 --json
  EXPECT "error: replicas_for: .*more than the planner counts" FORBID "-2147483648" "\"mode\"")
tailbatch_cli_test(plan_huge_headroom tailbatch-plan RC 1
  ARGS --base-ms 20 --target-rps 100 --headroom 1e308
  EXPECT "error: replicas_for: .*headroom 1e[+]308.*more than the planner counts" FORBID "-2147483648")
tailbatch_cli_test(plan_huge_headroom_json tailbatch-plan RC 1
  ARGS --base-ms 20 --target-rps 100 --headroom 1e308 --json
  EXPECT "more than the planner counts" FORBID "-2147483648" "\"mode\"")

# Any --max-batch plans a bounded set of candidates, and the answer is the exact largest
# size that meets the SLO. The timeout only catches a hang; the unit test checks the bound.
tailbatch_cli_test(plan_max_batch_int_max tailbatch-plan RC 0
  ARGS --base-ms 20 --per-item-ms 0.000001 --network-ms 5 --window-ms 8 --slo-p95-ms 150
       --max-batch 2147483647 --json
  EXPECT "\"recommended\": {\"batch_size\": 9200000[0-9]," "{\"batch_size\": 2147483647,")
tailbatch_cli_test(plan_max_batch_10m tailbatch-plan RC 0
  ARGS --base-ms 20 --per-item-ms 0.001 --max-batch 10000000
  EXPECT "recommended [(][*][)]: batch 10000000,")
set_tests_properties(cli_plan_max_batch_int_max cli_plan_max_batch_10m PROPERTIES TIMEOUT 30)

# Flags whose values cannot be used: a message naming the flag and the problem, exit 1.
tailbatch_cli_test(plan_profile_missing tailbatch-plan RC 1
  ARGS --profile /nonexistent EXPECT "--profile: no such file: /nonexistent" FORBID "no batch:ms pairs")
tailbatch_cli_test(plan_profile_missing_relative tailbatch-plan RC 1
  ARGS --profile profile.csv EXPECT "--profile: no such file: profile.csv")
# (A ctest cannot pass an empty argument; "--flag=" is how one is typed by mistake.)
tailbatch_cli_test(plan_profile_empty tailbatch-plan RC 1
  ARGS --profile= EXPECT "--profile: 1 required TEXT missing")
tailbatch_cli_test(plan_target_not_a_number tailbatch-plan RC 1
  ARGS --base-ms 20 --target-rps abc EXPECT "--target-rps: \"abc\" is not a number")
tailbatch_cli_test(plan_empty_number tailbatch-plan RC 1
  ARGS --base-ms= EXPECT "--base-ms: 1 required FLOAT:NUMBER missing")
tailbatch_cli_test(plan_empty_streams tailbatch-plan RC 1
  ARGS --base-ms 20 --streams= EXPECT "--streams: 1 required INT:INT missing" FORBID "streams must be >= 1")
tailbatch_cli_test(plan_max_batch_out_of_range tailbatch-plan RC 1
  ARGS --base-ms 20 --max-batch 2147483648 EXPECT "--max-batch: \"2147483648\" is out of range")
tailbatch_cli_test(plan_preferred_empty_item tailbatch-plan RC 1
  ARGS --base-ms 20 --preferred 8,,16 EXPECT "--preferred: item 2 of \"8,,16\": the value is empty")

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
# A smoke test of the flagship demo in its short form (about 15 s): it runs, measures both
# setups, and prints a verdict computed from its measurements. Which verdict depends on
# the machine, so MET and NOT MET both pass: the test checks that the demo works, not
# that batching wins here.
tailbatch_cli_test(demo_quick_smoke before_after_demo RC 0
  ARGS --quick --out plots
  EXPECT "BEFORE: batching off"
         "AFTER: dynamic batching"
         "saturation point [(]highest offered rate"
         "mini challenge [(]reduce p95 by 20 % without increasing cost per request[)]: (MET|NOT MET)"
         "plots/latency_vs_load.svg"
         "plots/cost_vs_load.svg"
         "planner vs measured at each rate"
         "offered +plan rps +batch +window ms +adapt predicted +measured +fixed predicted +measured"
         " [0-9]+ +[0-9]+ +[0-9]+ +[0-9]+[.][0-9][0-9][0-9] +[0-9]+[.][0-9][0-9] +[0-9]+[.][0-9][0-9] +[0-9]+[.][0-9][0-9] +([0-9]+[.][0-9][0-9]|-)")
tailbatch_cli_test(demo_bad_window before_after_demo RC nonzero
  ARGS --window-ms -1 EXPECT "--window-ms")
# A --results path that cannot be written fails at once, not after the minutes of the run.
tailbatch_cli_test(demo_bad_results before_after_demo RC nonzero
  ARGS --results no/such/dir/results.jsonl EXPECT "--results: cannot write no/such/dir/results.jsonl")

tailbatch_cli_test(load_simulated_sweep tailbatch-load RC 0
  ARGS --sweep 100,200,300,400,450,500 --duration 6 --warmup 1 --slo-p95-ms 100 --simulate --out plots
  EXPECT "simulated: synthetic model"
         "saturation point: 400 rps offered"
         "plots/latency_vs_load.svg")
tailbatch_cli_test(load_simulated_run tailbatch-load RC 0
  ARGS --rate 300 --max-in-flight 40 --simulate --out plots
  EXPECT "requests: [0-9]+ due, [0-9]+ ok"
         "mean batch [0-9.]+; lanes busy [0-9]+ % of the time")
