// Opening a file to append event lines to, as the event log (events.hpp) and the light warning
// route (warning_hook.hpp) both do: never through a symbolic link at its end, never waiting on a
// FIFO planted in its place, and only a regular file of this user with a single name. Light on
// purpose (no <filesystem>): a timer scope's header reaches it through the warning route.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <elastic/internal/unique_fd.hpp>

namespace elastic::inline v1::internal {

/// Why a file with status `st` is unsafe to append to or read for this process, or "" when it is
/// a regular file of this user with a single name (so not a planted hard link to another file).
inline std::string unsafe_file_reason(const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "it is not a regular file";
  if (st.st_uid != ::geteuid()) {
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " +
           std::to_string(::geteuid());
  }
  if (st.st_nlink > 1) return "it has " + std::to_string(st.st_nlink) + " names (a hard link to another file)";
  return {};
}

/// What open_for_append() found: an open descriptor, or why there is none.
struct append_open {
  unique_fd fd;             ///< open, in blocking append mode, when the file is safe
  int open_errno = 0;       ///< open() failed with this (ELOOP: a symbolic link; ENXIO: a FIFO)
  int stat_errno = 0;       ///< fstat() of the opened file failed with this
  std::string unsafe;       ///< unsafe_file_reason() of what was opened
};

/// Opens (creating with mode 0644) `path` for appending under the rule above.
inline append_open open_for_append(const char* path) {
  append_open r;
  int fd;
  // O_NONBLOCK: opening a FIFO planted in the file's place must fail (ENXIO), not wait forever
  // for a reader; it changes nothing for a regular file.
  do {
    fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    r.open_errno = errno;
    return r;
  }
  unique_fd out(fd);
  struct stat st {};
  if (::fstat(out.get(), &st) != 0) {
    r.stat_errno = errno;
    return r;
  }
  r.unsafe = unsafe_file_reason(st);
  if (!r.unsafe.empty()) return r;
  ::fcntl(out.get(), F_SETFL, O_APPEND);  // blocking again: a full disk must not drop half a line
  r.fd = std::move(out);
  return r;
}

}  // namespace elastic::inline v1::internal
