// Storage for the few objects a process genuinely has one of and that must outlive every thread.
#pragma once

#include <memory>
#include <new>
#include <utility>

namespace elastic::inline v1::internal {

/// Holds a T that is constructed on first use and never destroyed. For process-wide state that
/// other threads may still touch while static destructors run at exit (a mapping that live
/// timer scopes point into): the kernel reclaims it when the process ends.
template <class T>
class no_destroy {
 public:
  template <class... Args>
  explicit no_destroy(Args&&... args) {
    std::construct_at(reinterpret_cast<T*>(storage_), std::forward<Args>(args)...);
  }
  no_destroy(const no_destroy&) = delete;
  no_destroy& operator=(const no_destroy&) = delete;

  T& get() noexcept { return *std::launder(reinterpret_cast<T*>(storage_)); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace elastic::inline v1::internal
