// Host staging memory: pinned (page-locked, cudaHostAlloc) in CUDA builds so device copies run
// at full PCIe speed, otherwise anonymous pages faulted in up front so the first snapshot does
// not pay for page faults inside the training loop.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <elastic/internal/cuda.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

class host_memory {
 public:
  host_memory() noexcept = default;
  /// `bytes` of staging; `pinned` asks for page-locked memory when the build has CUDA.
  host_memory(std::size_t bytes, bool pinned) : size_(bytes) {
    if (bytes == 0) return;
#if ELASTIC_WITH_CUDA
    if (pinned) {
      internal::cuda::check(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault), "cudaHostAlloc of checkpoint staging");
      pinned_ = true;
      return;
    }
#else
    (void)pinned;
#endif
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      throw error(errc::capacity_exhausted,
                  "cannot allocate " + std::to_string(bytes) + " bytes of checkpoint staging memory");
    }
    data_ = p;
  }
  host_memory(host_memory&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), pinned_(o.pinned_) {}
  host_memory& operator=(host_memory&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(pinned_, o.pinned_);
    return *this;
  }
  host_memory(const host_memory&) = delete;
  host_memory& operator=(const host_memory&) = delete;
  ~host_memory() {
    if (!data_) return;
#if ELASTIC_WITH_CUDA
    if (pinned_) {
      cudaFreeHost(data_);
      return;
    }
#endif
    ::munmap(data_, size_);
  }

  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(data_); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool pinned() const noexcept { return pinned_; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool pinned_ = false;
};

}  // namespace elastic::inline v1::checkpoint::detail
