// A second, real user for the tests where permissions matter (a directory another user owns, a
// planted symbolic link, a trainer that may not read its checkpoint directory). Root makes it with
// useradd the first time it is needed; without root those tests are skipped (exit 77, which CTest
// reports as skipped, not passed).
#pragma once

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace elastic::test {

struct other_user {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

/// Ends the test process as skipped (CTest's SKIP_RETURN_CODE 77), saying why.
[[noreturn]] inline void skip_test(const std::string& why) {
  std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(77);
}

/// The user "elastic-test-other" (made when missing), or nothing when this process is not root
/// or the user cannot be made.
inline std::optional<other_user> find_other_user() {
  if (::geteuid() != 0) return std::nullopt;
  constexpr const char* name = "elastic-test-other";
  if (::getpwnam(name) == nullptr) {
    // Tests run in parallel: one useradd at a time.
    const int lock = ::open("/tmp/elastic-test-useradd.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    if (::getpwnam(name) == nullptr) {
      [[maybe_unused]] const int rc =
          std::system("useradd --system --no-create-home --shell /usr/sbin/nologin elastic-test-other >/dev/null 2>&1");
    }
    if (lock >= 0) ::close(lock);
  }
  const passwd* pw = ::getpwnam(name);
  if (pw == nullptr) return std::nullopt;
  return other_user{name, pw->pw_uid, pw->pw_gid};
}

/// The second user, or the test ends as skipped.
inline other_user require_other_user() {
  auto u = find_other_user();
  if (!u) skip_test(::geteuid() != 0 ? "needs root to act as a second user" : "cannot create the second user");
  return *u;
}

}  // namespace elastic::test
