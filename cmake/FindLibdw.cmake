# FindLibdw
# ---------
# elfutils' libdw and libelf (Debian/Ubuntu: libdw-dev), which the watchdog's stack dumps use to
# unwind and name the frames of a hung process (elastic::libdw). elfutils ships no CMake package.
#
#   find_package(Libdw 0.158 REQUIRED)
#   target_link_libraries(watchdog PRIVATE Libdw::libdw)
#
# Inputs: Libdw_ROOT (CMake or environment variable), then the system paths.
# Outputs:
#   Libdw_FOUND        true when elfutils/libdwfl.h, libdw and libelf were found and the version suits
#   Libdw_VERSION      0.MINOR, read from elfutils/version.h (_ELFUTILS_VERSION 188 is 0.188)
#   Libdw::libdw       imported target: libdw, its headers, and libelf
# Cache: Libdw_INCLUDE_DIR, Libdw_LIBRARY, Libdw_ELF_LIBRARY (advanced).

find_path(Libdw_INCLUDE_DIR elfutils/libdwfl.h HINTS ${Libdw_ROOT} $ENV{Libdw_ROOT} PATH_SUFFIXES include)
find_library(Libdw_LIBRARY NAMES dw HINTS ${Libdw_ROOT} $ENV{Libdw_ROOT} PATH_SUFFIXES lib lib64)
find_library(Libdw_ELF_LIBRARY NAMES elf HINTS ${Libdw_ROOT} $ENV{Libdw_ROOT} PATH_SUFFIXES lib lib64)

unset(Libdw_VERSION)
if(Libdw_INCLUDE_DIR AND EXISTS "${Libdw_INCLUDE_DIR}/elfutils/version.h")
  file(STRINGS "${Libdw_INCLUDE_DIR}/elfutils/version.h" _libdw_version_line
       REGEX "^#define _ELFUTILS_VERSION[ \t]+[0-9]+")
  if(_libdw_version_line MATCHES "_ELFUTILS_VERSION[ \t]+([0-9]+)")
    math(EXPR _libdw_major "${CMAKE_MATCH_1} / 1000")
    math(EXPR _libdw_minor "${CMAKE_MATCH_1} % 1000")
    set(Libdw_VERSION "${_libdw_major}.${_libdw_minor}")
  endif()
  unset(_libdw_version_line)
  unset(_libdw_major)
  unset(_libdw_minor)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Libdw REQUIRED_VARS Libdw_LIBRARY Libdw_ELF_LIBRARY Libdw_INCLUDE_DIR
                                  VERSION_VAR Libdw_VERSION)
mark_as_advanced(Libdw_INCLUDE_DIR Libdw_LIBRARY Libdw_ELF_LIBRARY)

if(Libdw_FOUND AND NOT TARGET Libdw::libdw)
  add_library(Libdw::libdw UNKNOWN IMPORTED)
  set_target_properties(Libdw::libdw PROPERTIES
    IMPORTED_LOCATION "${Libdw_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Libdw_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${Libdw_ELF_LIBRARY}")
endif()
