// What a run id may be: it names a directory under --log-dir, the run's shm:// store and its keys
// in a shared store, so it is a plain name, never a path. And where one comes from when the
// command line names none.
#pragma once

#include <random>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/rendezvous.hpp>

namespace elastic::agent::detail {

/// Why `id` is not a run id, or "" when it is one: 1 to 64 characters of A-Z a-z 0-9 . _ -,
/// not starting with '.' or '-' (so never ".", ".." or a path: it names a directory).
inline std::string run_id_problem(std::string_view id) {
  if (rendezvous::detail::valid_run_id(id)) return {};
  return fmt::format("'{}' is not a run id: use 1 to 64 characters of A-Z a-z 0-9 . _ -, not starting with '.' or "
                     "'-' (it names a directory under --log-dir and the run's store)",
                     elastic::internal::printable(id));
}

/// Throws errc::invalid_argument unless `id` is a plain name (see run_id_problem); `where` says
/// where it came from ("ELASTIC_RUN_ID").
inline void check_run_id(std::string_view id, std::string_view where) {
  if (auto why = run_id_problem(id); !why.empty()) throw error(errc::invalid_argument, fmt::format("{} {}", where, why));
}

/// "run-" and 8 random hex digits, for a run started with no id.
inline std::string random_run_id() {
  std::random_device rd;
  return fmt::format("run-{:08x}", rd());
}

}  // namespace elastic::agent::detail
