// Turning whatever a checkpointer's background thread caught into an elastic::error, the only
// exception the library lets reach its caller.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// `e` as an elastic::error: nothing else may reach the caller (a std::filesystem_error
/// rethrown by wait_durable() once ended a finished run in std::terminate).
inline std::exception_ptr as_library_error(std::exception_ptr e, std::string_view doing) {
  try {
    std::rethrow_exception(e);
  } catch (const error&) {
    return e;
  } catch (const std::system_error& x) {  // std::filesystem_error among them
    return std::make_exception_ptr(error(errc::os_error, fmt::format("{}: {}", doing, x.what()), x.code()));
  } catch (const std::bad_alloc&) {
    return std::make_exception_ptr(error(errc::capacity_exhausted, fmt::format("{}: out of memory", doing)));
  } catch (const std::exception& x) {
    return std::make_exception_ptr(error(errc::os_error, fmt::format("{}: unexpected failure: {}", doing, x.what())));
  } catch (...) {
    return std::make_exception_ptr(error(errc::os_error, fmt::format("{}: unexpected failure", doing)));
  }
}

}  // namespace elastic::inline v1::checkpoint::detail
