# `include_layers`: the headers under include/tailbatch/ include only downwards. From the
# bottom up (docs/architecture.md, "Layers" argues the cut):
#
#   bottom       detail/time.hpp, detail/math.hpp, detail/throw.hpp, detail/hash.hpp,
#                detail/enum_names.hpp: time arithmetic, numeric helpers, the one throw point,
#                hashing, enumerator names. They include
#                no tailbatch header.
#   vocabulary   batch_policy.hpp, clock.hpp, outcome.hpp, submit_options.hpp,
#                queue_policy.hpp, tenants.hpp, version.hpp: the types every component
#                speaks (BatchView, BatchDecision, the BatchPolicy concepts, Clock, Status,
#                Outcome, SubmitOptions, Priority, QueuePolicyConfig, TenantsConfig). They
#                include the bottom and each other.
#   machinery    detail/<owner>/*.hpp: the parts of one component (detail/pipeline/ the
#                Pipeline's, detail/cache/ the ResultCache's, ...), and the other files
#                directly under detail/ (shared by several components). They include the
#                bottom, the vocabulary, their own owner's and the shared machinery, never
#                a component header.
#   components   every other public header (cuda/ included): anything below them, and each
#                other.
#   umbrellas    tailbatch.hpp, cuda.hpp: included by users, never by a header.
#
# Machinery shared by several components sits directly under detail/ beside the bottom.
# And the core stays CUDA-free: only cuda/ and cuda.hpp include cuda/ headers.
#
# Known exceptions, each an include the layering says should go (the machinery still takes
# the metric types from metrics.hpp and the adaptive policy's plan from adaptive_plan.hpp),
# are listed below with the file that has them. The check fails on any include outside the
# rules and not in this list; an entry that no longer occurs is reported, so that the list
# only shrinks.
#
# With -DMAP=<docs/architecture.md> it also checks that the page's map names every header.
#
# This file plays two parts: included by tests/CMakeLists.txt it registers the test; run
# with `cmake -DROOT=<include dir> -P` it checks.

set(_tailbatch_layer_exceptions
    "detail/adaptive/state.hpp -> adaptive_plan.hpp"
    "detail/adaptive/state.hpp -> metrics.hpp"
    # The ledger records into the end-to-end LatencyHistogram and reads in load.hpp's and
    # littles_law.hpp's shapes; the Pipeline's constructor checks take its config's types.
    "detail/outcome_ledger.hpp -> latency_histogram.hpp"
    "detail/outcome_ledger.hpp -> littles_law.hpp"
    "detail/outcome_ledger.hpp -> load.hpp"
    "detail/pipeline/validate.hpp -> pipeline_config.hpp"
    "detail/pipeline/metrics.hpp -> metrics.hpp"
    "detail/tenant_series.hpp -> metrics.hpp")

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.20)  # IN_LIST, in script mode too
else()
  add_test(NAME include_layers
           COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR}/include/tailbatch
                   -DMAP=${PROJECT_SOURCE_DIR}/docs/architecture.md
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/include_layers.cmake)
  set_tests_properties(include_layers PROPERTIES LABELS unit TIMEOUT 60)
  return()
endif()

set(_bottom detail/time.hpp detail/math.hpp detail/throw.hpp detail/hash.hpp detail/enum_names.hpp)
set(_vocabulary batch_policy.hpp clock.hpp outcome.hpp submit_options.hpp queue_policy.hpp tenants.hpp
                version.hpp)
set(_umbrellas tailbatch.hpp cuda.hpp)
# Machinery that uses another owner's: the registry's exposition (detail/metrics/) writes
# the buckets of the histogram's layout (detail/histogram/), as metrics.hpp is built on
# latency_histogram.hpp.
set(_machinery_uses "metrics -> histogram")

# The layer of a header, by its path under include/tailbatch/: 0 bottom, 1 vocabulary,
# 2 machinery, 3 component, 4 umbrella.
function(_tailbatch_layer_of path out)
  if(path IN_LIST _bottom)
    set(${out} 0 PARENT_SCOPE)
  elseif(path IN_LIST _vocabulary)
    set(${out} 1 PARENT_SCOPE)
  elseif(path MATCHES "^detail/")
    set(${out} 2 PARENT_SCOPE)
  elseif(path IN_LIST _umbrellas)
    set(${out} 4 PARENT_SCOPE)
  else()
    set(${out} 3 PARENT_SCOPE)
  endif()
endfunction()

set(_names bottom vocabulary machinery component umbrella)
if(NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "include_layers: no include directory at '${ROOT}'")
endif()
file(GLOB_RECURSE _headers RELATIVE "${ROOT}" "${ROOT}/*.hpp")
list(SORT _headers)
set(_errors "")
set(_seen_exceptions "")
set(_edges 0)
foreach(_h IN LISTS _headers)
  _tailbatch_layer_of("${_h}" _from)
  list(GET _names ${_from} _from_name)
  file(STRINGS "${ROOT}/${_h}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*<tailbatch/")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<tailbatch/([^>]+)>.*$" "\\1" _to "${_line}")
    if(NOT EXISTS "${ROOT}/${_to}")
      continue()  # another root (tailbatch/tools/, tailbatch/reference/): not this check's
    endif()
    math(EXPR _edges "${_edges} + 1")
    _tailbatch_layer_of("${_to}" _to_layer)
    set(_why "")
    if(_to_layer EQUAL 4)
      set(_why "includes an umbrella")
    elseif(_to_layer GREATER _from)
      list(GET _names ${_to_layer} _to_name)
      set(_why "a ${_from_name} header includes a ${_to_name} header")
    elseif(_from EQUAL 2 AND _to_layer EQUAL 2)
      # Machinery in detail/<owner>/ serves one owner: it includes its own folder, shared
      # machinery (directly under detail/), or the folder of a component its owner is built
      # on (_machinery_uses). Shared machinery includes only shared machinery.
      set(_own "")
      set(_other "")
      if(_h MATCHES "^detail/([^/]+)/")
        set(_own "${CMAKE_MATCH_1}")
      endif()
      if(_to MATCHES "^detail/([^/]+)/")
        set(_other "${CMAKE_MATCH_1}")
      endif()
      if(NOT _own STREQUAL _other AND NOT _other STREQUAL "" AND NOT "${_own} -> ${_other}" IN_LIST _machinery_uses)
        if(_own STREQUAL "")
          set(_why "shared machinery includes the machinery of detail/${_other}/")
        else()
          set(_why "machinery of detail/${_own}/ includes machinery of detail/${_other}/")
        endif()
      endif()
    endif()
    if(_to MATCHES "^cuda/" AND NOT _h MATCHES "^cuda/" AND NOT _h STREQUAL "cuda.hpp")
      set(_why "the core includes a CUDA header")
    endif()
    if(_why)
      set(_edge "${_h} -> ${_to}")
      if(_edge IN_LIST _tailbatch_layer_exceptions)
        list(APPEND _seen_exceptions "${_edge}")
      else()
        string(APPEND _errors "  ${_edge}: ${_why}\n")
      endif()
    endif()
  endforeach()
endforeach()

# The map in docs/architecture.md names every header (as `path/under/include/tailbatch`).
if(MAP)
  file(READ "${MAP}" _map)
  foreach(_h IN LISTS _headers)
    string(FIND "${_map}" "`${_h}`" _at)
    if(_at EQUAL -1)
      string(APPEND _errors "  ${_h}: not in the map of ${MAP} (name it there, in backticks)\n")
    endif()
  endforeach()
endif()

foreach(_edge IN LISTS _tailbatch_layer_exceptions)
  if(NOT _edge IN_LIST _seen_exceptions)
    message(STATUS "include_layers: '${_edge}' is listed as an exception but no longer occurs: remove it from tests/include_layers.cmake")
  endif()
endforeach()
list(LENGTH _headers _count)
list(LENGTH _seen_exceptions _excepted)
if(_errors)
  message(FATAL_ERROR "include_layers: includes that go up a layer (docs/architecture.md, \"Layers\"), or headers missing from its map:\n${_errors}")
endif()
message(STATUS "include_layers: ${_count} headers, ${_edges} includes, all downwards (${_excepted} listed exceptions)")
