# bench_histogram also measures record() called from -fPIC shared libraries: one built with
# the default TLS model, one with initial-exec (TAILBATCH_HISTOGRAM_TLS_MODEL).
if(TARGET bench_histogram)
  set(_tb_recorder_src ${CMAKE_CURRENT_LIST_DIR}/support/histogram_shared_recorder.cpp)
  add_library(bench_histogram_pic SHARED ${_tb_recorder_src})
  target_compile_definitions(bench_histogram_pic PRIVATE
    TAILBATCH_BENCH_RECORD_NAME=tailbatch_bench_record_pic)
  add_library(bench_histogram_pic_ie SHARED ${_tb_recorder_src})
  target_compile_definitions(bench_histogram_pic_ie PRIVATE
    TAILBATCH_BENCH_RECORD_NAME=tailbatch_bench_record_pic_initial_exec
    "TAILBATCH_HISTOGRAM_TLS_MODEL=[[gnu::tls_model(\"initial-exec\")]]")
  foreach(_lib bench_histogram_pic bench_histogram_pic_ie)
    target_link_libraries(${_lib} PRIVATE tailbatch_dev)
    target_include_directories(${_lib} PUBLIC ${CMAKE_CURRENT_LIST_DIR}/support)
  endforeach()
  target_link_libraries(bench_histogram PRIVATE bench_histogram_pic bench_histogram_pic_ie)
endif()
