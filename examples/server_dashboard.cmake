# tailbatch-serve's GET /dashboard (after server.cmake, which defines the target).
# examples/server/dashboard.html is embedded into the binary at build time (as a C++ raw
# string in <build>/examples/generated/dashboard_html.inc, regenerated when the page
# changes), so the installed server needs no files beside it. The page draws its charts
# with Chart.js from Debian's libjs-chart.js, which the server serves as /static/chart.js
# from the path found here (read at each request; the page says so when it is missing).
if(NOT TARGET tailbatch-serve)
  return()
endif()
set(_dashboard_src ${CMAKE_CURRENT_SOURCE_DIR}/server/dashboard.html)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_dashboard_src})
file(READ ${_dashboard_src} _dashboard_html)
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/generated/dashboard_html.inc
     CONTENT "R\"tbdash(${_dashboard_html})tbdash\"\n" @ONLY)
target_include_directories(tailbatch-serve PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
find_file(TAILBATCH_CHART_JS NAMES chart.umd.js chart.min.js PATHS /usr/share/javascript/chart.js NO_DEFAULT_PATH
          DOC "Chart.js (Debian: libjs-chart.js), served by tailbatch-serve as /static/chart.js")
if(TAILBATCH_CHART_JS)
  target_compile_definitions(tailbatch-serve PRIVATE TAILBATCH_SERVE_CHART_JS="${TAILBATCH_CHART_JS}")
else()
  message(STATUS "tailbatch: Chart.js not found (Debian: libjs-chart.js); /dashboard will say so")
endif()
