# Runs autoscale_demo --json and checks the spike-and-autoscale goals:
#   tailbatch's Autoscaler has fewer violation seconds than HPA on CPU utilisation (none,
#   when HPA has none) at no more than 1.1x HPA's replica-seconds, and no more than 1.3x
#   the violation seconds of a fixed fleet sized for the peak at under 0.9x its cost.
#   cmake -DDEMO=path/to/autoscale_demo -DOUT_DIR=dir [-DARGS="--hpa-target 0.87"] [-DSTRICT=ON]
#         -P check_goals.cmake
# ARGS are passed on to the demo. STRICT=ON requires HPA to violate the SLO and the
# Autoscaler to violate it strictly less (the equal-cost comparison: HPA's target raised
# until its replica-seconds come near the Autoscaler's).
separate_arguments(ARGS UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${DEMO} --json --out-dir ${OUT_DIR} ${ARGS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "autoscale_demo exited with ${rc}")
endif()

string(JSON n LENGTH "${out}")
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 policies, got ${n}")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON policy GET "${out}" ${i} policy)
  string(JSON members LENGTH "${out}" ${i})
  if(NOT members EQUAL 6)
    message(FATAL_ERROR "${policy}: expected exactly 6 fields, got ${members}")
  endif()
  foreach(field violation_s p95_ms p99_ms replica_s max_replicas)
    string(JSON v GET "${out}" ${i} ${field})
    set(${policy}_${field} ${v})
  endforeach()
endforeach()
foreach(p tailbatch hpa_cpu fixed_peak)
  if(NOT DEFINED ${p}_replica_s)
    message(FATAL_ERROR "policy ${p} missing from the output")
  endif()
endforeach()

set(failed FALSE)
# expect("a;OP;b" what): the condition as a list, so that if() sees three arguments.
macro(expect cond what)
  set(_cond ${cond})
  if(${_cond})
    message(STATUS "ok: ${what}")
  else()
    message(SEND_ERROR "goal missed: ${what}")
    set(failed TRUE)
  endif()
endmacro()

# violation_s and replica_s are whole seconds: integer arithmetic is exact.
if(STRICT)
  expect("${hpa_cpu_violation_s};GREATER;0" "hpa_cpu violates the SLO (${hpa_cpu_violation_s} s) at this target")
endif()
if(hpa_cpu_violation_s GREATER 0)
  expect("${tailbatch_violation_s};LESS;${hpa_cpu_violation_s}"
         "tailbatch ${tailbatch_violation_s} violation s < hpa_cpu ${hpa_cpu_violation_s}")
else()
  expect("${tailbatch_violation_s};EQUAL;0" "tailbatch ${tailbatch_violation_s} violation s, as hpa_cpu's 0")
endif()
math(EXPR a_cost "${tailbatch_replica_s} * 10")
math(EXPR hpa_budget "${hpa_cpu_replica_s} * 11")
expect("${a_cost};LESS_EQUAL;${hpa_budget}"
       "tailbatch ${tailbatch_replica_s} replica-s <= 1.1 x hpa_cpu ${hpa_cpu_replica_s}")
math(EXPR a_viol "${tailbatch_violation_s} * 10")
math(EXPR peak_viol "${fixed_peak_violation_s} * 13")
expect("${a_viol};LESS_EQUAL;${peak_viol}"
       "tailbatch ${tailbatch_violation_s} violation s <= 1.3 x fixed_peak ${fixed_peak_violation_s}")
math(EXPR peak_budget "${fixed_peak_replica_s} * 9")
expect("${a_cost};LESS_EQUAL;${peak_budget}"
       "tailbatch ${tailbatch_replica_s} replica-s <= 0.9 x fixed_peak ${fixed_peak_replica_s}")

foreach(plot p95.svg replicas.svg)
  if(NOT EXISTS ${OUT_DIR}/${plot})
    message(SEND_ERROR "plot not written: ${OUT_DIR}/${plot}")
    set(failed TRUE)
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "autoscale_demo goals missed")
endif()
