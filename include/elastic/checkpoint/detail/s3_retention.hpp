// Retiring checkpoint steps in object storage (s3_steps.hpp has the layout): older steps
// deleted manifest first, leftovers of interrupted writes and uploads swept, unreadable steps
// moved aside. Needs libcurl (elastic::s3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <elastic/checkpoint/detail/retention.hpp>
#include <elastic/checkpoint/detail/s3_steps.hpp>
#include <elastic/checkpoint/format.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>

namespace elastic::inline v1::checkpoint::detail::objects {

/// Moves step `step`'s manifest to corrupt-step-N/ (with why) so that it no longer shadows the
/// good steps; its parts stay.
inline void quarantine_step(object_dir& dir, std::uint64_t step, const std::string& why, const event_log& events = {}) {
  auto& c = dir.client();
  const std::string from = object_dir::manifest_name(step);
  const std::string to = format::quarantine_dir_name(step) + "/";
  if (!c.size_of(from)) return;  // someone else moved it
  c.copy(from, to + std::string(format::step_manifest_name));
  c.put(to + "reason.txt", why + "\n");
  c.erase(from);
  events.emit("checkpoint_quarantined", {{"step", step}, {"dir", dir.url_of(to)}, {"reason", why}});
}

/// storage::retain for object storage: keeps the newest `keep_last` committed steps and every
/// step at or after `floor`; deletes an older step's manifest, then its objects; sweeps the
/// objects and open multipart uploads of uncommitted steps at or below the newest step kept
/// (never those of a quarantined step). Everything that can be done is done; the first failure
/// is thrown at the end.
inline void retain(object_dir& dir, std::size_t keep_last, std::optional<std::uint64_t> floor,
                   const event_log& events = {}) {
  keep_last = std::max<std::size_t>(keep_last, 1);
  auto& c = dir.client();
  storage::every_step steps;
  auto attempt = [&](auto&& f) { steps.attempt(f); };
  const auto listing = c.list();
  const auto committed = list_steps(listing);
  std::set<std::uint64_t> kept(committed.begin(), committed.begin() + static_cast<std::ptrdiff_t>(std::min(keep_last, committed.size())));
  std::set<std::uint64_t> quarantined;
  std::map<std::uint64_t, std::vector<std::string>> objects;  // of each step-N/ folder
  for (const auto& o : listing) {
    const auto slash = o.name.find('/');
    if (slash == std::string::npos) continue;
    const std::string_view top = std::string_view(o.name).substr(0, slash);
    if (top.starts_with("corrupt-")) {
      if (const auto s = format::parse_step_dir(top.substr(top.find("step-")).substr(0, 17))) quarantined.insert(*s);
    } else if (const auto s = format::parse_step_dir(top)) {
      objects[*s].push_back(o.name);
    }
  }
  for (const auto step : committed) {
    if (kept.contains(step) || (floor && step >= *floor)) continue;
    attempt([&] {
      c.erase(object_dir::manifest_name(step));  // invisible from here on, whatever happens next
      events.emit("checkpoint_removed", {{"step", step}});
      for (const auto& name : objects[step]) c.erase(name);
    });
    objects.erase(step);
  }
  std::optional<std::uint64_t> newest = floor;
  if (!committed.empty() && (!newest || committed.front() > *newest)) newest = committed.front();
  if (!newest) {
    steps.finish();
    return;
  }
  const std::set<std::uint64_t> live(committed.begin(), committed.end());
  for (const auto& leftover : objects) {  // not a structured binding: Clang 14 cannot capture one
    const std::uint64_t step = leftover.first;
    if (step > *newest || live.contains(step) || quarantined.contains(step)) continue;
    attempt([&] {
      for (const auto& name : leftover.second) c.erase(name);
    });
  }
  attempt([&] {
    for (const auto& u : c.uploads()) {
      const auto slash = u.name.find('/');
      const auto step = format::parse_step_dir(std::string_view(u.name).substr(0, slash));
      if (step && *step <= *newest && !quarantined.contains(*step)) attempt([&] { c.abort_upload(u.name, u.upload_id); });
    }
  });
  steps.finish();
}

}  // namespace elastic::inline v1::checkpoint::detail::objects
