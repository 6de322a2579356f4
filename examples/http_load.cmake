# tailbatch-load's --url mode (examples/http_load.hpp) is an asynchronous HTTP client on
# Boost's header-only Beast/Asio, the server's dependency. Where Boost is missing,
# tailbatch-load is built without it and its --help says so.
find_package(Boost 1.70 QUIET)
if(TARGET tailbatch-load)
  if(Boost_FOUND)
    target_link_libraries(tailbatch-load PRIVATE Boost::headers Threads::Threads)
    target_compile_definitions(tailbatch-load PRIVATE TAILBATCH_LOAD_HTTP BOOST_ASIO_NO_DEPRECATED)
  else()
    message(STATUS "tailbatch: tailbatch-load without --url: Boost headers not found (Debian: libboost-dev)")
  endif()
endif()
