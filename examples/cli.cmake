# The command-line tools and the before/after demo parse their arguments with CLI11 (Debian: libcli11-dev; scripts/deps.sh
# installs it). Each is built from examples/<name>.cpp by the glob in CMakeLists.txt; this
# adds CLI11 to them.
find_package(CLI11 REQUIRED)
foreach(_tool tailbatch-plan tailbatch-load before_after_demo)
  if(TARGET ${_tool})
    target_link_libraries(${_tool} PRIVATE CLI11::CLI11)
  endif()
endforeach()
