// Element types of checkpointed buffers, as recorded in the manifest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

/// What one element of a buffer is. `bytes` is anything else trivially copyable: it restores
/// byte for byte, but cannot be resharded by element.
enum class dtype : std::uint8_t { bytes, boolean, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64 };

/// Size of one element in bytes (1 for `bytes`).
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::bytes: case dtype::boolean: case dtype::i8: case dtype::u8: return 1;
    case dtype::i16: case dtype::u16: case dtype::f16: case dtype::bf16: return 2;
    case dtype::i32: case dtype::u32: case dtype::f32: return 4;
    case dtype::i64: case dtype::u64: case dtype::f64: return 8;
  }
  return 1;
}

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::bytes: return "bytes";
    case dtype::boolean: return "bool";
    case dtype::i8: return "i8";
    case dtype::i16: return "i16";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::u16: return "u16";
    case dtype::u32: return "u32";
    case dtype::u64: return "u64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
  }
  return "bytes";
}

/// Parses a manifest's dtype name.
inline dtype dtype_from_string(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(dtype::f64); ++i) {
    if (to_string(static_cast<dtype>(i)) == s) return static_cast<dtype>(i);
  }
  throw error(errc::corrupt, "unknown dtype '" + std::string(s) + "' in checkpoint manifest");
}

/// The dtype of a C++ element type; half-precision types of CUDA and others map to `bytes`
/// unless the caller names f16/bf16 explicitly.
template <class T>
constexpr dtype dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bool>) return dtype::boolean;
  else if constexpr (std::is_same_v<U, float>) return dtype::f32;
  else if constexpr (std::is_same_v<U, double>) return dtype::f64;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) return dtype::i8;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 2) return dtype::i16;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return dtype::i32;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return dtype::i64;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1) return dtype::u8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 2) return dtype::u16;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) return dtype::u32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) return dtype::u64;
  else return dtype::bytes;
}

}  // namespace elastic::inline v1::checkpoint
