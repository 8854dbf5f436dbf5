# cmake -DMODE=find_package|fetchcontent|strict|snippets -DSOURCE_DIR=<checkout> -DWORK_DIR=<scratch>
#       -DGENERATOR=<generator> -DCXX=<compiler> [-DMAKE_PROGRAM=<ninja/make>] [-DVERSION=x.y.z]
#       [-DFEATURES=cuda,nccl,gloo,etcd] [-DPREFIX=<install prefix>] [-DOPT=<-O2|-O3>]
#       -P run_consumer.cmake
# Builds the consumer project against elastic the way a user would, and runs it.
#   find_package: configure the checkout (tools on; tests, examples, benchmarks off), build,
#                 install to WORK_DIR/prefix, then build the consumer with CMAKE_PREFIX_PATH there;
#                 also build it with `pkg-config --cflags --libs elastic` alone, and check that a
#                 required component whose dependency is missing fails naming the package to
#                 install.
#   fetchcontent: build the consumer, which pulls the checkout in with FetchContent.
#   strict:       against the install at PREFIX (made by find_package), build consumer_strict
#                 (every public header, all features here) at Release with OPT and
#                 -Wall -Wextra -Werror -pedantic, and run it.
#   snippets:     against the install at PREFIX, compile every ```cpp snippet of the README.
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

# What the consumer project is told (not elastic's own build, nor the probe).
set(consumer_args "-DELASTIC_FEATURES=${FEATURES}")
# What the install and the plain consumers prove (what is installed, what find_package and
# FetchContent give, that it links and runs) does not depend on the optimizer, which took most
# of their time (elastic-run alone 95 s of CPU at -O3): they build at -O0. The strict consumers
# below keep their -O2/-O3, whose warnings exist only once code is inlined.
set(unoptimized "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG")

if(MODE STREQUAL "strict" OR MODE STREQUAL "snippets")
  if(NOT EXISTS "${PREFIX}/share/cmake/elastic/elasticConfig.cmake")
    message(FATAL_ERROR "MODE=${MODE} needs -DPREFIX at an elastic install (packaging.find_package makes it)")
  endif()
  if(MODE STREQUAL "strict")
    if(NOT OPT)
      set(OPT -O3)
    endif()
    run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common} ${consumer_args}
        -DELASTIC_CONSUMER_BUILD=strict "-DCMAKE_CXX_FLAGS_RELEASE=${OPT} -DNDEBUG" "-DCMAKE_PREFIX_PATH=${PREFIX}")
    run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" --config ${config} --target consumer_strict --verbose)
    if(NOT last_output MATCHES "[ \t]${OPT}[ \t]" OR NOT last_output MATCHES "-pedantic")
      message(FATAL_ERROR "consumer_strict was not compiled with ${OPT} and -pedantic:\n${last_output}")
    endif()
    set(program "${WORK_DIR}/consumer/consumer_strict")
    if(NOT EXISTS "${program}")
      set(program "${WORK_DIR}/consumer/${config}/consumer_strict")
    endif()
    run("${program}")
    string(STRIP "${last_output}" last_output)
    message(STATUS "consumer_strict (${CXX} ${OPT}): ${last_output}")
  else()
    # Compiled only (the snippets call the trainer's functions, which are declared, not defined),
    # without optimisation: whether they compile does not depend on it, and it is quicker.
    run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common} ${consumer_args}
        -DELASTIC_CONSUMER_BUILD=snippets -DCMAKE_BUILD_TYPE= "-DELASTIC_README=${SOURCE_DIR}/README.md"
        "-DCMAKE_PREFIX_PATH=${PREFIX}")
    string(REGEX MATCHALL "README snippet [^\n]*" _snippets "${last_output}")
    run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer" --target readme_snippets)
    foreach(_s IN LISTS _snippets)
      message(STATUS "${_s}")
    endforeach()
  endif()
  return()
endif()

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/elastic" ${common} "${unoptimized}"
      -DELASTIC_BUILD_TESTS=OFF -DELASTIC_BUILD_EXAMPLES=OFF -DELASTIC_BUILD_BENCHMARKS=OFF
      -DELASTIC_BUILD_TOOLS=ON -DELASTIC_INSTALL=ON)
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/elastic" --config ${config})
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/elastic" --config ${config} --prefix "${WORK_DIR}/prefix")
  foreach(f include/elastic/elastic.hpp include/elastic/config.hpp
            share/cmake/elastic/elasticConfig.cmake share/cmake/elastic/elasticConfigVersion.cmake
            share/cmake/elastic/elasticTargets.cmake share/cmake/elastic/elasticToolsTargets.cmake
            share/cmake/elastic/FindNCCL.cmake share/pkgconfig/elastic.pc bin/elastic-watchdog)
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
  # A required component whose dependency the consumer lacks fails, saying what to install
  # (libcurl hidden from the probe: elastic::etcd cannot be had, whether or not it was built).
  file(WRITE "${WORK_DIR}/probe/CMakeLists.txt"
       "cmake_minimum_required(VERSION 3.21)\nproject(probe CXX)\n"
       "find_package(elastic CONFIG REQUIRED COMPONENTS etcd)\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${WORK_DIR}/probe" -B "${WORK_DIR}/probe/build" ${common}
                          -DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "etcd: [^\n]*libcurl4-openssl-dev")
    message(FATAL_ERROR "find_package(elastic COMPONENTS etcd) without libcurl: exit ${rc}, expected a "
                        "failure naming libcurl4-openssl-dev; it said:\n${out}\n${err}")
  endif()
  string(REGEX MATCH "etcd: [^\n]*" _said "${err}")
  message(STATUS "without libcurl, COMPONENTS etcd fails saying: ${_said}")

  # pkg-config alone, no CMake: the install's elastic.pc gives what main.cpp needs.
  find_program(PKG_CONFIG NAMES pkg-config pkgconf)
  if(NOT PKG_CONFIG)
    message(FATAL_ERROR "pkg-config is not installed (Debian: apt-get install pkgconf)")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${WORK_DIR}/prefix/share/pkgconfig")
  run(${PKG_CONFIG} --cflags --libs elastic)
  string(STRIP "${last_output}" _pc_flags)
  if(NOT _pc_flags MATCHES "-std=c\\+\\+20" OR NOT _pc_flags MATCHES "-pthread")
    message(FATAL_ERROR "pkg-config --cflags --libs elastic said '${_pc_flags}': no -std=c++20 or -pthread")
  endif()
  separate_arguments(_pc_flags UNIX_COMMAND "${_pc_flags}")
  run(${PKG_CONFIG} --modversion elastic)
  string(STRIP "${last_output}" _pc_version)
  if(VERSION AND NOT _pc_version STREQUAL VERSION)
    message(FATAL_ERROR "pkg-config --modversion elastic says ${_pc_version}; the project is ${VERSION}")
  endif()
  file(MAKE_DIRECTORY "${WORK_DIR}/pkgconfig")
  run("${CXX}" "${consumer}/main.cpp" -o "${WORK_DIR}/pkgconfig/consumer" -O2 -Wall -Wextra -Werror -pedantic
      ${_pc_flags})
  run("${WORK_DIR}/pkgconfig/consumer")
  if(NOT last_output MATCHES "^elastic ")
    message(FATAL_ERROR "the pkg-config consumer printed '${last_output}'")
  endif()
  message(STATUS "pkg-config consumer: ${_pc_flags}")

  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common} "${unoptimized}" ${consumer_args}
      -DELASTIC_CONSUME=find_package "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
elseif(MODE STREQUAL "fetchcontent")
  # Asked for, the tools come under the names an install exports (configured, not built).
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer_tools" ${common} ${consumer_args}
      -DELASTIC_CONSUME=fetchcontent "-DELASTIC_SOURCE_DIR=${SOURCE_DIR}" -DELASTIC_WANT_TOOLS=ON)
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common} "${unoptimized}" ${consumer_args}
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
