# A MODEL of the FindNCCL.cmake that vcpkg's nccl port installs (microsoft/vcpkg
# ports/nccl/FindNCCL.cmake), for tests/test_port.py; not that file. What a project meets when
# this module runs instead of its own: result variables NCCL_INCLUDE_DIRS and NCCL_LIBRARIES and
# no imported target; NCCL_INCLUDE_DIR and NCCL_LIB_DIR become cache entries taken from the
# environment (empty when the environment has none); the version goes into _NCCL_VERSION.
set(NCCL_INCLUDE_DIR "$ENV{NCCL_INCLUDE_DIR}" CACHE PATH "Folder contains NVIDIA NCCL headers")
set(NCCL_LIB_DIR "$ENV{NCCL_LIB_DIR}" CACHE PATH "Folder contains NVIDIA NCCL libraries")
set(ELASTIC_MODEL_VCPKG_FINDNCCL_USED TRUE)
find_path(NCCL_INCLUDE_DIRS NAMES nccl.h HINTS ${NCCL_INCLUDE_DIR} $ENV{CUDA_PATH} PATH_SUFFIXES include)
find_library(NCCL_LIBRARIES NAMES nccl HINTS ${NCCL_LIB_DIR} $ENV{CUDA_PATH} PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIRS AND EXISTS "${NCCL_INCLUDE_DIRS}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIRS}/nccl.h" z_model_nccl_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^0-9;]" "" z_model_nccl_lines "${z_model_nccl_lines}")
  list(JOIN z_model_nccl_lines "." _NCCL_VERSION)
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_INCLUDE_DIRS NCCL_LIBRARIES VERSION_VAR _NCCL_VERSION)
