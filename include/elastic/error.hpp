// The one exception type of the library, with a code a program can branch on and a message a
// person can act on.
#pragma once

#include <cerrno>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace elastic::inline v1 {

/// What went wrong, independent of the part that noticed it. Each code means one thing; the
/// values are stable (new codes go at the end) because they travel in std::error_code.
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
  peer_lost,             ///< a peer of a collective or group died, or its connection broke
  aborted,               ///< an operation on a communicator that was aborted or revoked
  not_supported,         ///< a feature not compiled in, or not offered by the runtime library found
  unavailable,           ///< a store or service that cannot be reached now (retrying later may work)
  device_error,          ///< a CUDA call failed (the device, its driver or its memory)
  run_finished,          ///< the run to join already finished: its last step is durable, nothing is left to do
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
    case errc::peer_lost: return "peer_lost";
    case errc::aborted: return "aborted";
    case errc::not_supported: return "not_supported";
    case errc::unavailable: return "unavailable";
    case errc::device_error: return "device_error";
    case errc::run_finished: return "run_finished";
  }
  return "unknown";
}

namespace errors_internal {

/// A sentence describing a code, for std::error_code::message().
constexpr std::string_view describe(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument: return "a value given by the caller is out of range or malformed";
    case errc::bad_name: return "a name holds characters that are refused";
    case errc::not_found: return "something that should exist does not";
    case errc::already_running: return "another live process already serves this resource";
    case errc::version_mismatch: return "data written by another layout or format version";
    case errc::owner_mismatch: return "a resource created by another user";
    case errc::corrupt: return "data fails its magic number, size or checksum";
    case errc::capacity_exhausted: return "a fixed-size table or budget is full";
    case errc::timeout: return "a bounded wait ran out";
    case errc::os_error: return "a system call failed";
    case errc::mismatch: return "data is valid but does not fit what the caller declared";
    case errc::interrupted: return "a wait was cut short by a preemption notice";
    case errc::unsafe_path: return "a path another user could redirect";
    case errc::peer_lost: return "a peer died or its connection broke";
    case errc::aborted: return "the communicator was aborted or revoked";
    case errc::not_supported: return "not compiled in, or not supported by the runtime library found";
    case errc::unavailable: return "a store or service cannot be reached now";
    case errc::device_error: return "a CUDA call failed";
    case errc::run_finished: return "the run already finished";
  }
  return "unknown elastic error";
}

class category final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "elastic"; }
  [[nodiscard]] std::string message(int value) const override {
    return std::string(describe(static_cast<errc>(value)));
  }
};

}  // namespace errors_internal

/// The category of elastic::errc in std::error_code (name "elastic"); one object per process.
inline const std::error_category& error_category() noexcept {
  static const errors_internal::category c;
  return c;
}

/// Lets `std::error_code ec = errc::timeout;` work (found by argument-dependent lookup).
inline std::error_code make_error_code(errc code) noexcept {
  return {static_cast<int>(code), error_category()};
}

}  // namespace elastic::inline v1

template <>
struct std::is_error_code_enum<elastic::errc> : std::true_type {};

namespace elastic::inline v1 {

/// Base of every exception the library throws.
///
/// `code()` says what kind of failure it was (`error_code()` is the same as a std::error_code);
/// `os_code()` keeps the errno of a failed system call (empty otherwise); `message()` is the
/// thrower's text alone, to quote in another error; `what()` decorates it for a person:
/// "elastic: MESSAGE (OS REASON) [code]".
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& message, std::error_code os_code = {})
      : std::runtime_error(compose(code, message, os_code)),
        code_(code),
        os_code_(os_code),
        message_size_(message.size()) {}

  [[nodiscard]] errc code() const noexcept { return code_; }
  [[nodiscard]] std::error_code error_code() const noexcept { return make_error_code(code_); }
  [[nodiscard]] std::error_code os_code() const noexcept { return os_code_; }
  /// The text the thrower gave, without the prefix, the OS reason or the code.
  [[nodiscard]] std::string message() const { return std::string(what() + prefix.size(), message_size_); }

 private:
  // what() starts with this; message() is the span after it, so copying an error stays noexcept.
  static constexpr std::string_view prefix = "elastic: ";

  static std::string compose(errc code, const std::string& message, std::error_code os_code) {
    std::string s(prefix);
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
  std::size_t message_size_;
};

/// An error for a failed system call: captures `errno` at the point of the call.
inline error os_error(const std::string& what, int err = errno) {
  return error(errc::os_error, what, std::error_code(err, std::generic_category()));
}

}  // namespace elastic::inline v1
