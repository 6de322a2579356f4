# benchmarks/kv_cache/kv_load: the KV-cache goals measured live on the reference generator
# (grow vs reserve, shared-prefix reuse; run by benchmarks/kv_cache/run.sh, recorded in
# docs/performance.md).
add_executable(kv_load ${CMAKE_CURRENT_SOURCE_DIR}/kv_cache/kv_load.cpp)
target_link_libraries(kv_load PRIVATE tailbatch_dev tailbatch::reference)
# benchmarks/kv_cache/step_cost: fits the generation simulator's step-cost model to the
# reference generator on this machine (docs/performance.md, "Simulated").
add_executable(step_cost ${CMAKE_CURRENT_SOURCE_DIR}/kv_cache/step_cost.cpp)
target_link_libraries(step_cost PRIVATE tailbatch_dev tailbatch::reference)
