# cmake -DPORT_DIR=<port> -DFEATURES_ON=<a;b> -DWORK=<scratch> [-DTRIPLET_OPTIONS=<-D...;...>]
#       -P run_port.cmake
# Runs <port>/portfile.cmake in CMake script mode as vcpkg's scripts/ports.cmake does for
# `vcpkg install elastic[FEATURES_ON]` on x64-linux, with the MODEL of vcpkg's helpers
# (helpers.cmake) and toolchain (toolchain.cmake) beside this file; not vcpkg. The package lands
# in WORK/packages/<port>_x64-linux, the build in WORK/buildtrees/<port>, the helper calls in
# WORK/calls.txt. The installed tree is WORK/installed/x64-linux: what the dependency ports would
# have installed there is whatever the caller put there before (here: the nccl port's files).
cmake_minimum_required(VERSION 3.21)  # scripts/ports.cmake's

foreach(v PORT_DIR WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_port.cmake needs -D${v}=...")
  endif()
endforeach()

# What ports.cmake and vcpkg-tool set for the portfile.
file(READ "${PORT_DIR}/vcpkg.json" manifest)
string(JSON PORT GET "${manifest}" name)
string(JSON VERSION GET "${manifest}" version)
set(FEATURES core ${FEATURES_ON})
set(CURRENT_PORT_DIR "${PORT_DIR}")
set(TARGET_TRIPLET x64-linux)
set(_VCPKG_INSTALLED_DIR "${WORK}/installed")
set(CURRENT_INSTALLED_DIR "${_VCPKG_INSTALLED_DIR}/${TARGET_TRIPLET}")
set(CURRENT_BUILDTREES_DIR "${WORK}/buildtrees/${PORT}")
set(CURRENT_PACKAGES_DIR "${WORK}/packages/${PORT}_${TARGET_TRIPLET}")
set(DOWNLOADS "${WORK}/downloads")
# The x64-linux triplet (triplets/x64-linux.cmake) and vcpkg_common_definitions.cmake.
set(VCPKG_TARGET_ARCHITECTURE x64)
set(VCPKG_CRT_LINKAGE dynamic)
set(VCPKG_LIBRARY_LINKAGE static)
set(VCPKG_CMAKE_SYSTEM_NAME Linux)
set(VCPKG_TARGET_IS_LINUX ON)
set(VCPKG_HOST_IS_LINUX ON)
set(VCPKG_TARGET_EXECUTABLE_SUFFIX "")
set(VCPKG_CMAKE_CONFIGURE_OPTIONS ${TRIPLET_OPTIONS})
cmake_host_system_information(RESULT VCPKG_CONCURRENCY QUERY NUMBER_OF_LOGICAL_CORES)

set(Z_MODEL_TOOLCHAIN "${CMAKE_CURRENT_LIST_DIR}/toolchain.cmake")
set(Z_MODEL_CALLS "${WORK}/calls.txt")
file(REMOVE "${Z_MODEL_CALLS}")
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}")
file(MAKE_DIRECTORY "${CURRENT_PACKAGES_DIR}" "${CURRENT_BUILDTREES_DIR}" "${DOWNLOADS}" "${CURRENT_INSTALLED_DIR}")
include("${CMAKE_CURRENT_LIST_DIR}/helpers.cmake")

include("${CURRENT_PORT_DIR}/portfile.cmake")
