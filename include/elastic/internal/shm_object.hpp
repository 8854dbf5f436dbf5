// POSIX shared-memory objects as the watchdog segment and the shm:// store both use them:
// created with mode 0600 or opened if they exist, and refused when another user owns them or
// when what has the name is no shared-memory object at all (a FIFO, socket, device or link that
// a local user planted: see shm_owner.hpp).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <elastic/internal/shm_owner.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

/// Creates the object `obj` with mode 0600 or, if it exists, opens it; `created` says which.
/// The object can vanish between a failed create and the open: that race is retried. A name
/// that is not a regular file is refused unopened (errc::unsafe_path; `remedy` says what else
/// to do), since opening a device may block or act; the caller checks what it opened with
/// check_shm_owner(), which refuses one planted between this look and the open. Any other
/// failure is thrown as what `on_error(interprocess_exception)` returns.
template <class OnError>
boost::interprocess::shared_memory_object create_or_open_shm(const std::string& obj, bool& created, OnError&& on_error,
                                                             std::string_view remedy = "choose another name") {
  namespace bip = boost::interprocess;
  for (int attempt = 0;; ++attempt) {
    if (const auto planted = planted_reason(obj); !planted.empty()) throw planted_error(planted, remedy);
    try {
      bip::permissions perm;
      perm.set_permissions(0600);
      bip::shared_memory_object shm(bip::create_only, obj.c_str(), bip::read_write, perm);
      created = true;
      return shm;
    } catch (const bip::interprocess_exception& e) {
      if (e.get_native_error() != EEXIST) throw on_error(e);
    }
    try {
      bip::shared_memory_object shm(bip::open_only, obj.c_str(), bip::read_write);
      created = false;
      return shm;
    } catch (const bip::interprocess_exception& e) {
      // ENXIO (a socket) and ELOOP (a link) name what was planted meanwhile.
      if (const auto planted = planted_reason(obj); !planted.empty()) throw planted_error(planted, remedy);
      if (e.get_native_error() != ENOENT || attempt > 100) throw on_error(e);
    }
  }
}

/// The names under /dev/shm that some process on this host has mapped right now, read from
/// /proc/PID/maps (the kernel's account, which no process can forge). Processes whose maps we
/// may not read (another user's, without root) cannot map our 0600 objects either.
inline std::set<std::string> mapped_shm_names() {
  std::set<std::string> out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  constexpr std::string_view shm = "/dev/shm/";
  std::vector<char> buf(1 << 16);
  while (const dirent* d = ::readdir(proc)) {
    if (d->d_name[0] < '1' || d->d_name[0] > '9') continue;
    char path[300];
    std::snprintf(path, sizeof path, "/proc/%s/maps", d->d_name);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::string text;
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) text.append(buf.data(), static_cast<std::size_t>(n));
    ::close(fd);
    for (std::size_t at = text.find(shm); at != std::string::npos; at = text.find(shm, at + 1)) {
      const std::size_t end = text.find('\n', at);
      std::string_view name = std::string_view(text).substr(at + shm.size(), end == std::string::npos ? std::string::npos
                                                                                                        : end - at - shm.size());
      if (name.find(' ') != std::string_view::npos) continue;  // "NAME (deleted)": an older object, not the one linked now
      out.emplace(name);
    }
  }
  ::closedir(proc);
  return out;
}

/// Removes the shared-memory objects of this user whose names start with `prefix` and that
/// nothing uses any more: no process maps them, nobody holds their lock (a live watchdog or
/// launcher flocks its object), and they are older than `min_age` (a creator may be about to
/// map one). This is how objects of processes that were all SIGKILLed at once are reclaimed.
/// The object named `keep` (if any) is left alone: the caller is about to open it and checks it
/// itself. Names that are not regular files (a FIFO, socket, device or link any local user may
/// plant here) are never opened, only named in `planted` (planted_reason()'s words) when given.
/// Returns the names removed.
inline std::vector<std::string> sweep_stale_shm(std::string_view prefix, int min_age_s = 2, std::string_view keep = {},
                                                std::vector<std::string>* planted = nullptr) {
  std::vector<std::string> removed;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return removed;
  std::vector<std::string> candidates;
  while (const dirent* d = ::readdir(dir)) {
    const std::string_view name(d->d_name);
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix && name != keep) candidates.emplace_back(name);
  }
  ::closedir(dir);
  if (candidates.empty()) return removed;
  const auto mapped = mapped_shm_names();
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  for (const auto& name : candidates) {
    if (mapped.count(name) != 0) continue;
    const std::string path = "/dev/shm/" + name;
    // Never a device opened, nor a FIFO waited on, nor a link followed (open_shm).
    std::string reason;
    const unique_fd fd = open_shm(name, O_RDONLY);
    struct stat st {};
    if (!fd) {
      if (errno != ENOENT) reason = planted_reason(name);
    } else if (::fstat(fd.get(), &st) == 0) {
      reason = planted_reason(st, name);
      const bool ours = reason.empty() && st.st_uid == ::geteuid() && now.tv_sec - st.st_ctim.tv_sec >= min_age_s;
      // Unlink while holding the lock, so a watchdog or launcher cannot take it in between.
      if (ours && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0) removed.push_back(name);
    }
    if (!reason.empty() && planted != nullptr) planted->push_back(reason + ": left alone");
  }
  return removed;
}

}  // namespace elastic::inline v1::internal

