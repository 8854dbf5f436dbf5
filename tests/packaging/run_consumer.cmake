# cmake -DMODE=find_package|fetchcontent -DSOURCE_DIR=<checkout> -DWORK_DIR=<scratch>
#       -DGENERATOR=<generator> -DCXX=<compiler> [-DMAKE_PROGRAM=<ninja/make>] [-DVERSION=x.y.z]
#       [-DFEATURES=cuda,nccl,gloo,etcd] -P run_consumer.cmake
# Builds the consumer project against elastic the way a user would, and runs it.
#   find_package: configure the checkout (tools on; tests, examples, benchmarks off), build,
#                 install to WORK_DIR/prefix, then build the consumer with CMAKE_PREFIX_PATH there.
#   fetchcontent: build the consumer, which pulls the checkout in with FetchContent.
# FEATURES names the optional targets the outer build has (their dependencies are on this
# machine): the install must export each, and the consumer must get and link each.
# Nothing of the outer build's configuration (sanitizers, flags) is passed on: only the
# generator and the compiler.
cmake_minimum_required(VERSION 3.21)

foreach(v MODE SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake needs -D${v}=...")
  endif()
endforeach()

function(run)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(TIMESTAMP t1 "%s")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  math(EXPR dt "${t1} - ${t0}")
  list(JOIN ARGN " " cmd)
  message(STATUS "[${dt} s] ${cmd}")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# A watchdog named in the environment would make the consumer's scopes real; it must run without.
unset(ENV{ELASTIC_WATCHDOG})

file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer "${SOURCE_DIR}/tests/packaging/consumer")
set(config Release)
set(common -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" -DCMAKE_BUILD_TYPE=${config})
if(MAKE_PROGRAM)
  list(APPEND common "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/elastic" ${common}
      -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_EXAMPLES=OFF -DELASTIC_BUILD_BENCHMARKS=OFF
      -DELASTIC_BUILD_TOOLS=ON -DELASTIC_INSTALL=ON)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/elastic" --config ${config})
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/elastic" --config ${config} --prefix "${WORK_DIR}/prefix")
  foreach(f include/elastic/elastic.hpp include/elastic/config.hpp
            share/cmake/elastic/elasticConfig.cmake share/cmake/elastic/elasticConfigVersion.cmake
            share/cmake/elastic/elasticTargets.cmake share/cmake/elastic/elasticToolsTargets.cmake
            share/cmake/elastic/FindNCCL.cmake bin/elastic-watchdog)
    if(NOT EXISTS "${WORK_DIR}/prefix/${f}")
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()
  string(REPLACE "," ";" _features "${FEATURES}")
  foreach(f IN LISTS _features)
    string(SUBSTRING "${f}" 0 1 _head)
    string(SUBSTRING "${f}" 1 -1 _tail)
    string(TOUPPER "${_head}" _head)
    if(NOT EXISTS "${WORK_DIR}/prefix/share/cmake/elastic/elastic${_head}${_tail}Targets.cmake")
      message(FATAL_ERROR "install is missing elastic${_head}${_tail}Targets.cmake for elastic::${f}")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUME=find_package "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
elseif(MODE STREQUAL "fetchcontent")
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUME=fetchcontent "-DELASTIC_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "MODE must be find_package or fetchcontent, not '${MODE}'")
endif()

run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" --config ${config})
# Single-config generators put the program in the build directory, multi-config ones below it.
set(program "${WORK_DIR}/consumer/consumer")
if(NOT EXISTS "${program}")
  set(program "${WORK_DIR}/consumer/${config}/consumer")
endif()
run("${program}")
if(NOT last_output MATCHES "^elastic ([0-9]+\\.[0-9]+\\.[0-9]+)")
  message(FATAL_ERROR "the consumer printed '${last_output}'")
endif()
if(VERSION AND NOT CMAKE_MATCH_1 STREQUAL VERSION)
  message(FATAL_ERROR "the consumer reports elastic ${CMAKE_MATCH_1}; the project is ${VERSION}")
endif()
string(STRIP "${last_output}" last_output)
message(STATUS "consumer (${MODE}): ${last_output}")

# The program built with every feature target the consumer got: each the outer build has is on.
set(program "${WORK_DIR}/consumer/consumer_features")
if(NOT EXISTS "${program}")
  set(program "${WORK_DIR}/consumer/${config}/consumer_features")
endif()
run("${program}")
string(REPLACE "," ";" _features "${FEATURES}")
foreach(f IN LISTS _features)
  if(NOT last_output MATCHES "${f}=1")
    message(FATAL_ERROR "the consumer did not get elastic::${f} (${MODE}): it printed '${last_output}'")
  endif()
endforeach()
string(STRIP "${last_output}" last_output)
message(STATUS "consumer_features (${MODE}): ${last_output}")
