// Files the checkpoint writer can trust: whole writes and reads that retry
// on EINTR and short counts, fsync of files and of the directories that name them, and reads
// relative to a directory descriptor that never follow a symbolic link.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <elastic/internal/unique_fd.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

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

/// Opens the directory `name` inside the directory `at` for reading, never through a symbolic
/// link (errc::unsafe_path). ENOENT and every other failure are os_errors naming `shown`.
inline unique_fd open_dir_at(int at, const std::string& name, const std::filesystem::path& shown) {
  int fd;
  do {
    fd = ::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    // O_NOFOLLOW with O_DIRECTORY reports a symbolic link as ENOTDIR.
    if (::fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
      throw error(errc::unsafe_path, shown.string() + " is a symbolic link: elastic never reads through one it did not "
                                                      "make; remove it");
    }
    throw os_error("cannot open directory " + shown.string(), err);
  }
  return unique_fd(fd);
}

/// Opens the file `name` inside the directory `at` for reading. A symbolic link is refused
/// (errc::unsafe_path) and so is anything but a regular file (a FIFO would block the reader;
/// errc::corrupt): a planted name is never read through.
inline unique_fd open_regular_at(int at, const std::string& name, const std::filesystem::path& shown) {
  int fd;
  do {
    fd = ::openat(at, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ELOOP) {
      throw error(errc::unsafe_path, shown.string() + " is a symbolic link: elastic never reads through one it did not "
                                                      "make; remove it");
    }
    throw os_error("cannot open " + shown.string());
  }
  unique_fd out(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw os_error("cannot stat " + shown.string());
  if (!S_ISREG(st.st_mode)) throw error(errc::corrupt, shown.string() + " is not a regular file: elastic did not write it");
  return out;
}

/// Reads the whole small file `name` inside the directory `at` (a manifest) without following
/// a link; see open_regular_at.
inline std::string read_small_file_at(int at, const std::string& name, const std::filesystem::path& shown,
                                      std::size_t limit = 256u << 20) {
  auto fd = open_regular_at(at, name, shown);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw os_error("cannot stat " + shown.string());
  if (static_cast<std::uint64_t>(st.st_size) > limit) {
    throw error(errc::corrupt, shown.string() + " is " + std::to_string(st.st_size) + " bytes, more than a manifest can be");
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  pread_all(fd.get(), out.data(), out.size(), 0, shown);
  return out;
}

/// The names in the directory `at` (without "." and ".."), read through a descriptor of its
/// own so that `at` keeps its offset. Failures are os_errors naming `shown`.
inline std::vector<std::string> list_dir_at(int at, const std::filesystem::path& shown) {
  int fd;
  do {
    fd = ::openat(at, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw os_error("cannot read directory " + shown.string());
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    throw os_error("cannot read directory " + shown.string(), err);
  }
  const std::unique_ptr<DIR, int (*)(DIR*)> owned(d, ::closedir);
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) throw os_error("cannot read directory " + shown.string());
      return names;
    }
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
}

/// Removes `name` inside the directory `at` and, when it is a directory, everything in it,
/// never following a symbolic link (a link is removed, not its target). Absent is not an
/// error. A directory of ours that we may not read or search (mode 000) is opened up first.
inline void remove_tree_at(int at, const std::string& name, const std::filesystem::path& shown, int depth = 0) {
  struct stat st {};
  if (::fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    throw os_error("cannot remove " + shown.string());
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(at, name.c_str(), 0) != 0 && errno != ENOENT) throw os_error("cannot remove " + shown.string());
    return;
  }
  if (depth > 16) throw error(errc::invalid_argument, "not removing " + shown.string() + ": nested too deep");
  int fd;
  do {
    fd = ::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno == EACCES && st.st_uid == ::geteuid() && ::fchmodat(at, name.c_str(), 0700, 0) == 0) {
    fd = ::openat(at, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) {
    if (errno == ENOENT) return;
    throw os_error("cannot open directory " + shown.string() + " to remove it");
  }
  const unique_fd dir(fd);
  for (const auto& n : list_dir_at(dir.get(), shown)) remove_tree_at(dir.get(), n, shown / n, depth + 1);
  if (::unlinkat(at, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) throw os_error("cannot remove " + shown.string());
}

}  // namespace elastic::inline v1::internal
