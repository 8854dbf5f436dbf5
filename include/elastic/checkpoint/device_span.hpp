// A view of device (GPU) memory: a pointer the host must not dereference, and a count.
#pragma once

#include <cstddef>

namespace elastic::inline v1::checkpoint {

/// `count` elements of T in device memory. Registering one with a checkpoint state makes the
/// snapshot copy it on a side CUDA stream; in a build without CUDA it cannot be snapshotted.
template <class T>
struct device_span {
  using element_type = T;
  T* data = nullptr;
  std::size_t count = 0;

  constexpr device_span() noexcept = default;
  constexpr device_span(T* p, std::size_t n) noexcept : data(p), count(n) {}
  [[nodiscard]] constexpr std::size_t size() const noexcept { return count; }
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return count * sizeof(T); }
};

template <class T>
device_span(T*, std::size_t) -> device_span<T>;

}  // namespace elastic::inline v1::checkpoint

namespace elastic::inline v1 {
// Re-exported at elastic:: (the common entry points, STYLE.md): users write elastic::device_span.
using checkpoint::device_span;
}  // namespace elastic::inline v1
