// A worker's view of the watchdog's segment: opened (never created), checked, and mapped for as
// long as the process lives. Plain shm_open and mmap rather than Boost.Interprocess, which the
// watchdog's side uses: this is what every timer scope's header includes, and it must stay
// cheap to compile (see benchmarks/README.md, "Compile cost").
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <elastic/internal/shm_owner.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/detail/segment_checks.hpp>
#include <elastic/timer/detail/table.hpp>

namespace elastic::inline v1::timer::detail {

class attached_segment {
 public:
  /// Opens the existing segment `name` and checks it. Waits up to `ready_timeout` for a watchdog
  /// that is still initializing it. Throws elastic::error: bad_name, not_found, owner_mismatch,
  /// version_mismatch, corrupt, os_error; each names the segment and says what to do.
  static attached_segment open(std::string_view name,
                               std::chrono::milliseconds ready_timeout = std::chrono::milliseconds(2000)) {
    validate_segment_name(name);
    attached_segment s;
    s.name_ = std::string(name);
    const std::string obj = shm_object_name(name);
    // Never blocking on a FIFO nor following a link that a local user planted under the name.
    s.fd_ = internal::open_shm(obj, O_RDWR);
    if (!s.fd_) {
      const int err = errno;
      if (const auto planted = internal::planted_reason(obj); !planted.empty()) {
        throw internal::planted_error(planted, "choose another --name");
      }
      throw segment_open_error(name, err, std::strerror(err));
    }
    internal::check_shm_owner(s.fd_.get(), "watchdog segment '" + s.name_ + "'", "run as that user or choose another --name", obj);
    const auto until = std::chrono::steady_clock::now() + ready_timeout;
    for (;;) {
      if (s.file_size() >= sizeof(segment_header)) {
        if (s.base_ == nullptr) s.map();
        if (s.table().header().magic.load(std::memory_order_acquire) != 0) break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        throw error(errc::corrupt, "watchdog segment '" + s.name_ +
                                       "' was never initialized: its watchdog died while creating "
                                       "it; restart the watchdog");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    validate_segment(s.table().header(), s.name_, s.file_size(), s.size_);
    return s;
  }

  attached_segment(attached_segment&& o) noexcept
      : fd_(std::move(o.fd_)), base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)),
        name_(std::move(o.name_)) {}
  attached_segment& operator=(attached_segment&&) = delete;
  attached_segment(const attached_segment&) = delete;
  ~attached_segment() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }

  [[nodiscard]] table_view table() const noexcept { return table_view(base_); }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  attached_segment() = default;

  [[nodiscard]] std::uint64_t file_size() const {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw os_error("cannot stat watchdog segment '" + name_ + "'");
    return static_cast<std::uint64_t>(st.st_size);
  }

  // Maps the whole object as it is now: a watchdog sizes it before it publishes the magic.
  void map() {
    const auto bytes = static_cast<std::size_t>(file_size());
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED) throw os_error("cannot map watchdog segment '" + name_ + "'");
    base_ = p;
    size_ = bytes;
  }

  internal::unique_fd fd_;
  void* base_ = nullptr;
  std::size_t size_ = 0;
  std::string name_;
};

}  // namespace elastic::inline v1::timer::detail
