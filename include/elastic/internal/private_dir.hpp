// Directories that elastic writes into (checkpoints, worker logs, events) and that no other user
// can redirect: a root launcher or trainer must never be made to append to, create or truncate a
// file of someone else's choosing through a planted symbolic link or a pre-created directory.
//
// The rule, checked when a directory is opened and on every file made in it:
//   - a symbolic link on the way to it is followed only when it belongs to this user or root;
//   - the directory belongs to this user or root, and no other user can write to it (no group
//     or other write bit, unless the sticky bit keeps others from renaming our entries);
//   - files are opened relative to the directory's descriptor with O_NOFOLLOW, and a file we
//     append to or read must be a regular file of ours with a single name (no planted hard link).
// A directory that fails is an errc::unsafe_path error that names it and says why.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include <elastic/internal/append_file.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

/// Why a directory with status `st` is unsafe to write into for this process, or "" when it is
/// safe: owned by us or root, and writable by nobody else (unless sticky).
inline std::string unsafe_dir_reason(const struct stat& st) {
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " + std::to_string(me) +
           " (or root)";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("other users can write to it (mode ") + mode + ", no sticky bit)";
  }
  return {};
}

/// Throws errc::unsafe_path ("refusing to <doing> <shown>: why; remove it") unless the file open
/// on `fd` passes unsafe_file_reason().
inline void check_own_file(int fd, const std::filesystem::path& shown, std::string_view doing = "write") {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw os_error("cannot stat " + shown.string());
  if (auto why = unsafe_file_reason(st); !why.empty()) {
    throw error(errc::unsafe_path, "refusing to " + std::string(doing) + " " + shown.string() + ": " + why + "; remove it");
  }
}

/// Symbolic links on the way to `path` are followed only when they are ours or root's: one
/// planted by another user in a shared directory (/tmp) is refused with errc::unsafe_path.
inline void check_path_links(const std::filesystem::path& path) {
  std::filesystem::path prefix;
  for (const auto& part : path) {
    prefix /= part;
    if (part == "/" || part.empty()) continue;
    struct stat st {};
    if (::lstat(prefix.c_str(), &st) != 0) return;  // the rest does not exist yet
    if (S_ISLNK(st.st_mode) && st.st_uid != ::geteuid() && st.st_uid != 0) {
      throw error(errc::unsafe_path, "refusing " + path.string() + ": " + prefix.string() +
                                         " is a symbolic link of uid " + std::to_string(st.st_uid) +
                                         ", another user, who could point it anywhere");
    }
  }
}

/// An open directory that passed the rule above; files are made in it by name, never by path.
class private_dir {
 public:
  private_dir() = default;

  /// Opens `path`, creating missing directories (mode 0755) when `create` is set. Throws
  /// errc::unsafe_path when the rule is broken, errc::not_found when it does not exist and
  /// `create` is false, errc::os_error for any other failure; each names the path.
  static private_dir open(const std::filesystem::path& path, bool create = true) {
    if (path.empty()) throw error(errc::invalid_argument, "no directory given");
    check_path_links(path);
    if (create) make_parents(path);
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) fail_open(path, errno);
    private_dir d(unique_fd(fd), path);
    d.check_self();
    return d;
  }

  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }
  /// The path of `name` inside, for messages.
  [[nodiscard]] std::filesystem::path operator/(std::string_view name) const { return path_ / std::string(name); }

  /// Opens (creating when `create`, mode 0755) the subdirectory `name` (one component, not a
  /// symbolic link), which must pass the rule too.
  [[nodiscard]] private_dir subdir(std::string_view name, bool create = true) const {
    const auto shown = *this / name;
    if (create && ::mkdirat(fd(), std::string(name).c_str(), 0755) != 0 && errno != EEXIST) {
      throw os_error("cannot create directory " + shown.string());
    }
    int fd;
    do {
      fd = ::openat(this->fd(), std::string(name).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      const int err = errno;
      struct stat st {};
      // O_NOFOLLOW with O_DIRECTORY reports a symbolic link as ENOTDIR.
      const bool link = ::fstatat(this->fd(), std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
      fail_open(shown, link ? ELOOP : err);
    }
    private_dir d(unique_fd(fd), shown);
    d.check_self();
    return d;
  }

  /// Opens the file `name` inside with `flags` (O_NOFOLLOW added). When the file may already
  /// exist (no O_EXCL), it must be a regular file of this user with one link, or this throws
  /// errc::unsafe_path: a planted link is never written through.
  [[nodiscard]] unique_fd open_file(std::string_view name, int flags, mode_t mode = 0644) const {
    const auto shown = *this / name;
    int fd;
    do {
      fd = ::openat(this->fd(), std::string(name).c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (errno == ELOOP) {
        throw error(errc::unsafe_path, shown.string() + " is a symbolic link: elastic never writes through one; "
                                                        "remove it");
      }
      throw os_error("cannot open " + shown.string());
    }
    unique_fd out(fd);
    if ((flags & O_EXCL) == 0) check_own_file(out.get(), shown);
    return out;
  }

  /// Creates `name` afresh for writing: whatever is there (a leftover of a crashed writer of
  /// ours) is removed first, then the file is made with O_EXCL, so nothing existing is written.
  [[nodiscard]] unique_fd create_file(std::string_view name, mode_t mode = 0644) const {
    remove_file(name);
    return open_file(name, O_WRONLY | O_CREAT | O_EXCL, mode);
  }

  /// Removes the file (or symbolic link) `name`; nothing when it is absent.
  void remove_file(std::string_view name) const {
    if (::unlinkat(fd(), std::string(name).c_str(), 0) != 0 && errno != ENOENT) {
      throw os_error("cannot remove " + (*this / name).string());
    }
  }

  /// Makes the names in this directory durable.
  void sync() const { fsync_fd(fd(), path_); }

  /// Replaces `name` with `content` durably and atomically: a fresh temporary file of this
  /// process (never an existing one), fsync, renameat, fsync of this directory. Readers see the
  /// old file or the whole new one.
  void write_atomic(const std::string& name, std::string_view content) const {
    write_atomic_kept(name, content, [](int) {});
  }

  /// As write_atomic, and returns the new file, still open for writing; `before_rename` is
  /// called with its descriptor before the file appears under `name` (to take a lock that no
  /// reader of `name` may find missing).
  template <class F>
  unique_fd write_atomic_kept(const std::string& name, std::string_view content, F&& before_rename) const {
    const std::string tmp = ".tmp." + name + "." + std::to_string(::getpid());
    auto fd = create_file(tmp);
    pwrite_all(fd.get(), content.data(), content.size(), 0, *this / tmp);
    fsync_fd(fd.get(), *this / tmp);
    before_rename(fd.get());
    if (::renameat(this->fd(), tmp.c_str(), this->fd(), name.c_str()) != 0) {
      throw os_error("cannot rename " + (*this / tmp).string() + " to " + (*this / name).string());
    }
    sync();
    return fd;
  }

 private:
  private_dir(unique_fd fd, std::filesystem::path path) : fd_(std::move(fd)), path_(std::move(path)) {}

  void check_self() const {
    struct stat st {};
    if (::fstat(fd(), &st) != 0) throw os_error("cannot stat " + path_.string());
    if (auto why = unsafe_dir_reason(st); !why.empty()) {
      throw error(errc::unsafe_path, "refusing to write into " + path_.string() + ": " + why +
                                         "; use a directory of your own that only you can write to");
    }
  }

  [[noreturn]] static void fail_open(const std::filesystem::path& p, int err) {
    if (err == ELOOP) {
      throw error(errc::unsafe_path, p.string() + " is a symbolic link: elastic never writes through one it did "
                                                  "not expect; point at the real directory");
    }
    if (err == ENOENT) throw error(errc::not_found, "directory " + p.string() + " does not exist");
    if (err == ENOTDIR) {
      throw error(errc::os_error, p.string() + " is not a directory", std::error_code(err, std::generic_category()));
    }
    throw os_error("cannot open directory " + p.string(), err);
  }

  static void make_parents(const std::filesystem::path& path) {
    std::filesystem::path prefix;
    for (const auto& part : path) {
      prefix /= part;
      if (part == "/" || part.empty() || part == "." || part == "..") continue;
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        throw os_error("cannot create directory " + prefix.string());
      }
    }
  }

  unique_fd fd_;
  std::filesystem::path path_;
};

}  // namespace elastic::inline v1::internal
