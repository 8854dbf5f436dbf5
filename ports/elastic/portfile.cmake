# vcpkg port of elastic: a header-only library, plus the elastic-run, elastic-report and elastic-watchdog tools
# with the "tools" feature.
#
# Where the source comes from:
# - From a local clone (usable today): scripts/vcpkg-overlay.sh writes an overlay copy of this
#   port with source-from-clone.cmake beside this file, which pins one commit of the clone:
#     scripts/vcpkg-overlay.sh /tmp/elastic-overlay
#     vcpkg install "elastic[tools]" --overlay-ports=/tmp/elastic-overlay
#   The commit is written into the port's files, so vcpkg's ABI hash (which covers the port
#   files, not the environment) changes with it.
# - Published (a registry, or this directory as an overlay): the release tag from GitHub. Two
#   values are filled in at publication (README, "vcpkg"): REPO, the GitHub repository, which the
#   manifest's "homepage" names too; and SHA512, the hash of the tag's archive: leave it 0, run
#   `vcpkg install elastic --overlay-ports=ports` once, and copy the "Actual hash" vcpkg prints.
if(EXISTS "${CMAKE_CURRENT_LIST_DIR}/source-from-clone.cmake")
    include("${CMAKE_CURRENT_LIST_DIR}/source-from-clone.cmake")  # ELASTIC_GIT_URL, ELASTIC_GIT_REF
    vcpkg_from_git(
        OUT_SOURCE_PATH SOURCE_PATH
        URL "${ELASTIC_GIT_URL}"
        REF "${ELASTIC_GIT_REF}"
    )
else()
    vcpkg_from_github(
        OUT_SOURCE_PATH SOURCE_PATH
        REPO elastic-training/elastic   # TO FILL IN at publication: the GitHub repository
        REF "v${VERSION}"
        SHA512 0                        # TO FILL IN at publication: the SHA512 vcpkg prints
        HEAD_REF main
    )
endif()

# Headers and tools only: one release build (the tools are programs, there is no library).
set(VCPKG_BUILD_TYPE release)

# Each feature locks its dependency's find_package in elastic's CMakeLists: on, the package is
# required (configure fails without it); off, it is not looked for, even where the system has it.
# NCCL is looked for only with elastic::cuda, hence maybe unused.
vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        cuda  VCPKG_LOCK_FIND_PACKAGE_CUDAToolkit
        etcd  VCPKG_LOCK_FIND_PACKAGE_CURL
        gloo  VCPKG_LOCK_FIND_PACKAGE_Gloo
        nccl  VCPKG_LOCK_FIND_PACKAGE_NCCL
        tools ELASTIC_BUILD_TOOLS
)
if("cuda" IN_LIST FEATURES)
    # vcpkg_find_cuda comes with the cuda port (a dependency of this feature): the toolkit it
    # checked is the one elastic's build uses, and elastic's FindNCCL looks there for NCCL too.
    vcpkg_find_cuda(OUT_CUDA_TOOLKIT_ROOT cuda_toolkit_root)
    list(APPEND FEATURE_OPTIONS "-DCUDAToolkit_ROOT=${cuda_toolkit_root}")
endif()

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DELASTIC_BUILD_TESTS=OFF
        -DELASTIC_BUILD_EXAMPLES=OFF
        -DELASTIC_BUILD_BENCHMARKS=OFF
        -DELASTIC_INSTALL=ON
        # The LibTorch adapters (elastic::torch) are not a feature of this port yet: never built
        # from a libtorch the system happens to have.
        -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
        ${FEATURE_OPTIONS}
    MAYBE_UNUSED_VARIABLES
        VCPKG_LOCK_FIND_PACKAGE_NCCL
)
vcpkg_cmake_install()

# elastic installs its package config in share/cmake/elastic (CMakeLists.txt: ELASTIC_CMAKE_DIR).
# The fixup moves it to share/elastic and points the imported tool targets
# (elasticToolsTargets-release.cmake: ${_IMPORT_PREFIX}/bin/...) at tools/elastic.
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/elastic)

# elastic.pc names -pthread (Libs:), and vcpkg keeps .pc files with Libs in lib/pkgconfig only.
file(MAKE_DIRECTORY "${CURRENT_PACKAGES_DIR}/lib")
file(RENAME "${CURRENT_PACKAGES_DIR}/share/pkgconfig" "${CURRENT_PACKAGES_DIR}/lib/pkgconfig")
vcpkg_fixup_pkgconfig()

if("tools" IN_LIST FEATURES)
    vcpkg_copy_tools(TOOL_NAMES elastic-run elastic-report elastic-watchdog AUTO_CLEAN)
endif()

file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
