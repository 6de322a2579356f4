# LatencyHistogram, HistogramSnapshot and RollingHistogram compile and work in a
# translation unit built with -fno-exceptions.
add_executable(test_histogram_no_exceptions ${CMAKE_CURRENT_SOURCE_DIR}/histogram_no_exceptions_main.cpp)
target_link_libraries(test_histogram_no_exceptions PRIVATE tailbatch_dev)
target_compile_options(test_histogram_no_exceptions PRIVATE -fno-exceptions)
add_test(NAME test_histogram_no_exceptions COMMAND test_histogram_no_exceptions)
