// Opaque handles that are never reused: communicators, streams and events hand the caller an
// address inside a PROT_NONE reservation, so a stale handle can always be told from a live one
// (a reused heap address could not) and dereferencing one faults at once. The objects
// themselves live in shared_ptrs: work still queued on a stream keeps what it needs alive.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace nccl_model {

enum class handle_status { live, dead, unknown };

template <class T>
class handle_table {
 public:
  handle_table() {
    void* p = ::mmap(nullptr, reserved_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fputs("nccl-model: cannot reserve address space for handles\n", stderr);
      std::abort();
    }
    base_ = static_cast<std::byte*>(p);
  }
  handle_table(const handle_table&) = delete;
  handle_table& operator=(const handle_table&) = delete;

  /// A fresh handle for `object`.
  void* add(std::shared_ptr<T> object) {
    std::lock_guard lk(mu_);
    if ((next_ + 1) * stride > reserved_bytes) {
      std::fputs("nccl-model: out of handles (more than a million made in one process)\n", stderr);
      std::abort();
    }
    void* h = base_ + (next_++) * stride;
    live_.emplace(reinterpret_cast<std::uintptr_t>(h), std::move(object));
    return h;
  }

  /// The object behind `h` (nullptr unless live) and what `h` is.
  std::shared_ptr<T> find(const void* h, handle_status* status = nullptr) const {
    std::lock_guard lk(mu_);
    const auto key = reinterpret_cast<std::uintptr_t>(h);
    if (auto it = live_.find(key); it != live_.end()) {
      if (status) *status = handle_status::live;
      return it->second;
    }
    if (status) *status = dead_.count(key) != 0 ? handle_status::dead : handle_status::unknown;
    return nullptr;
  }

  /// Retires `h` (later lookups say dead) and hands back its object.
  std::shared_ptr<T> retire(const void* h) {
    std::lock_guard lk(mu_);
    const auto key = reinterpret_cast<std::uintptr_t>(h);
    auto it = live_.find(key);
    if (it == live_.end()) return nullptr;
    std::shared_ptr<T> out = std::move(it->second);
    live_.erase(it);
    dead_.insert(key);
    return out;
  }

  [[nodiscard]] int live_count() const {
    std::lock_guard lk(mu_);
    return static_cast<int>(live_.size());
  }

 private:
  static constexpr std::size_t reserved_bytes = std::size_t{16} << 20;  // 16 MiB of address space
  static constexpr std::size_t stride = 16;
  mutable std::mutex mu_;
  std::byte* base_ = nullptr;
  std::size_t next_ = 0;
  std::unordered_map<std::uintptr_t, std::shared_ptr<T>> live_;
  std::unordered_set<std::uintptr_t> dead_;
};

}  // namespace nccl_model
