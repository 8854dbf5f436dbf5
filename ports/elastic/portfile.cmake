# vcpkg port of elastic: a header-only library, plus the elastic-run and elastic-watchdog tools
# with the "tools" feature.
#
# Sources: by default the release tarball from GitHub. REF and SHA512 below are placeholders
# TO BE FILLED AT RELEASE: tag the release, run `vcpkg install elastic --overlay-ports=ports`
# once, and copy the SHA512 that vcpkg prints into this file.
# To build from a local checkout instead (CI, development), point ELASTIC_SOURCE_DIR at it; on
# hosts where vcpkg cleans the environment, add it to the triplet's VCPKG_ENV_PASSTHROUGH:
#   ELASTIC_SOURCE_DIR=$PWD vcpkg install elastic[tools] --overlay-ports=$PWD/ports
if(DEFINED ENV{ELASTIC_SOURCE_DIR})
    set(SOURCE_PATH "$ENV{ELASTIC_SOURCE_DIR}")
    if(NOT EXISTS "${SOURCE_PATH}/include/elastic/config.hpp")
        message(FATAL_ERROR "ELASTIC_SOURCE_DIR='${SOURCE_PATH}' is not an elastic checkout (no include/elastic/config.hpp)")
    endif()
else()
    vcpkg_from_github(
        OUT_SOURCE_PATH SOURCE_PATH
        REPO elastic-training/elastic       # placeholder: the project's GitHub repository
        REF "v${VERSION}"                   # placeholder: the release tag
        SHA512 0                            # placeholder: TO BE FILLED AT RELEASE
        HEAD_REF main
    )
endif()

# Headers and tools only: one release build (the tools are programs, there is no library).
set(VCPKG_BUILD_TYPE release)

# elastic's CMakeLists finds each optional dependency QUIETly and enables the matching target
# when it is there. A feature that is off must not pick up a copy that happens to be on the
# system; one that is on is checked after the install (below). CMAKE_REQUIRE_FIND_PACKAGE_CURL
# is not used for that: FindCURL first tries find_package(CURL CONFIG), which the flag turns
# into a hard error wherever curl has no CURLConfig.cmake (CMake 3.25, Debian's libcurl).
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        tools ELASTIC_BUILD_TOOLS
    INVERTED_FEATURES
        cuda  CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit
        etcd  CMAKE_DISABLE_FIND_PACKAGE_CURL
        nccl  CMAKE_DISABLE_FIND_PACKAGE_NCCL
        gloo  CMAKE_DISABLE_FIND_PACKAGE_Gloo
)
# Gloo: elastic looks for GlooConfig.cmake, then for the header and library directly (which finds
# vcpkg's copy). Without the feature the direct search is skipped too: a cache variable set to a
# value that is false but not *-NOTFOUND stops find_path/find_library from searching.
if(NOT "gloo" IN_LIST FEATURES)
    list(APPEND FEATURE_OPTIONS -DELASTIC_GLOO_INCLUDE_DIR=OFF -DELASTIC_GLOO_LIBRARY=OFF)
endif()

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DELASTIC_BUILD_TESTS=OFF
        -DELASTIC_BUILD_EXAMPLES=OFF
        -DELASTIC_BUILD_BENCHMARKS=OFF
        -DELASTIC_INSTALL=ON
        ${FEATURE_OPTIONS}
    MAYBE_UNUSED_VARIABLES
        # find_package(NCCL) runs only when the CUDA toolkit was found, Gloo's lookup only once.
        CMAKE_DISABLE_FIND_PACKAGE_NCCL
        CMAKE_DISABLE_FIND_PACKAGE_Gloo
        ELASTIC_GLOO_INCLUDE_DIR
        ELASTIC_GLOO_LIBRARY
)
vcpkg_cmake_install()

# A feature that was asked for must have produced its target.
foreach(_feature_file IN ITEMS "cuda|elasticCudaTargets.cmake|the CUDA toolkit"
                               "etcd|elasticEtcdTargets.cmake|libcurl"
                               "gloo|elasticGlooTargets.cmake|Gloo"
                               "nccl|elasticNcclTargets.cmake|NCCL >= 2.18")
    string(REPLACE "|" ";" _feature_file "${_feature_file}")
    list(GET _feature_file 0 _feature)
    list(GET _feature_file 1 _file)
    list(GET _feature_file 2 _what)
    if(_feature IN_LIST FEATURES AND NOT EXISTS "${CURRENT_PACKAGES_DIR}/share/cmake/elastic/${_file}")
        message(FATAL_ERROR "elastic[${_feature}] was requested but elastic::${_feature} was not built: "
                            "elastic's CMakeLists did not find ${_what}; see the configure log")
    endif()
endforeach()

# elastic installs its package config in share/cmake/elastic (CMakeLists.txt: ELASTIC_CMAKE_DIR).
# The fixup moves it to share/elastic and points the imported tool targets
# (elasticToolsTargets-release.cmake: ${_IMPORT_PREFIX}/bin/...) at tools/elastic.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/elastic)
# elastic.pc (share/pkgconfig) finds its prefix from its own place; the fixup checks it.
vcpkg_fixup_pkgconfig()

if("tools" IN_LIST FEATURES)
    set(_elastic_tools elastic-watchdog)
    # elastic-run is being added to tools/; copy it whenever this version builds it.
    if(EXISTS "${CURRENT_PACKAGES_DIR}/bin/elastic-run")
        list(APPEND _elastic_tools elastic-run)
    endif()
    vcpkg_copy_tools(TOOL_NAMES ${_elastic_tools} AUTO_CLEAN)
endif()

# Header-only: nothing for a debug tree (none is built; this keeps it so if that changes).
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug/include" "${CURRENT_PACKAGES_DIR}/debug/share")

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
