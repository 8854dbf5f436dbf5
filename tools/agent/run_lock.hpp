// What a launcher owns in /dev/shm, and the lock that makes one launcher the owner of a run.
//
// A launcher's default store (shm://elastic-RUN_ID) belongs to the one launcher that holds an
// exclusive flock on its object for its whole life: a second launcher of the same live run on
// this host is refused, with the first one's pid (read from /proc/locks, the kernel's account),
// and leaves the store alone. The kernel drops the lock however the holder dies, so a store whose
// lock is free is stale and may be replaced. No other name is made for the lock: nothing new is
// left in /dev/shm.
//
// Every name a launcher owns is held by an owned_shm from before it exists until it is removed,
// so that a constructor that throws half-way removes what it made, and so that the guardian
// (guardian.hpp) knows the name in case the launcher is SIGKILLed.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "guardian.hpp"
#include <elastic/internal/file.hpp>
#include <elastic/internal/shm_owner.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/shm_store.hpp>

namespace elastic::agent {

namespace detail {

/// "/dev/shm/NAME".
inline std::string shm_path(std::string_view object) { return "/dev/shm/" + std::string(object); }

/// A file as /proc/locks names it: "MAJ:MIN:INODE", the device numbers in hex.
struct lock_file_id {
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  unsigned long long ino = 0;
};

inline std::optional<lock_file_id> parse_lock_file_id(std::string_view text) {
  lock_file_id id;
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  auto field = [&](auto& value, int base, bool colon_after) {
    const auto r = std::from_chars(p, end, value, base);
    if (r.ec != std::errc() || r.ptr == p) return false;
    p = r.ptr;
    if (!colon_after) return true;
    if (p == end || *p != ':') return false;
    ++p;
    return true;
  };
  if (!field(id.dev_major, 16, true) || !field(id.dev_minor, 16, true) || !field(id.ino, 10, false)) return std::nullopt;
  return id;
}

/// The pid of the process holding a flock on the file open on `fd`, from /proc/locks; 0 when
/// none is listed.
inline pid_t flock_holder(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  std::ifstream in("/proc/locks");
  for (std::string line; std::getline(in, line);) {
    // "1: FLOCK  ADVISORY  WRITE 4242 00:1b:56789 0 EOF"; waiters have "->" after the number.
    std::istringstream words(line);
    std::string id, kind, advisory, mode, dev;
    long pid = 0;
    if (!(words >> id >> kind)) continue;
    if (kind == "->") continue;
    if (kind != "FLOCK" || !(words >> advisory >> mode >> pid >> dev)) continue;
    const auto file = parse_lock_file_id(dev);
    if (file && file->ino == st.st_ino && file->dev_major == major(st.st_dev) && file->dev_minor == minor(st.st_dev)) {
      return static_cast<pid_t>(pid);
    }
  }
  return 0;
}

/// The inode of /dev/shm/OBJECT as this process has it mapped (from /proc/self/maps), or 0.
inline unsigned long long mapped_inode(std::string_view object) {
  const std::string suffix = " " + shm_path(object);
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    if (line.size() < suffix.size() || line.compare(line.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    // "start-end perms offset dev inode path"
    std::istringstream words(line);
    std::string range, perms, offset, dev;
    unsigned long long ino = 0;
    if (words >> range >> perms >> offset >> dev >> ino) return ino;
  }
  return 0;
}

}  // namespace detail

/// A name under /dev/shm that this launcher owns: the guardian knows it from construction on,
/// and it is removed on destruction unless another process holds its lock (then it is not ours).
class owned_shm {
 public:
  owned_shm() = default;
  owned_shm(const owned_shm&) = delete;
  owned_shm& operator=(const owned_shm&) = delete;
  ~owned_shm() { remove(); }

  /// From now on `object` (the name under /dev/shm, "elastic-timer.NAME") is ours; the
  /// guardian `g` (may be null) is told before it exists.
  void own(std::string object, guardian* g) {
    remove();
    object_ = std::move(object);
    guardian_ = g;
    if (guardian_ != nullptr) guardian_->own(object_);
  }
  [[nodiscard]] const std::string& object() const noexcept { return object_; }
  [[nodiscard]] std::string path() const { return detail::shm_path(object_); }

  /// Takes `fd`, an open descriptor of the object holding its exclusive flock.
  void hold_lock(elastic::internal::unique_fd fd) noexcept { lock_ = std::move(fd); }
  [[nodiscard]] bool locked() const noexcept { return static_cast<bool>(lock_); }

  /// Not ours after all (another launcher holds it): forget it without removing it.
  void release() noexcept {
    if (guardian_ != nullptr && !object_.empty()) guardian_->disown(object_);
    object_.clear();
    lock_.reset();
  }

  /// Removes the object if it is ours (we hold its lock, or nobody does), then forgets it.
  void remove() noexcept {
    if (object_.empty()) return;
    try {
      const std::string p = path();
      if (lock_) {
        // Unlink first, unlock after: a launcher waiting for the lock finds the name gone.
        struct stat by_fd {}, by_name {};
        if (::fstat(lock_.get(), &by_fd) == 0 && ::stat(p.c_str(), &by_name) == 0 && by_fd.st_ino == by_name.st_ino &&
            by_fd.st_dev == by_name.st_dev) {
          ::unlink(p.c_str());
        }
      } else {
        // A FIFO planted under the name must not hold the launcher's end (open_shm).
        const auto fd = elastic::internal::open_shm(object_, O_RDONLY);
        struct stat st {};
        if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
            ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
          ::unlink(p.c_str());
        }
      }
    } catch (...) {
    }
    release();
  }

 private:
  std::string object_;
  guardian* guardian_ = nullptr;
  elastic::internal::unique_fd lock_;
};

/// Opens (creating) the shm store `name` as the run's owner: holds the flock on its object in
/// `owned` and returns the store. Throws errc::already_running, naming the holder's pid, when a
/// live launcher holds it; a stale store (lock free: its launcher died) is replaced.
inline std::unique_ptr<rendezvous::shm_store> open_owned_store(const std::string& name, owned_shm& owned,
                                                               std::string_view run_id) {
  const std::string path = owned.path();
  auto refuse = [&](int fd) -> error {
    const pid_t holder = detail::flock_holder(fd);
    owned.release();
    return error(errc::already_running,
                 fmt::format("run '{}' is already running on this host: {} holds its store {}. Wait for it to end "
                             "(or stop it), or give this run another --run-id",
                             run_id, holder > 0 ? fmt::format("elastic-run pid {}", holder) : "another elastic-run",
                             path));
  };
  for (int attempt = 0; attempt < 20; ++attempt) {
    {
      // A name that is no shared-memory object (a FIFO or device a local user planted) is
      // refused unopened, and never removed; the open neither blocks nor follows a link.
      if (const auto planted = elastic::internal::planted_reason(owned.object()); !planted.empty()) {
        owned.release();
        throw elastic::internal::planted_error(planted, "give this run another --run-id");
      }
      elastic::internal::unique_fd old = elastic::internal::open_shm(owned.object(), O_RDWR);
      struct stat st {};
      if (old && (::fstat(old.get(), &st) != 0 || !S_ISREG(st.st_mode))) old.reset();
      if (old) {
        if (::flock(old.get(), LOCK_EX | LOCK_NB) != 0) {
          if (errno == EWOULDBLOCK) throw refuse(old.get());
          throw os_error("cannot lock " + path);
        }
        // Nobody holds it: its launcher is gone. Start afresh (its workers, if any survived,
        // keep their mapping of the old one).
        ::unlink(path.c_str());
      }
    }
    auto store = std::make_unique<rendezvous::shm_store>(name);
    elastic::internal::unique_fd fd = elastic::internal::open_shm(owned.object(), O_RDWR);
    if (!fd) {
      if (errno == ENOENT) continue;  // removed under us (a stale-store cleanup): again
      throw os_error("cannot open " + path);
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) throw refuse(fd.get());  // another launcher won the race
      throw os_error("cannot lock " + path);
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw os_error("cannot stat " + path);
    // The lock must be on the object the store maps, not on one that replaced it meanwhile.
    if (detail::mapped_inode(owned.object()) != static_cast<unsigned long long>(st.st_ino)) continue;
    owned.hold_lock(std::move(fd));
    return store;
  }
  throw error(errc::timeout, fmt::format("could not take the store {} for run '{}': it kept being replaced; is "
                                         "another elastic-run of this run starting?",
                                         path, run_id));
}

}  // namespace elastic::agent
