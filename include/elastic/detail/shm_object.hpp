// POSIX shared-memory objects as the watchdog segment and the shm:// store both use them:
// created with mode 0600 or opened if they exist, and refused when another user owns them.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include <elastic/error.hpp>

namespace elastic::detail {

/// Creates the object `obj` with mode 0600 or, if it exists, opens it; `created` says which.
/// The object can vanish between a failed create and the open: that race is retried. Any other
/// failure is thrown as what `on_error(interprocess_exception)` returns.
template <class OnError>
boost::interprocess::shared_memory_object create_or_open_shm(const std::string& obj, bool& created, OnError&& on_error) {
  namespace bip = boost::interprocess;
  for (int attempt = 0;; ++attempt) {
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
      if (e.get_native_error() != ENOENT || attempt > 100) throw on_error(e);
    }
  }
}

/// Throws errc::owner_mismatch unless the object open on `fd` belongs to this process's
/// effective uid. `what` names it ("watchdog segment 'x'"), `remedy` says what to do instead.
inline void check_shm_owner(int fd, const std::string& what, std::string_view remedy) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw os_error("cannot stat " + what);
  if (st.st_uid != ::geteuid()) {
    throw error(errc::owner_mismatch, what + " belongs to uid " + std::to_string(st.st_uid) +
                                          ", not to this process's uid " + std::to_string(::geteuid()) + ": " +
                                          std::string(remedy));
  }
}

}  // namespace elastic::detail
