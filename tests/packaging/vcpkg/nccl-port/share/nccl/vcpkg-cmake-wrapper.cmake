# A MODEL of what vcpkg's nccl port (microsoft/vcpkg ports/nccl) installs in share/nccl, for
# tests/test_port.py; not that port. The port builds nothing: it checks that the system has NCCL
# and installs this wrapper and its FindNCCL.cmake. vcpkg's toolchain includes the wrapper for
# every find_package(NCCL ...) (ARGS holds the call); it APPENDS its directory to
# CMAKE_MODULE_PATH, so a FindNCCL.cmake that the project put on the path earlier wins.
set(z_model_nccl_module_path "${CMAKE_MODULE_PATH}")
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
_find_package(${ARGS})
set(CMAKE_MODULE_PATH "${z_model_nccl_module_path}")
unset(z_model_nccl_module_path)
