# cmake -DMODE=find_package|fetchcontent -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX=... -P run_consumer.cmake
# Builds the consumer project against elastic the way a user would, and runs it.
cmake_minimum_required(VERSION 3.21)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer "${SOURCE_DIR}/tests/packaging/consumer")
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release)

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/elastic" ${common}
      -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_EXAMPLES=OFF -DELASTIC_BUILD_BENCHMARKS=OFF -DELASTIC_BUILD_TOOLS=ON
      -DELASTIC_INSTALL=ON)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/elastic")
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/elastic" --prefix "${WORK_DIR}/prefix")
  foreach(f include/elastic/elastic.hpp share/cmake/elastic/elasticConfig.cmake
            share/cmake/elastic/elasticConfigVersion.cmake share/cmake/elastic/FindNCCL.cmake bin/elastic-watchdog)
    if(NOT EXISTS "${WORK_DIR}/prefix/${f}")
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUME=find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "fetchcontent")
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUME=fetchcontent -DELASTIC_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "MODE must be find_package or fetchcontent")
endif()

run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer")
run("${WORK_DIR}/consumer/consumer")
if(NOT last_output MATCHES "^elastic [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "the consumer printed '${last_output}'")
endif()
message(STATUS "consumer (${MODE}): ${last_output}")
