// Names a local user can plant in /dev/shm under the library's prefixes, to show that the tools
// never block on them, never read through them and never remove another user's: a FIFO (an open
// for reading waits for a writer forever), a unix socket, and, as root, a character device
// (/dev/null's numbers) and a symbolic link to /dev/zero. Each is made by another user where
// this process is root (as a stranger would), else by this process itself; and removed on
// destruction.
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/other_user.hpp"

namespace elastic::test {

enum class planted_kind { fifo, socket, device, symlink };

/// How messages name each kind (`file_kind` in internal/shm_owner.hpp), for the checks.
inline const char* planted_words(planted_kind k) {
  switch (k) {
    case planted_kind::fifo: return "a FIFO";
    case planted_kind::socket: return "a socket";
    case planted_kind::device: return "a character device";
    case planted_kind::symlink: return "a symbolic link";
  }
  return "";
}

/// The kinds this process can plant: devices and links to devices only as root.
inline std::vector<planted_kind> plantable_kinds() {
  std::vector<planted_kind> out{planted_kind::fifo, planted_kind::socket};
  if (::geteuid() == 0) {
    out.push_back(planted_kind::device);
    out.push_back(planted_kind::symlink);
  }
  return out;
}

/// /dev/shm/NAME made as `kind`, owned by the second user when there is one.
class planted_shm {
 public:
  planted_shm(std::string name, planted_kind kind) : name_(std::move(name)), path_("/dev/shm/" + name_) {
    ::unlink(path_.c_str());
    int rc = 0;
    switch (kind) {
      case planted_kind::fifo: rc = ::mkfifo(path_.c_str(), 0666); break;
      case planted_kind::socket: {
        sock_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        if (path_.size() >= sizeof a.sun_path) throw std::runtime_error("socket path too long: " + path_);
        std::memcpy(a.sun_path, path_.c_str(), path_.size() + 1);
        rc = sock_ < 0 ? -1 : ::bind(sock_, reinterpret_cast<const sockaddr*>(&a), sizeof a);
        if (rc == 0) rc = ::listen(sock_, 1);
        break;
      }
      case planted_kind::device: rc = ::mknod(path_.c_str(), S_IFCHR | 0666, ::makedev(1, 3)); break;
      case planted_kind::symlink: rc = ::symlink("/dev/zero", path_.c_str()); break;
    }
    if (rc != 0) throw std::runtime_error("cannot plant " + path_ + ": " + std::strerror(errno));
    if (const auto other = find_other_user()) {
      if (::lchown(path_.c_str(), other->uid, other->gid) != 0) throw std::runtime_error("cannot chown " + path_);
    }
  }
  planted_shm(const planted_shm&) = delete;
  planted_shm& operator=(const planted_shm&) = delete;
  ~planted_shm() {
    ::unlink(path_.c_str());
    if (sock_ >= 0) ::close(sock_);
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Still there, as it was planted (nobody removed or replaced it).
  [[nodiscard]] bool intact() const {
    struct stat st {};
    return ::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  }

 private:
  std::string name_, path_;
  int sock_ = -1;
};

}  // namespace elastic::test
