// What a libtorch tensor's memory is to the rest of the library: its C++ element type (for the
// checkpoint's dtype and the communicators' spans) and whether it is host or device memory.
// Every adapter goes through here, so a tensor the library cannot hold is refused in one place,
// with its name.
#pragma once

#if !ELASTIC_WITH_TORCH
#error "elastic/torch/detail/tensor_memory.hpp needs LibTorch: link elastic::torch (which sets ELASTIC_WITH_TORCH=1)"
#endif

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <elastic/comm/half.hpp>
#include <elastic/config.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::libtorch::detail {

/// Runs `f`; what libtorch throws (c10::Error, a std::exception) leaves as an elastic error with
/// `code`, saying `what` failed: no other exception leaves the library.
template <class F>
decltype(auto) guarded(errc code, std::string_view what, F&& f) {
  try {
    return f();
  } catch (const error&) {
    throw;
  } catch (const c10::Error& e) {  // its what() carries a stack trace
    throw error(code, fmt::format("{}: {}", what, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw error(code, fmt::format("{}: {}", what, e.what()));
  }
}

/// The scalar type's name as libtorch writes it ("Float", "Half").
inline std::string scalar_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

/// Calls `f(T{})` with the C++ element type of `t` (float, double, comm::float16, comm::bfloat16,
/// the integer types, bool). Throws errc::not_supported for any other (complex, quantized).
template <class F>
decltype(auto) with_element_type(const at::Tensor& t, std::string_view what, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kHalf: return f(comm::float16{});
    case at::kBFloat16: return f(comm::bfloat16{});
    case at::kLong: return f(std::int64_t{});
    case at::kInt: return f(std::int32_t{});
    case at::kShort: return f(std::int16_t{});
    case at::kChar: return f(std::int8_t{});
    case at::kByte: return f(std::uint8_t{});
    case at::kBool: return f(bool{});
    default:
      throw error(errc::not_supported,
                  fmt::format("{}: tensors of {} are not supported (floating point, integer or bool only)", what,
                              scalar_name(t)));
  }
}

/// Checks that `t` is memory the library can point at for as long as the tensor lives: defined,
/// dense, contiguous, on the CPU or (in a CUDA build) a CUDA device.
inline void check_addressable(const at::Tensor& t, std::string_view what) {
  if (!t.defined()) throw error(errc::invalid_argument, fmt::format("{}: the tensor is undefined", what));
  if (t.is_sparse() || t.layout() != at::kStrided) {
    throw error(errc::not_supported, fmt::format("{}: only dense (strided) tensors can be registered", what));
  }
  if (!t.is_contiguous()) {
    throw error(errc::invalid_argument,
                fmt::format("{}: the tensor is not contiguous; register a contiguous one (tensor.contiguous() "
                            "makes a copy, which the module would then have to use)",
                            what));
  }
  if (t.is_cuda()) {
    if constexpr (!ELASTIC_WITH_CUDA) {
      throw error(errc::not_supported, fmt::format("{}: the tensor is on {}, but this build has no CUDA: link "
                                                   "elastic::cuda (ELASTIC_WITH_CUDA=1)",
                                                   what, t.device().str()));
    }
  } else if (!t.is_cpu()) {
    throw error(errc::not_supported,
                fmt::format("{}: the tensor is on {}; the CPU and CUDA devices are supported", what, t.device().str()));
  }
}

}  // namespace elastic::inline v1::libtorch::detail
