# FindNCCL
# --------
# NVIDIA's collective library ships no CMake package; this module finds it.
#
#   find_package(NCCL 2.18 REQUIRED)
#   target_link_libraries(trainer PRIVATE NCCL::nccl)
#
# Inputs (searched in this order, then the system paths):
#   NCCL_ROOT (CMake or environment variable), CUDAToolkit_ROOT (CMake or environment),
#   CUDA_HOME (environment), /usr/local/cuda; also the environment variables that vcpkg's nccl
#   port reads when it checks for the system NCCL (NCCL_INCLUDE_DIR, NCCL_LIB_DIR, NCCL_ROOT_DIR,
#   CUDA_PATH), so that elastic[nccl] finds the NCCL that port accepted.
#
# Outputs:
#   NCCL_FOUND          true when nccl.h and libnccl were found and the version suits
#   NCCL_VERSION        MAJOR.MINOR.PATCH, read from nccl.h (also NCCL_VERSION_MAJOR/_MINOR/_PATCH)
#   NCCL_INCLUDE_DIRS   the directory holding nccl.h
#   NCCL_LIBRARIES      the library to link
#   NCCL::nccl          imported target with both; it also links CUDA::cudart where the CUDA
#                       toolkit is found, because nccl.h includes <cuda_runtime.h>
# Cache: NCCL_INCLUDE_DIR, NCCL_LIBRARY (advanced; set them to force a particular NCCL).

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_ROOT} $ENV{CUDAToolkit_ROOT}
                $ENV{CUDA_HOME} $ENV{NCCL_ROOT_DIR} $ENV{CUDA_PATH} /usr/local/cuda)

# vcpkg's nccl port ships a FindNCCL of its own that leaves NCCL_INCLUDE_DIR an empty cache entry
# (from the environment variable); an empty value would stop find_path from searching.
foreach(_nccl_var NCCL_INCLUDE_DIR NCCL_LIBRARY)
  if(DEFINED ${_nccl_var} AND "${${_nccl_var}}" STREQUAL "")
    unset(${_nccl_var} CACHE)
    unset(${_nccl_var})
  endif()
endforeach()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_INCLUDE_DIR} ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS $ENV{NCCL_LIB_DIR} ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_nccl_part MAJOR MINOR PATCH)
    if(_nccl_version_lines MATCHES "#define NCCL_${_nccl_part}[ \t]+([0-9]+)")
      set(NCCL_VERSION_${_nccl_part} "${CMAKE_MATCH_1}")
    else()
      set(NCCL_VERSION_${_nccl_part} "")
    endif()
  endforeach()
  if(NOT NCCL_VERSION_MAJOR STREQUAL "" AND NOT NCCL_VERSION_MINOR STREQUAL "" AND NOT NCCL_VERSION_PATCH STREQUAL "")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  elseif(NCCL_FIND_VERSION)
    # A header that does not state its version cannot satisfy a version requirement.
    set(NCCL_VERSION "unknown")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    if(NOT TARGET CUDA::cudart)
      find_package(CUDAToolkit QUIET)
    endif()
    if(TARGET CUDA::cudart)
      set_property(TARGET NCCL::nccl APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
    endif()
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_version_lines)
unset(_nccl_part)
unset(_nccl_var)
