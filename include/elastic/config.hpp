// Version of the library and the feature macros the build enabled.
//
// The CMake targets elastic::cuda, elastic::nccl, elastic::gloo, elastic::etcd, elastic::s3 and
// elastic::libdw define the matching ELASTIC_WITH_* macro to 1; without them every feature is off
// and the parts that need it are not included by the umbrella header. Never test __CUDACC__ in
// public headers: the API has the same shape with or without CUDA.
#pragma once

#define ELASTIC_VERSION_MAJOR 0
#define ELASTIC_VERSION_MINOR 1
#define ELASTIC_VERSION_PATCH 0
#define ELASTIC_VERSION_STRING "0.1.0"

// The ABI version. Every declaration of the library lives in the inline namespace
// elastic::v1 (each header opens `namespace elastic::inline v1`), so two builds whose layouts
// differ link to different symbols instead of silently mixing; users still write `elastic::`.
// Bump it with any change that breaks the ABI (tests/test_layout.py checks every header opens
// the namespace this names).
#define ELASTIC_ABI_VERSION v1

#ifndef ELASTIC_WITH_CUDA
#define ELASTIC_WITH_CUDA 0
#endif
#ifndef ELASTIC_WITH_NCCL
#define ELASTIC_WITH_NCCL 0
#endif
#ifndef ELASTIC_WITH_GLOO
#define ELASTIC_WITH_GLOO 0
#endif
#ifndef ELASTIC_WITH_ETCD
#define ELASTIC_WITH_ETCD 0
#endif
#ifndef ELASTIC_WITH_S3
#define ELASTIC_WITH_S3 0
#endif
#ifndef ELASTIC_WITH_LIBDW
#define ELASTIC_WITH_LIBDW 0
#endif
#ifndef ELASTIC_WITH_TORCH
#define ELASTIC_WITH_TORCH 0
#endif

namespace elastic::inline v1 {

/// The library version as a value, for run-time checks and log lines.
struct version_info {
  int major;
  int minor;
  int patch;
  const char* string;
};

inline constexpr version_info version{ELASTIC_VERSION_MAJOR, ELASTIC_VERSION_MINOR,
                                      ELASTIC_VERSION_PATCH, ELASTIC_VERSION_STRING};

}  // namespace elastic::inline v1
