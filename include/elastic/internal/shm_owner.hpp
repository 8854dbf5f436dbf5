// The owner check every shared-memory object of ours passes before it is used: objects are
// created 0600, and one that another user made is refused, never written to. On its own so that
// a worker attaching to the watchdog needs neither Boost nor the sweeping helpers.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>

#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

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

}  // namespace elastic::inline v1::internal
