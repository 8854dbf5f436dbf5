# FindGloo
# --------
# Gloo (CPU collectives). One find_package(Gloo) call covers every way Gloo comes, so that
# CMAKE_DISABLE_FIND_PACKAGE_Gloo, CMAKE_REQUIRE_FIND_PACKAGE_Gloo and vcpkg's
# VCPKG_LOCK_FIND_PACKAGE_Gloo (which sets one of them for the duration of the call) switch all
# of them at once: a fallback search outside the call would find a system Gloo that the lock
# turned off.
#
#   find_package(Gloo QUIET)
#   target_link_libraries(trainer PRIVATE ${Gloo_LIBRARIES})
#
# Searched in this order:
#   1. Gloo's own package, GlooConfig.cmake (Debian's libgloo-dev, vcpkg's gloo port), whose
#      imported target is plain `gloo`;
#   2. the header gloo/rendezvous/context.h and the library libgloo (a build without the package).
#
# Outputs:
#   Gloo_FOUND          true when either was found
#   Gloo_FROM_PACKAGE   true when Gloo's package was used (its consumers must find it again)
#   Gloo_LIBRARIES      the target `gloo`, or the library file
#   Gloo_INCLUDE_DIRS   the directory holding gloo/ (empty with the package: the target has it)
# Cache: Gloo_INCLUDE_DIR, Gloo_LIBRARY (advanced; set them to force a particular Gloo).

include(FindPackageHandleStandardArgs)

# The package is one way among two: when the caller requires Gloo, its absence alone is no error.
# (A required find_package makes every nested find_package of the same name required.)
if(DEFINED CMAKE_REQUIRE_FIND_PACKAGE_Gloo)
  set(_gloo_saved_require "${CMAKE_REQUIRE_FIND_PACKAGE_Gloo}")
endif()
set(CMAKE_REQUIRE_FIND_PACKAGE_Gloo FALSE)
find_package(Gloo CONFIG QUIET)
if(DEFINED _gloo_saved_require)
  set(CMAKE_REQUIRE_FIND_PACKAGE_Gloo "${_gloo_saved_require}")
  unset(_gloo_saved_require)
else()
  unset(CMAKE_REQUIRE_FIND_PACKAGE_Gloo)
endif()

if(TARGET gloo)
  set(Gloo_FROM_PACKAGE TRUE)
  set(Gloo_LIBRARIES gloo)
  set(Gloo_INCLUDE_DIRS "")
  find_package_handle_standard_args(Gloo CONFIG_MODE)
else()
  set(Gloo_FROM_PACKAGE FALSE)
  find_path(Gloo_INCLUDE_DIR gloo/rendezvous/context.h)
  find_library(Gloo_LIBRARY gloo)
  find_package_handle_standard_args(Gloo REQUIRED_VARS Gloo_LIBRARY Gloo_INCLUDE_DIR)
  if(Gloo_FOUND)
    set(Gloo_LIBRARIES "${Gloo_LIBRARY}")
    set(Gloo_INCLUDE_DIRS "${Gloo_INCLUDE_DIR}")
  endif()
  mark_as_advanced(Gloo_INCLUDE_DIR Gloo_LIBRARY)
endif()
