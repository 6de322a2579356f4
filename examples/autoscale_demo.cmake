# autoscale_demo parses its arguments with CLI11 (see cli.cmake). It simulates about four
# million requests; unoptimised (Debug) that takes minutes, so it is always built with at
# least -O1, which keeps its ctest (tests/autoscale_demo.cmake) to a few seconds.
find_package(CLI11 REQUIRED)
if(TARGET autoscale_demo)
  target_link_libraries(autoscale_demo PRIVATE CLI11::CLI11)
  target_compile_options(autoscale_demo PRIVATE $<$<CONFIG:Debug>:-O1>)
endif()
