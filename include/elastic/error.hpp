// The one exception type of the library, with a code a program can branch on and a message a
// person can act on.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace elastic {

/// What went wrong, independent of the part that noticed it.
enum class errc {
  invalid_argument = 1,  ///< a value given by the caller is out of range or malformed
  bad_name,              ///< a segment, store or run name with characters we refuse
  not_found,             ///< a segment, key, file or checkpoint that should exist does not
  already_running,       ///< another live process already serves this resource
  version_mismatch,      ///< data written by another layout or format version
  owner_mismatch,        ///< a resource created by another user
  corrupt,               ///< data that fails its magic number, size or checksum
  capacity_exhausted,    ///< a fixed-size table or budget is full
  timeout,               ///< a bounded wait ran out
  os_error,              ///< a system call failed; os_code() holds its errno
  mismatch,              ///< data that is valid but does not fit what the caller declared
  interrupted,           ///< a wait was cut short by a preemption notice (the process should exit 75)
  unsafe_path,           ///< a path another user could redirect (symlink, foreign or shared directory)
};

/// A short, stable name for a code (used in events and messages).
constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::bad_name: return "bad_name";
    case errc::not_found: return "not_found";
    case errc::already_running: return "already_running";
    case errc::version_mismatch: return "version_mismatch";
    case errc::owner_mismatch: return "owner_mismatch";
    case errc::corrupt: return "corrupt";
    case errc::capacity_exhausted: return "capacity_exhausted";
    case errc::timeout: return "timeout";
    case errc::os_error: return "os_error";
    case errc::mismatch: return "mismatch";
    case errc::interrupted: return "interrupted";
    case errc::unsafe_path: return "unsafe_path";
  }
  return "unknown";
}

/// Base of every exception the library throws.
///
/// `code()` says what kind of failure it was; `os_code()` keeps the errno of a failed system
/// call (empty otherwise); `what()` says what happened, the value that was wrong and what to do.
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& message, std::error_code os_code = {})
      : std::runtime_error(compose(code, message, os_code)), code_(code), os_code_(os_code) {}

  [[nodiscard]] errc code() const noexcept { return code_; }
  [[nodiscard]] std::error_code os_code() const noexcept { return os_code_; }

 private:
  static std::string compose(errc code, const std::string& message, std::error_code os_code) {
    std::string s = "elastic: ";
    s += message;
    if (os_code) {
      s += " (";
      s += os_code.message();
      s += ")";
    }
    s += " [";
    s += to_string(code);
    s += "]";
    return s;
  }

  errc code_;
  std::error_code os_code_;
};

/// An error for a failed system call: captures `errno` at the point of the call.
inline error os_error(const std::string& what, int err = errno) {
  return error(errc::os_error, what, std::error_code(err, std::generic_category()));
}

}  // namespace elastic
