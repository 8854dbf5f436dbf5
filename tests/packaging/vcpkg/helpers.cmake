# A MODEL of the vcpkg helper functions that ports/elastic/portfile.cmake calls, not vcpkg: each
# function does what the vcpkg function of the same name does for this port's calls on a Linux
# host, written for tests/test_port.py from the vcpkg sources named above it (microsoft/vcpkg,
# scripts/cmake/ and ports/vcpkg-cmake*/, ports/cuda/); none is a copy. Arguments these functions
# do not model are refused, so a portfile that starts using them fails here instead of passing
# untested. The portfile runs in CMake script mode, as vcpkg runs it (scripts/ports.cmake).
#
# Expects the variables vcpkg's ports.cmake and the triplet set: PORT, VERSION, FEATURES,
# CURRENT_PORT_DIR, CURRENT_PACKAGES_DIR, CURRENT_BUILDTREES_DIR, CURRENT_INSTALLED_DIR,
# DOWNLOADS, TARGET_TRIPLET, VCPKG_TARGET_IS_LINUX, VCPKG_LIBRARY_LINKAGE, VCPKG_CONCURRENCY;
# and the model's own: Z_MODEL_TOOLCHAIN (toolchain.cmake beside this file), Z_MODEL_CALLS (a
# file that records each helper call, one line each).

function(z_model_record)
  list(JOIN ARGN " " line)
  file(APPEND "${Z_MODEL_CALLS}" "${line}\n")
endfunction()

function(z_model_refuse_unparsed fn)
  if(DEFINED arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${fn} (model): arguments this model does not handle: ${arg_UNPARSED_ARGUMENTS}")
  endif()
endfunction()

# z_model_run(LOG name COMMAND ...): run, log to CURRENT_BUILDTREES_DIR/<name>-{out,err}.log, fail
# with the log's tail (scripts/cmake/vcpkg_execute_required_process.cmake).
function(z_model_run)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "LOG;WORKING_DIRECTORY" "COMMAND")
  if(NOT arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY "${CURRENT_BUILDTREES_DIR}")
  endif()
  execute_process(COMMAND ${arg_COMMAND} WORKING_DIRECTORY "${arg_WORKING_DIRECTORY}"
                  OUTPUT_FILE "${CURRENT_BUILDTREES_DIR}/${arg_LOG}-out.log"
                  ERROR_FILE "${CURRENT_BUILDTREES_DIR}/${arg_LOG}-err.log"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    file(READ "${CURRENT_BUILDTREES_DIR}/${arg_LOG}-out.log" out)
    file(READ "${CURRENT_BUILDTREES_DIR}/${arg_LOG}-err.log" err)
    string(LENGTH "${out}" n)
    if(n GREATER 6000)
      math(EXPR start "${n} - 6000")
      string(SUBSTRING "${out}" ${start} -1 out)
    endif()
    list(JOIN arg_COMMAND " " cmd)
    message(FATAL_ERROR "Command failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
endfunction()

# scripts/cmake/vcpkg_from_git.cmake: git init a scratch repository under DOWNLOADS, fetch REF
# (a commit SHA) from URL at depth 1, check that it resolves to REF, git archive it into
# DOWNLOADS/<port>-<ref>.tar.gz (reused when present), extract it under the buildtree.
function(vcpkg_from_git)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_SOURCE_PATH;URL;REF;HEAD_REF" "")
  z_model_refuse_unparsed(vcpkg_from_git)
  foreach(v OUT_SOURCE_PATH URL REF)
    if(NOT DEFINED arg_${v})
      message(FATAL_ERROR "vcpkg_from_git: ${v} must be specified")
    endif()
  endforeach()
  z_model_record(vcpkg_from_git URL "${arg_URL}" REF "${arg_REF}")
  if(NOT arg_REF MATCHES "^[0-9a-f]+$")
    message(FATAL_ERROR "vcpkg_from_git: REF must be a commit SHA, not '${arg_REF}'")
  endif()
  string(REPLACE "/" "_-" sanitized_ref "${arg_REF}")
  set(archive "${DOWNLOADS}/${PORT}-${sanitized_ref}.tar.gz")
  if(NOT EXISTS "${archive}")
    find_program(GIT NAMES git REQUIRED)
    set(git_dir "${DOWNLOADS}/git-tmp")
    file(MAKE_DIRECTORY "${DOWNLOADS}/temp")
    z_model_run(LOG git-init COMMAND "${GIT}" init "${git_dir}")
    z_model_run(LOG git-fetch WORKING_DIRECTORY "${git_dir}" COMMAND "${GIT}" fetch "${arg_URL}" "${arg_REF}" --depth 1 -n)
    execute_process(COMMAND "${GIT}" rev-parse "${arg_REF}" WORKING_DIRECTORY "${git_dir}"
                    OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
    if(rc OR NOT rev STREQUAL arg_REF)
      message(FATAL_ERROR "vcpkg_from_git: after fetching ${arg_REF}, it resolves to '${rev}'; REF must be a commit SHA")
    endif()
    z_model_run(LOG git-archive WORKING_DIRECTORY "${git_dir}"
                COMMAND "${GIT}" -c core.autocrlf=false archive "${rev}" -o "${DOWNLOADS}/temp/${PORT}-${sanitized_ref}.tar.gz")
    file(RENAME "${DOWNLOADS}/temp/${PORT}-${sanitized_ref}.tar.gz" "${archive}")
  endif()
  # scripts/cmake/vcpkg_extract_source_archive.cmake: buildtrees/<port>/src/<short ref>-<hash>;
  # a git archive has no top-level directory (NO_REMOVE_ONE_LEVEL).
  string(SUBSTRING "${sanitized_ref}" 0 10 short_ref)
  set(source_path "${CURRENT_BUILDTREES_DIR}/src/${short_ref}-model")
  file(REMOVE_RECURSE "${source_path}")
  file(ARCHIVE_EXTRACT INPUT "${archive}" DESTINATION "${source_path}")
  set(${arg_OUT_SOURCE_PATH} "${source_path}" PARENT_SCOPE)
endfunction()

# scripts/cmake/vcpkg_from_github.cmake + vcpkg_download_distfile.cmake: REPO is owner/name, REF
# and SHA512 go together, SHA512 is 0 (vcpkg then reports the actual hash after downloading) or
# 128 hex digits; the archive is https://github.com/<REPO>/archive/<REF>.tar.gz. The model
# checks the call and records it; it downloads nothing.
function(vcpkg_from_github)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_SOURCE_PATH;REPO;REF;SHA512;HEAD_REF" "")
  z_model_refuse_unparsed(vcpkg_from_github)
  if(DEFINED arg_REF AND NOT DEFINED arg_SHA512)
    message(FATAL_ERROR "vcpkg_from_github: SHA512 must be specified if REF is specified.")
  endif()
  if(NOT DEFINED arg_OUT_SOURCE_PATH OR NOT DEFINED arg_REPO OR NOT DEFINED arg_REF)
    message(FATAL_ERROR "vcpkg_from_github: OUT_SOURCE_PATH, REPO and REF must be specified")
  endif()
  if(NOT arg_REPO MATCHES "^([^/]*)/([^/]*)$")
    message(FATAL_ERROR "vcpkg_from_github: REPO (${arg_REPO}) is not a valid repo name")
  endif()
  if(NOT arg_SHA512 STREQUAL "0" AND NOT arg_SHA512 MATCHES "^[0-9a-fA-F]+$")
    message(FATAL_ERROR "vcpkg_from_github: Invalid SHA512: ${arg_SHA512}")
  endif()
  string(LENGTH "${arg_SHA512}" n)
  if(NOT arg_SHA512 STREQUAL "0" AND NOT n EQUAL 128)
    message(FATAL_ERROR "vcpkg_from_github: Invalid SHA512: ${arg_SHA512}")
  endif()
  z_model_record(vcpkg_from_github REPO "${arg_REPO}" REF "${arg_REF}" SHA512 "${arg_SHA512}" HEAD_REF "${arg_HEAD_REF}")
  message(FATAL_ERROR "vcpkg_from_github (model): would download https://github.com/${arg_REPO}/archive/${arg_REF}.tar.gz "
                      "(SHA512 ${arg_SHA512}); this model downloads nothing")
endfunction()

# scripts/cmake/vcpkg_check_features.cmake: for each FEATURES pair, -D<var>=ON when the feature
# is in FEATURES, else OFF (INVERTED_FEATURES the other way round); <var> also set in the caller.
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS;PREFIX" "FEATURES;INVERTED_FEATURES")
  z_model_refuse_unparsed(vcpkg_check_features)
  if(NOT DEFINED arg_OUT_FEATURE_OPTIONS)
    message(FATAL_ERROR "vcpkg_check_features: OUT_FEATURE_OPTIONS must be defined.")
  endif()
  set(prefix "")
  if(DEFINED arg_PREFIX)
    set(prefix "${arg_PREFIX}_")
  endif()
  set(options "")
  set(seen "")
  foreach(kind FEATURES INVERTED_FEATURES)
    list(LENGTH arg_${kind} n)
    math(EXPR odd "${n} % 2")
    if(odd)
      message(FATAL_ERROR "vcpkg_check_features has an incorrect number of arguments to ${kind}")
    endif()
    set(rest "${arg_${kind}}")
    while(NOT rest STREQUAL "")
      list(POP_FRONT rest feature var)
      if(var IN_LIST seen)
        message(FATAL_ERROR "vcpkg_check_features passed the same feature variable multiple times: '${var}'")
      endif()
      list(APPEND seen "${var}")
      set(value OFF)
      if(feature IN_LIST FEATURES)
        set(value ON)
      endif()
      if(kind STREQUAL "INVERTED_FEATURES")
        if(value)
          set(value OFF)
        else()
          set(value ON)
        endif()
      endif()
      list(APPEND options "-D${var}=${value}")
      set(${prefix}${var} ${value} PARENT_SCOPE)
    endwhile()
  endforeach()
  z_model_record(vcpkg_check_features ${options})
  set(${arg_OUT_FEATURE_OPTIONS} "${options}" PARENT_SCOPE)
endfunction()

# ports/cuda/vcpkg_find_cuda.cmake (the cuda port's port-config, loaded for ports that depend on
# cuda): nvcc from CUDA_PATH, CUDA_HOME, CUDA_BIN_PATH, CUDA_TOOLKIT_ROOT_DIR (environment),
# the first /usr/local/cuda-X.Y at >= 10.1, /usr/bin; the root is nvcc's directory's parent.
function(vcpkg_find_cuda)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_CUDA_TOOLKIT_ROOT;OUT_CUDA_VERSION" "")
  z_model_refuse_unparsed(vcpkg_find_cuda)
  if(NOT "cuda" IN_LIST FEATURES)
    message(FATAL_ERROR "vcpkg_find_cuda (model): only a port that depends on cuda has it; FEATURES=${FEATURES}")
  endif()
  set(candidates)
  foreach(e CUDA_PATH CUDA_HOME CUDA_BIN_PATH CUDA_TOOLKIT_ROOT_DIR)
    if(DEFINED ENV{${e}})
      list(APPEND candidates "$ENV{${e}}")
    endif()
  endforeach()
  file(GLOB versioned LIST_DIRECTORIES true "/usr/local/cuda-*")
  foreach(p IN LISTS versioned)
    if(IS_DIRECTORY "${p}" AND p MATCHES "[0-9][0-9]?\\.[0-9]$" AND CMAKE_MATCH_0 VERSION_GREATER_EQUAL 10.1)
      list(APPEND candidates "${p}")
      break()
    endif()
  endforeach()
  list(APPEND candidates /usr)
  find_program(z_model_nvcc NAMES nvcc PATHS ${candidates} PATH_SUFFIXES bin bin64 NO_DEFAULT_PATH NO_CACHE)
  if(NOT z_model_nvcc)
    message(FATAL_ERROR "Could not find CUDA. Before continuing, please download and install CUDA (v10.1.0 or higher)")
  endif()
  execute_process(COMMAND "${z_model_nvcc}" --version OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(rc OR NOT out MATCHES "V([0-9]+)\\.([0-9]+)\\.([0-9]+)")
    message(FATAL_ERROR "Could not find CUDA: ${z_model_nvcc} --version failed")
  endif()
  get_filename_component(root "${z_model_nvcc}" DIRECTORY)
  get_filename_component(root "${root}" DIRECTORY)
  z_model_record(vcpkg_find_cuda "${root}")
  set(${arg_OUT_CUDA_TOOLKIT_ROOT} "${root}" PARENT_SCOPE)
  if(DEFINED arg_OUT_CUDA_VERSION)
    set(${arg_OUT_CUDA_VERSION} "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}" PARENT_SCOPE)
  endif()
endfunction()

# ports/vcpkg-cmake/vcpkg_cmake_configure.cmake, Linux, Ninja, VCPKG_BUILD_TYPE release: a fresh
# buildtrees/<port>/<triplet>-rel configured with -DCMAKE_BUILD_TYPE=Release, the install prefix
# at the package directory, the OPTIONS and OPTIONS_RELEASE, the options vcpkg adds that bear on
# this port (its toolchain, the installed tree, lib/bin install directories, no package
# registries, absolute install destinations an error, no writes into the source tree, fetches
# disconnected, BUILD_SHARED_LIBS from the linkage) and the triplet's VCPKG_CMAKE_CONFIGURE_OPTIONS.
# Afterwards, every variable the OPTIONS set that the project did not use is reported, except
# those named in MAYBE_UNUSED_VARIABLES: vcpkg warns; the model records it (the test fails on it).
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE;MAYBE_UNUSED_VARIABLES")
  z_model_refuse_unparsed(vcpkg_cmake_configure)
  if(NOT DEFINED arg_SOURCE_PATH)
    message(FATAL_ERROR "vcpkg_cmake_configure: SOURCE_PATH must be set")
  endif()
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    message(FATAL_ERROR "vcpkg_cmake_configure (model): only VCPKG_BUILD_TYPE release is modelled")
  endif()
  set(specified "")
  foreach(option IN LISTS arg_OPTIONS arg_OPTIONS_RELEASE)
    if(option MATCHES "^-D([^:=]*)[:=]")
      list(APPEND specified "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES specified)
  foreach(v IN LISTS arg_MAYBE_UNUSED_VARIABLES)
    list(REMOVE_ITEM specified "${v}")
  endforeach()

  if(VCPKG_LIBRARY_LINKAGE STREQUAL "dynamic")
    set(shared ON)
  else()
    set(shared OFF)
  endif()
  set(build_dir "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel")
  file(REMOVE_RECURSE "${build_dir}")
  file(MAKE_DIRECTORY "${build_dir}")
  find_program(NINJA NAMES ninja ninja-build REQUIRED)
  set(command "${CMAKE_COMMAND}" "${arg_SOURCE_PATH}" -G Ninja "-DCMAKE_MAKE_PROGRAM=${NINJA}"
      -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}"
      -DFETCHCONTENT_FULLY_DISCONNECTED=ON "-DBUILD_SHARED_LIBS=${shared}"
      ${arg_OPTIONS} ${arg_OPTIONS_RELEASE}
      "-DVCPKG_TARGET_TRIPLET=${TARGET_TRIPLET}" "-D_VCPKG_INSTALLED_DIR=${_VCPKG_INSTALLED_DIR}"
      "-DCMAKE_TOOLCHAIN_FILE=${Z_MODEL_TOOLCHAIN}"
      -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
      -DCMAKE_FIND_PACKAGE_NO_SYSTEM_PACKAGE_REGISTRY=ON -DCMAKE_INSTALL_SYSTEM_RUNTIME_LIBS_SKIP=TRUE
      -DCMAKE_VERBOSE_MAKEFILE=ON -DCMAKE_ERROR_ON_ABSOLUTE_INSTALL_DESTINATION=ON
      -DCMAKE_INSTALL_LIBDIR:STRING=lib -DCMAKE_INSTALL_BINDIR:STRING=bin
      -DVCPKG_MANIFEST_INSTALL=OFF -DCMAKE_DISABLE_SOURCE_CHANGES=ON
      ${VCPKG_CMAKE_CONFIGURE_OPTIONS} ${VCPKG_CMAKE_CONFIGURE_OPTIONS_RELEASE})
  z_model_record(vcpkg_cmake_configure ${arg_OPTIONS} ${arg_OPTIONS_RELEASE})
  message(STATUS "Configuring ${TARGET_TRIPLET}-rel")
  z_model_run(LOG "config-${TARGET_TRIPLET}-rel" WORKING_DIRECTORY "${build_dir}" COMMAND ${command})

  file(READ "${CURRENT_BUILDTREES_DIR}/config-${TARGET_TRIPLET}-rel-err.log" log)
  file(READ "${CURRENT_BUILDTREES_DIR}/config-${TARGET_TRIPLET}-rel-out.log" out)
  string(APPEND log "${out}")
  set(unused "")
  if(log MATCHES "Manually-specified variables were not used by the project:\n\n((    [^\n]*\n)*)")
    string(STRIP "${CMAKE_MATCH_1}" listed)
    string(REPLACE "\n    " ";" listed "${listed}")
    foreach(v IN LISTS listed)
      if(v IN_LIST specified)
        list(APPEND unused "${v}")
      endif()
    endforeach()
  endif()
  if(unused)
    z_model_record(unused-variables ${unused})
    message(WARNING "The following variables are not used in CMakeLists.txt: ${unused}")
  endif()
  set(Z_MODEL_BUILD_DIR "${build_dir}" CACHE INTERNAL "")
endfunction()

# ports/vcpkg-cmake/vcpkg_cmake_install.cmake -> vcpkg_cmake_build.cmake: cmake --build of the
# release tree, target install, ninja -v -j<concurrency>.
function(vcpkg_cmake_install)
  cmake_parse_arguments(PARSE_ARGV 0 arg "DISABLE_PARALLEL;ADD_BIN_TO_PATH" "" "")
  z_model_refuse_unparsed(vcpkg_cmake_install)
  if(NOT DEFINED CACHE{Z_MODEL_BUILD_DIR})
    message(FATAL_ERROR "vcpkg_cmake_install before vcpkg_cmake_configure")
  endif()
  z_model_record(vcpkg_cmake_install)
  message(STATUS "Building ${TARGET_TRIPLET}-rel")
  z_model_run(LOG "install-${TARGET_TRIPLET}-rel" WORKING_DIRECTORY "${Z_MODEL_BUILD_DIR}"
              COMMAND "${CMAKE_COMMAND}" --build . --config Release --target install -- -v "-j${VCPKG_CONCURRENCY}")
endfunction()

# ports/vcpkg-cmake-config/vcpkg_cmake_config_fixup.cmake, release only: CONFIG_PATH's files move
# to share/<PACKAGE_NAME> (default: the port's name) and CONFIG_PATH goes, its parent too when
# that is named cmake; in *-release.cmake, ${_IMPORT_PREFIX}/bin/<exe> becomes
# ${_IMPORT_PREFIX}/tools/<port>/<exe>; in every *.cmake there, the _IMPORT_PREFIX computation
# climbs exactly two levels and PACKAGE_PREFIX_DIR is "${CMAKE_CURRENT_LIST_DIR}/../../"; absolute
# paths to the package or installed directory become ${VCPKG_IMPORT_PREFIX}, defined at the top.
function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH;TOOLS_PATH" "")
  z_model_refuse_unparsed(vcpkg_cmake_config_fixup)
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME "${PORT}")
  endif()
  if(NOT arg_CONFIG_PATH)
    set(arg_CONFIG_PATH "share/${arg_PACKAGE_NAME}")
  endif()
  if(NOT arg_TOOLS_PATH)
    set(arg_TOOLS_PATH "tools/${PORT}")
  endif()
  z_model_record(vcpkg_cmake_config_fixup CONFIG_PATH "${arg_CONFIG_PATH}")
  set(share "${CURRENT_PACKAGES_DIR}/share/${arg_PACKAGE_NAME}")
  if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    set(config "${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}")
    if(NOT EXISTS "${config}")
      message(FATAL_ERROR "'${config}' does not exist.")
    endif()
    file(GLOB files "${config}/*")
    file(COPY ${files} DESTINATION "${share}")
    file(REMOVE_RECURSE "${config}")
    get_filename_component(parent "${config}" DIRECTORY)
    get_filename_component(parent_name "${parent}" NAME)
    string(TOLOWER "${parent_name}" parent_name)
    if(parent_name STREQUAL "cmake")
      file(REMOVE_RECURSE "${parent}")
    endif()
  endif()
  file(GLOB_RECURSE release_targets "${share}/*-[Rr]elease.cmake")
  foreach(f IN LISTS release_targets)
    file(READ "${f}" contents)
    string(REPLACE "${CURRENT_INSTALLED_DIR}" "\${_IMPORT_PREFIX}" contents "${contents}")
    string(REGEX REPLACE "\\\${_IMPORT_PREFIX}/bin/([^ \"]+)" "\${_IMPORT_PREFIX}/${arg_TOOLS_PATH}/\\1" contents "${contents}")
    file(WRITE "${f}" "${contents}")
  endforeach()
  file(GLOB_RECURSE cmakes "${share}/*.cmake")
  foreach(f IN LISTS cmakes)
    file(READ "${f}" contents)
    string(REGEX REPLACE
      "get_filename_component\\(_IMPORT_PREFIX \"\\\${CMAKE_CURRENT_LIST_FILE}\" PATH\\)(\nget_filename_component\\(_IMPORT_PREFIX \"\\\${_IMPORT_PREFIX}\" PATH\\))*"
      "get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_FILE}\" PATH)\nget_filename_component(_IMPORT_PREFIX \"\${_IMPORT_PREFIX}\" PATH)\nget_filename_component(_IMPORT_PREFIX \"\${_IMPORT_PREFIX}\" PATH)"
      contents "${contents}")
    string(REGEX REPLACE
      "get_filename_component\\(PACKAGE_PREFIX_DIR \"\\\${CMAKE_CURRENT_LIST_DIR}/\\.\\./(\\.\\./)*\" ABSOLUTE\\)"
      "get_filename_component(PACKAGE_PREFIX_DIR \"\${CMAKE_CURRENT_LIST_DIR}/../../\" ABSOLUTE)"
      contents "${contents}")
    string(REPLACE "${CURRENT_INSTALLED_DIR}" "\${VCPKG_IMPORT_PREFIX}" contents "${contents}")
    string(REPLACE "${CURRENT_PACKAGES_DIR}" "\${VCPKG_IMPORT_PREFIX}" contents "${contents}")
    string(FIND "${contents}" "\${VCPKG_IMPORT_PREFIX}" at)
    if(NOT at EQUAL -1)
      get_filename_component(dir "${f}" DIRECTORY)
      file(RELATIVE_PATH up "${dir}" "${CURRENT_PACKAGES_DIR}")
      string(PREPEND contents "get_filename_component(VCPKG_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_DIR}/${up}\" ABSOLUTE)\n")
    endif()
    file(WRITE "${f}" "${contents}")
  endforeach()
endfunction()

# scripts/cmake/vcpkg_fixup_pkgconfig.cmake, release only: every .pc file in the package (not
# under debug/) gets prefix=${pcfiledir}/<path up to the package root>, absolute package and
# installed paths become ${prefix}; then `pkg-config --exists <name>` must succeed with
# PKG_CONFIG_PATH at the package's and the installed tree's pkgconfig directories (the system's
# default directories stay searched in this model: the dependencies are Debian's here).
function(vcpkg_fixup_pkgconfig)
  cmake_parse_arguments(PARSE_ARGV 0 arg "SKIP_CHECK" "" "")
  z_model_refuse_unparsed(vcpkg_fixup_pkgconfig)
  file(GLOB_RECURSE files "${CURRENT_PACKAGES_DIR}/*.pc")
  list(FILTER files EXCLUDE REGEX "^${CURRENT_PACKAGES_DIR}/debug/")
  z_model_record(vcpkg_fixup_pkgconfig ${files})
  foreach(f IN LISTS files)
    get_filename_component(dir "${f}" DIRECTORY)
    file(RELATIVE_PATH up "${dir}" "${CURRENT_PACKAGES_DIR}")
    string(REGEX REPLACE "/$" "" up "${up}")
    file(READ "${f}" contents)
    string(REPLACE "${CURRENT_PACKAGES_DIR}" "\${prefix}" contents "${contents}")
    string(REPLACE "${CURRENT_INSTALLED_DIR}" "\${prefix}" contents "${contents}")
    string(REGEX REPLACE "\n[\t ]*prefix[\t ]*=[^\n]*" "" contents "\n${contents}")
    string(PREPEND contents "prefix=\${pcfiledir}/${up}")
    file(WRITE "${f}" "${contents}")
  endforeach()
  if(NOT arg_SKIP_CHECK)
    find_program(PKGCONFIG NAMES pkg-config pkgconf REQUIRED)
    set(path "${CURRENT_PACKAGES_DIR}/lib/pkgconfig:${CURRENT_PACKAGES_DIR}/share/pkgconfig:${CURRENT_INSTALLED_DIR}/lib/pkgconfig:${CURRENT_INSTALLED_DIR}/share/pkgconfig")
    foreach(f IN LISTS files)
      get_filename_component(name "${f}" NAME_WE)
      execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${path}" "${PKGCONFIG}" --print-errors --exists "${name}"
                      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
      if(rc)
        message(FATAL_ERROR "${PKGCONFIG} --exists ${name} failed with error code: ${rc}\n  PKG_CONFIG_PATH: ${path}\n  output: ${out}")
      endif()
    endforeach()
  endif()
endfunction()

# scripts/cmake/vcpkg_copy_tools.cmake (+ vcpkg_clean_executables_in_bin.cmake with AUTO_CLEAN):
# each bin/<name> is copied to tools/<port> (an error when missing); AUTO_CLEAN removes them
# from bin/ and bin/ itself once empty.
function(vcpkg_copy_tools)
  cmake_parse_arguments(PARSE_ARGV 0 arg "AUTO_CLEAN" "SEARCH_DIR;DESTINATION" "TOOL_NAMES")
  z_model_refuse_unparsed(vcpkg_copy_tools)
  if(NOT DEFINED arg_TOOL_NAMES)
    message(FATAL_ERROR "TOOL_NAMES must be specified.")
  endif()
  if(NOT DEFINED arg_DESTINATION)
    set(arg_DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}")
  endif()
  if(NOT DEFINED arg_SEARCH_DIR)
    set(arg_SEARCH_DIR "${CURRENT_PACKAGES_DIR}/bin")
  endif()
  z_model_record(vcpkg_copy_tools ${arg_TOOL_NAMES})
  foreach(name IN LISTS arg_TOOL_NAMES)
    if(NOT EXISTS "${arg_SEARCH_DIR}/${name}")
      message(FATAL_ERROR "Couldn't find tool \"${name}\":\n    \"${arg_SEARCH_DIR}/${name}\" does not exist")
    endif()
    file(COPY "${arg_SEARCH_DIR}/${name}" DESTINATION "${arg_DESTINATION}")
  endforeach()
  if(arg_AUTO_CLEAN)
    foreach(name IN LISTS arg_TOOL_NAMES)
      file(REMOVE "${CURRENT_PACKAGES_DIR}/bin/${name}" "${CURRENT_PACKAGES_DIR}/debug/bin/${name}")
    endforeach()
    foreach(dir bin debug/bin)
      file(GLOB left "${CURRENT_PACKAGES_DIR}/${dir}/*")
      if(EXISTS "${CURRENT_PACKAGES_DIR}/${dir}" AND NOT left)
        file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/${dir}")
      endif()
    endforeach()
  endif()
endfunction()

# scripts/cmake/vcpkg_install_copyright.cmake: one file is installed as share/<port>/copyright;
# several are concatenated, each under its name.
function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "COMMENT" "FILE_LIST")
  z_model_refuse_unparsed(vcpkg_install_copyright)
  list(LENGTH arg_FILE_LIST n)
  if(n EQUAL 0)
    message(FATAL_ERROR "FILE_LIST must contain at least one file")
  endif()
  z_model_record(vcpkg_install_copyright ${arg_FILE_LIST})
  set(text "")
  if(arg_COMMENT)
    set(text "${arg_COMMENT}\n\n")
  endif()
  foreach(f IN LISTS arg_FILE_LIST)
    if(NOT EXISTS "${f}")
      message(FATAL_ERROR "vcpkg_install_copyright was passed a non-existing path: ${f}")
    endif()
    file(READ "${f}" body)
    if(n EQUAL 1)
      string(APPEND text "${body}")
    else()
      get_filename_component(name "${f}" NAME)
      string(APPEND text "${name}:\n\n${body}\n\n")
    endif()
  endforeach()
  file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright" "${text}")
endfunction()
