// Files the checkpoint writer can trust: an owned descriptor, whole writes and reads that retry
// on EINTR and short counts, fsync of files and of the directories that name them.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <elastic/error.hpp>

namespace elastic::detail {

/// An owned file descriptor; closes on destruction.
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// Opens `path`, throwing an os_error that names the file and what we were doing.
inline unique_fd open_file(const std::filesystem::path& path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw os_error("cannot open " + path.string());
  return unique_fd(fd);
}

/// Writes all of `data` at `offset`; ENOSPC and EIO surface as os_error naming the file.
inline void pwrite_all(int fd, const void* data, std::size_t n, std::uint64_t offset,
                       const std::filesystem::path& what) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw os_error("cannot write " + what.string());
    }
    if (w == 0) throw os_error("cannot write " + what.string(), EIO);
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

/// Reads exactly `n` bytes at `offset`; a file that ends first is reported as corrupt.
inline void pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
                      const std::filesystem::path& what) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw os_error("cannot read " + what.string());
    }
    if (r == 0) {
      throw error(errc::corrupt, what.string() + " ends at byte " + std::to_string(offset) +
                                     ", before the data its manifest describes (truncated?)");
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

/// Writes all of `data` to a pipe, terminal or log, retrying short writes and EINTR; gives up
/// quietly on an error (a closed console must not stop the launcher that keeps the logs).
inline void write_all_best_effort(int fd, std::string_view data) noexcept {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

inline void fsync_fd(int fd, const std::filesystem::path& what) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) throw os_error("cannot fsync " + what.string());
  }
}

/// Makes the names in a directory durable (a rename or create is not, until this returns).
inline void fsync_dir(const std::filesystem::path& dir) {
  auto fd = open_file(dir, O_RDONLY | O_DIRECTORY);
  fsync_fd(fd.get(), dir);
}

/// Reads a whole small file (a manifest) into a string.
inline std::string read_small_file(const std::filesystem::path& path, std::size_t limit = 256u << 20) {
  auto fd = open_file(path, O_RDONLY);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw os_error("cannot stat " + path.string());
  if (static_cast<std::uint64_t>(st.st_size) > limit) {
    throw error(errc::corrupt, path.string() + " is " + std::to_string(st.st_size) +
                                   " bytes, more than a manifest can be");
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  pread_all(fd.get(), out.data(), out.size(), 0, path);
  return out;
}

/// Writes `content` to `path` durably and atomically: a temporary file, fsync, rename, fsync of
/// the directory. Readers see the old file or the whole new one, never a torn one.
inline void write_file_atomic(const std::filesystem::path& path, std::string_view content) {
  const auto tmp = path.parent_path() / (".tmp." + path.filename().string());
  {
    auto fd = open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    pwrite_all(fd.get(), content.data(), content.size(), 0, tmp);
    fsync_fd(fd.get(), tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw os_error("cannot rename " + tmp.string() + " to " + path.string());
  fsync_dir(path.parent_path());
}

}  // namespace elastic::detail
