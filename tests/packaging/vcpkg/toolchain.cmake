# A MODEL of vcpkg's toolchain file, not vcpkg: the part of scripts/buildsystems/vcpkg.cmake
# (microsoft/vcpkg) that a port's CMake build and a consumer see when they look for packages.
# Written for tests/test_port.py from how that file behaves; it is not a copy of it.
#
# Modelled:
# - the installed tree (_VCPKG_INSTALLED_DIR/VCPKG_TARGET_TRIPLET) is searched first
#   (CMAKE_PREFIX_PATH);
# - find_package() is overridden by a macro. On the top-level call only (not on the calls a Find
#   module or package config makes inside it), VCPKG_LOCK_FIND_PACKAGE_<Pkg> set to true sets
#   CMAKE_REQUIRE_FIND_PACKAGE_<Pkg> (unless the call says REQUIRED itself), set to false sets
#   CMAKE_DISABLE_FIND_PACKAGE_<Pkg>; either lasts for that call and is restored after it;
# - a port's share/<pkg lowercase>/vcpkg-cmake-wrapper.cmake, where the installed tree has one and
#   the package is not disabled, is included instead of the search, with ARGS holding the call's
#   arguments (vcpkg's nccl port installs such a wrapper).
# Not modelled: chainloaded toolchains, the Boost/ICU/GSL/CURL special cases, applocal deployment,
# manifest-mode installs, target triplets other than the host's.
cmake_minimum_required(VERSION 3.21)
include_guard(GLOBAL)  # CMake reads a toolchain file more than once; find_package is wrapped once

if(NOT DEFINED _VCPKG_INSTALLED_DIR OR NOT DEFINED VCPKG_TARGET_TRIPLET)
  message(FATAL_ERROR "the vcpkg toolchain model needs -D_VCPKG_INSTALLED_DIR=... and -DVCPKG_TARGET_TRIPLET=...")
endif()
# vcpkg's toolchain reads the options vcpkg_cmake_configure always passes, so none is reported
# as unused.
set(z_model_unused "${CMAKE_ERROR_ON_ABSOLUTE_INSTALL_DESTINATION}${CMAKE_EXPORT_NO_PACKAGE_REGISTRY}")
set(z_model_unused "${CMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY}${CMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY}")
set(z_model_unused "${CMAKE_INSTALL_SYSTEM_RUNTIME_LIBS_SKIP}")
list(PREPEND CMAKE_PREFIX_PATH "${_VCPKG_INSTALLED_DIR}/${VCPKG_TARGET_TRIPLET}")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES _VCPKG_INSTALLED_DIR VCPKG_TARGET_TRIPLET)

set(z_model_find_depth 0)
macro(find_package z_model_find_name)
  math(EXPR z_model_find_depth "${z_model_find_depth} + 1")
  set(z_model_find_${z_model_find_depth}_args "${ARGN}")
  set(z_model_find_${z_model_find_depth}_saved "")
  if(z_model_find_depth EQUAL 1 AND DEFINED VCPKG_LOCK_FIND_PACKAGE_${z_model_find_name})
    if(VCPKG_LOCK_FIND_PACKAGE_${z_model_find_name})
      if(NOT "REQUIRED" IN_LIST z_model_find_${z_model_find_depth}_args)
        set(z_model_find_${z_model_find_depth}_saved CMAKE_REQUIRE_FIND_PACKAGE_${z_model_find_name})
      endif()
    else()
      set(z_model_find_${z_model_find_depth}_saved CMAKE_DISABLE_FIND_PACKAGE_${z_model_find_name})
    endif()
    if(z_model_find_${z_model_find_depth}_saved)
      if(DEFINED ${z_model_find_${z_model_find_depth}_saved})
        set(z_model_find_${z_model_find_depth}_old "${${z_model_find_${z_model_find_depth}_saved}}")
      else()
        unset(z_model_find_${z_model_find_depth}_old)
      endif()
      set(${z_model_find_${z_model_find_depth}_saved} 1)
    endif()
  endif()

  string(TOLOWER "${z_model_find_name}" z_model_find_lower)
  set(z_model_find_wrapper "${_VCPKG_INSTALLED_DIR}/${VCPKG_TARGET_TRIPLET}/share/${z_model_find_lower}/vcpkg-cmake-wrapper.cmake")
  if(NOT CMAKE_DISABLE_FIND_PACKAGE_${z_model_find_name} AND EXISTS "${z_model_find_wrapper}")
    if(DEFINED ARGS)
      set(z_model_find_${z_model_find_depth}_ARGS "${ARGS}")
    else()
      unset(z_model_find_${z_model_find_depth}_ARGS)
    endif()
    set(ARGS "${z_model_find_name};${z_model_find_${z_model_find_depth}_args}")
    include("${z_model_find_wrapper}")
    if(DEFINED z_model_find_${z_model_find_depth}_ARGS)
      set(ARGS "${z_model_find_${z_model_find_depth}_ARGS}")
    else()
      unset(ARGS)
    endif()
  else()
    _find_package(${z_model_find_name} ${z_model_find_${z_model_find_depth}_args})
  endif()

  if(z_model_find_${z_model_find_depth}_saved)
    if(DEFINED z_model_find_${z_model_find_depth}_old)
      set(${z_model_find_${z_model_find_depth}_saved} "${z_model_find_${z_model_find_depth}_old}")
    else()
      unset(${z_model_find_${z_model_find_depth}_saved})
    endif()
  endif()
  math(EXPR z_model_find_depth "${z_model_find_depth} - 1")
endmacro()
