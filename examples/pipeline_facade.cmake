# examples/pipeline_facade/: a Pipeline behind a server's own interface, so that one source
# file names the Pipeline's type and the request handlers include no tailbatch header
# (docs/pipeline.md, "Build time"). The service is a library that links tailbatch
# privately; the program links only the service, so a tailbatch include in main.cpp would
# not compile.
add_library(pipeline_facade_service STATIC pipeline_facade/square_service.cpp)
target_link_libraries(pipeline_facade_service PRIVATE tailbatch_dev)
target_include_directories(pipeline_facade_service PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/pipeline_facade)
target_compile_features(pipeline_facade_service PUBLIC cxx_std_20)

add_executable(pipeline_facade pipeline_facade/main.cpp)
target_link_libraries(pipeline_facade PRIVATE pipeline_facade_service)
# The project's warnings for the handler's file too (tailbatch_dev would also bring
# tailbatch's include directory, which this file must not have).
target_compile_options(pipeline_facade PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>)

if(TAILBATCH_BUILD_TESTS)
  add_test(NAME pipeline_facade_smoke COMMAND pipeline_facade)
  set_tests_properties(pipeline_facade_smoke PROPERTIES LABELS example TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "square\\(7\\) = 49\nafter shutdown: [a-z_]+")
endif()
