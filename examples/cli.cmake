# The before/after demo parses its arguments with CLI11 (Debian: libcli11-dev; scripts/deps.sh
# installs it). It is built from examples/before_after_demo.cpp by the glob in
# CMakeLists.txt; this adds CLI11 to it. (The CLIs proper live in tools/cli/.)
find_package(CLI11 REQUIRED)
if(TARGET before_after_demo)
  target_link_libraries(before_after_demo PRIVATE CLI11::CLI11)
endif()
