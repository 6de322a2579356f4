# benchmarks/adaptive/adaptive_goals: the AdaptiveWindow goals measured in the simulator
# (tables and plots for docs/adaptive-window.md; run by benchmarks/adaptive/run.sh).
add_executable(adaptive_goals ${CMAKE_CURRENT_SOURCE_DIR}/adaptive/adaptive_goals.cpp)
target_link_libraries(adaptive_goals PRIVATE tailbatch_dev tailbatch::tools)
