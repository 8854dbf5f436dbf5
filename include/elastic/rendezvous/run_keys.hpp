// Where a run lives in a store, so that many runs share one (an etcd serving a cluster): every
// key of run R is under `<key_prefix>/R/`, and while R has a live participant its registration
// `<key_prefix>/.runs/R` (leased) says so. A finished run's keys can be removed in one call.
//
// No run id can reach the registrations, nor a registration another run's keys: a run id never
// starts with '.' (valid_run_id) and never holds '/', so `<key_prefix>/R/` is never
// `<key_prefix>/.runs/`. (They were under `<key_prefix>/runs/`, which is the key prefix of a run
// named "runs": runs named "config" or "round" registered over its own keys, and removing its
// keys removed every registration.)
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::rendezvous {

/// Where every key of run `run_id` lives: `<key_prefix>/<run_id>` (no trailing slash).
inline std::string run_prefix(std::string_view key_prefix, std::string_view run_id) {
  return fmt::format("{}/{}", key_prefix, run_id);
}

/// The key that says participant `participant_id` of run `run_id` is alive (leased). Erasing it
/// retires the participant at once: the others see a departure at their next poll instead of
/// waiting out its heartbeat (elastic-run does so the moment it reaps a dead worker).
inline std::string alive_key(std::string_view key_prefix, std::string_view run_id, std::string_view participant_id) {
  return fmt::format("{}/alive/{}", run_prefix(key_prefix, run_id), participant_id);
}

/// The registration of run `run_id`: present (leased) while one of its participants lives.
inline std::string run_key(std::string_view key_prefix, std::string_view run_id) {
  return fmt::format("{}/.runs/{}", key_prefix, run_id);
}

/// The runs with a live participant in the store, by run id, in order.
inline std::vector<std::string> live_runs(store& s, std::string_view key_prefix) {
  const std::string from = run_key(key_prefix, "");
  std::vector<std::string> ids;
  for (auto& [k, v] : s.list(from)) ids.push_back(k.substr(from.size()));
  return ids;
}

/// Removes every key of run `run_id` (all of `<key_prefix>/<run_id>/`) once none of its
/// participants is alive, and returns how many; nothing while one still lives, for the last to
/// finish removes them. Call it when the run has finished (elastic-run does when every worker of
/// its host exited 0): a run that merely stopped (preempted, failed) keeps its keys, which its
/// next start goes on from.
inline std::optional<std::size_t> remove_finished_run(store& s, std::string_view key_prefix, std::string_view run_id) {
  const std::string prefix = run_prefix(key_prefix, run_id) + "/";
  if (!s.list(prefix + "alive/").empty()) return std::nullopt;
  return s.erase_prefix(prefix);
}

}  // namespace elastic::inline v1::rendezvous
