# Consumer projects: tailbatch built and used the four ways users take it. Each is a ctest
# that configures, builds and runs a small program in a project of its own.
set(_consumer_src ${CMAKE_CURRENT_SOURCE_DIR}/consumers)
set(_consumer_bin ${CMAKE_CURRENT_BINARY_DIR}/consumers)
set(_consumer_prefix ${_consumer_bin}/prefix)
set(_consumer_options
  -DTAILBATCH_SOURCE_DIR=${PROJECT_SOURCE_DIR}
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
  -DCMAKE_BUILD_TYPE=Release)

# Where the CUDA toolkit is installed, the subproject consumers configure with nvcc on PATH:
# tailbatch must still not enable CUDA there (tests/consumers/add_subdirectory checks it).
find_program(_tailbatch_nvcc nvcc PATHS /usr/local/cuda/bin NO_CACHE)
set(_consumer_env)
if(_tailbatch_nvcc)
  get_filename_component(_nvcc_dir ${_tailbatch_nvcc} DIRECTORY)
  set(_consumer_env "PATH=${_nvcc_dir}:$ENV{PATH}")
endif()

foreach(_mode add_subdirectory fetchcontent copy_include)
  add_test(NAME consumer_${_mode}
    COMMAND ${CMAKE_CTEST_COMMAND}
      --build-and-test ${_consumer_src}/${_mode} ${_consumer_bin}/${_mode}
      --build-generator ${CMAKE_GENERATOR}
      --build-options ${_consumer_options}
      --test-command consumer)
  set_tests_properties(consumer_${_mode} PROPERTIES LABELS consumer TIMEOUT 600)
  if(_consumer_env)
    set_tests_properties(consumer_${_mode} PROPERTIES ENVIRONMENT "${_consumer_env}")
  endif()
endforeach()

# find_package after `cmake --install` into a temporary prefix.
add_test(NAME consumer_install
  COMMAND ${CMAKE_COMMAND} --install ${PROJECT_BINARY_DIR} --prefix ${_consumer_prefix})
set_tests_properties(consumer_install PROPERTIES FIXTURES_SETUP tailbatch_installed
                                                 LABELS consumer)
add_test(NAME consumer_find_package
  COMMAND ${CMAKE_CTEST_COMMAND}
    --build-and-test ${_consumer_src}/find_package ${_consumer_bin}/find_package
    --build-generator ${CMAKE_GENERATOR}
    --build-options ${_consumer_options} -DCMAKE_PREFIX_PATH=${_consumer_prefix}
    --test-command consumer)
set_tests_properties(consumer_find_package PROPERTIES FIXTURES_REQUIRED tailbatch_installed
                                                      LABELS consumer TIMEOUT 600)
