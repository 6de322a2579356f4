# bench_libtorch: the libtorch encoder called directly and through a Pipeline
# (docs/performance.md), built only where libtorch is (cmake/TailbatchTorch.cmake).
if(TAILBATCH_HAS_TORCH)
  add_executable(bench_libtorch bench_libtorch.cpp)
  target_link_libraries(bench_libtorch PRIVATE tailbatch_libtorch_example benchmark::benchmark)
endif()
