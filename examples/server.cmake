# tailbatch-serve (examples/server/): the example HTTP server. It needs Boost's header-only
# Beast/Asio (Debian: libboost-dev), nlohmann-json (nlohmann-json3-dev) and CLI11
# (libcli11-dev), which scripts/deps.sh installs; the core library needs none of them.
# Where one is missing the server is skipped with a message, and so is its test.
find_package(Boost 1.70 QUIET)
find_package(nlohmann_json 3 QUIET)
find_package(CLI11 QUIET)
if(Boost_FOUND AND nlohmann_json_FOUND AND CLI11_FOUND)
  add_executable(tailbatch-serve ${CMAKE_CURRENT_SOURCE_DIR}/server/tailbatch_serve.cpp)
  target_link_libraries(tailbatch-serve PRIVATE tailbatch_dev tailbatch::reference Boost::headers nlohmann_json::nlohmann_json
                                                CLI11::CLI11 Threads::Threads)
  target_include_directories(tailbatch-serve PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/server)
  # Asio's own deprecated interfaces stay out of the build.
  target_compile_definitions(tailbatch-serve PRIVATE BOOST_ASIO_NO_DEPRECATED)
  # Where libtorch was found (cmake/TailbatchTorch.cmake): --embed-model libtorch serves
  # /v1/embeddings from examples/libtorch's encoder, its weights by default the file the
  # build writes (examples/libtorch.cmake). Elsewhere the server is built as before and
  # that flag fails at start-up.
  if(TAILBATCH_HAS_TORCH)
    target_link_libraries(tailbatch-serve PRIVATE tailbatch_libtorch_example)
    target_compile_definitions(tailbatch-serve PRIVATE TAILBATCH_SERVE_LIBTORCH
                                                       TAILBATCH_LIBTORCH_WEIGHTS="${CMAKE_CURRENT_BINARY_DIR}/libtorch/encoder.pt")
    add_dependencies(tailbatch-serve libtorch_weights)
  endif()
  # examples/minimal_server.cpp (built by examples/CMakeLists.txt's glob): the smallest
  # server to copy from, one route and one Pipeline. It needs Boost and nlohmann-json too.
  target_link_libraries(minimal_server PRIVATE Boost::headers nlohmann_json::nlohmann_json Threads::Threads)
  target_compile_definitions(minimal_server PRIVATE BOOST_ASIO_NO_DEPRECATED)
else()
  set(_missing)
  if(NOT Boost_FOUND)
    list(APPEND _missing "Boost headers (Debian: libboost-dev)")
  endif()
  if(NOT nlohmann_json_FOUND)
    list(APPEND _missing "nlohmann-json (Debian: nlohmann-json3-dev)")
  endif()
  if(NOT CLI11_FOUND)
    list(APPEND _missing "CLI11 (Debian: libcli11-dev)")
  endif()
  list(JOIN _missing ", " _missing)
  set_target_properties(minimal_server PROPERTIES EXCLUDE_FROM_ALL TRUE)
  message(STATUS "tailbatch: skipping tailbatch-serve and minimal_server: missing ${_missing}; scripts/deps.sh installs them")
endif()
