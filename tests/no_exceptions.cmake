# Components that support it compile and work in a translation unit built with
# -fno-exceptions (bad configuration then aborts with a message instead of throwing).
add_executable(test_no_exceptions ${CMAKE_CURRENT_SOURCE_DIR}/no_exceptions_main.cpp)
target_link_libraries(test_no_exceptions PRIVATE tailbatch_dev)
target_compile_options(test_no_exceptions PRIVATE -fno-exceptions)
add_test(NAME test_no_exceptions COMMAND test_no_exceptions)
