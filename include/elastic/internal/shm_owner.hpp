// The checks every shared-memory object of ours passes before it is used, and the one way to
// open a name under /dev/shm that another user may have planted. /dev/shm is writable by every
// local user: a FIFO there would make an open for reading wait forever for a writer, a device
// or a link would have us read what is not ours. So a name is opened without blocking and
// without following a link, and what was opened is used only when it is a regular file of this
// user. Objects are created 0600; one that another user made is refused, never written to. On
// its own so that a worker attaching to the watchdog needs neither Boost nor the sweeping helpers.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include <elastic/error.hpp>
#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::internal {

/// What a file of mode `mode` is, in words ("a FIFO"), for messages.
inline std::string_view file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

/// Why the file with status `st` at /dev/shm/`object` cannot be a shared-memory object of ours
/// ("/dev/shm/X is a FIFO (uid 1001), not a shared-memory object"), or "" when it is a regular
/// file. The owner is checked apart (check_shm_owner), with its own code.
inline std::string planted_reason(const struct stat& st, std::string_view object) {
  if (S_ISREG(st.st_mode)) return {};
  return "/dev/shm/" + std::string(object) + " is " + std::string(file_kind(st.st_mode)) + " (uid " +
         std::to_string(st.st_uid) + "), not a shared-memory object";
}

/// planted_reason() of the name /dev/shm/`object` as it is now (never following a link); ""
/// when it is a regular file or absent.
inline std::string planted_reason(std::string_view object) {
  struct stat st {};
  std::string path = "/dev/shm/";
  path += object;
  if (::lstat(path.c_str(), &st) != 0) return {};
  return planted_reason(st, object);
}

/// The refusal of a planted name, `reason` being planted_reason()'s; `remedy` says what else to do.
inline error planted_error(const std::string& reason, std::string_view remedy) {
  return error(errc::unsafe_path, reason + ": elastic did not make it and does not use it; remove it if nobody "
                                           "should have put it there, or " + std::string(remedy));
}

/// Throws errc::unsafe_path unless the object open on `fd` is a regular file (not a FIFO,
/// socket or device planted under our name), then errc::owner_mismatch unless it belongs to
/// this process's effective uid. `what` names it ("watchdog segment 'x'"), `object` is its name
/// under /dev/shm, `remedy` says what to do instead.
inline void check_shm_owner(int fd, const std::string& what, std::string_view remedy, std::string_view object = {}) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw os_error("cannot stat " + what);
  if (!S_ISREG(st.st_mode)) {
    throw planted_error(object.empty() ? what + " is " + std::string(file_kind(st.st_mode)) : planted_reason(st, object),
                        remedy);
  }
  if (st.st_uid != ::geteuid()) {
    throw error(errc::owner_mismatch, what + " belongs to uid " + std::to_string(st.st_uid) +
                                          ", not to this process's uid " + std::to_string(::geteuid()) + ": " +
                                          std::string(remedy));
  }
}

/// Opens the existing /dev/shm/`object` with `flags` (O_RDONLY or O_RDWR) as planted names
/// require: a name that is not a regular file is not opened at all (a device may act on an open;
/// -1 with errno ENXIO), and the open is O_NONBLOCK (a FIFO swapped in meanwhile opens at once
/// instead of waiting for a writer) and O_NOFOLLOW (a link fails with ELOOP). Returns -1 with
/// errno set as shm_open() does otherwise. The caller checks what it got with check_shm_owner(),
/// and names a failure other than ENOENT with planted_reason(object). O_NONBLOCK is cleared
/// again: it means nothing to a regular file.
inline unique_fd open_shm(std::string_view object, int flags) {
  if (!planted_reason(object).empty()) {
    errno = ENXIO;
    return unique_fd();
  }
  // Appended, not "/" + name: GCC 12 warns of a false overlap (-Wrestrict) at -O2 for that.
  std::string path(1, '/');
  path += object;
  int fd;
  do {
    fd = ::shm_open(path.c_str(), flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return unique_fd(fd);
}

}  // namespace elastic::inline v1::internal
