// The group's rounds, from the events every member logs about each: rendezvous_round_closed (the
// members), group_formed/group_rebuilt (cause, rendezvous and connect times), group_resynced
// (step, bytes, recovery time), group_resharded (where partitioned state came from). A relaunched
// group counts its rounds from 1 again: a round is told from an earlier one of the same number
// by its members (participant ids name their launcher's pid), so each closes its own entry.
//
// Phases of a rebuild, from the members' own clocks: noticed (the earliest survivor's notice:
// its group_rebuilt time less its connect and rendezvous times) to closed (the round closed) is
// the rendezvous, closed to connected (the last member's group_rebuilt) the connect, connected to
// resynced (the last member's group_resynced) the resync.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_events.hpp"
#include "timeline_types.hpp"

namespace elastic::agent::timeline {

class round_tracker {
 public:
  /// rendezvous_round_closed: a member's view of the round it is in.
  std::size_t closed(const event& e) {
    const auto round = int_field(e.fields, "round").value_or(0);
    const std::string members = text_field(e.fields, "members");
    auto& r = at(e, round, members);
    r.closed = r.closed ? std::min(*r.closed, e.t) : e.t;
    if (const auto w = int_field(e.fields, "world_size")) r.entry.world = *w;
    return current_[{run(e), round}];
  }

  /// group_formed or group_rebuilt: the round connected at this member.
  std::size_t formed(const event& e) {
    const auto round = int_field(e.fields, "round").value_or(0);
    auto& r = at(e, round, {});
    r.connected = r.connected ? std::max(*r.connected, e.t) : e.t;
    if (const auto w = int_field(e.fields, "world_size"); w && r.entry.world == 0) r.entry.world = *w;
    const double rdzv = ms_field(e, "rendezvous_ms");
    const double connect = ms_field(e, "connect_ms");
    r.rendezvous_ms = std::max(r.rendezvous_ms, rdzv);
    r.connect_ms = std::max(r.connect_ms, connect);
    const std::string cause = text_field(e.fields, "cause");
    // A survivor's notice starts the rebuild; a newcomer's join (its start-up included) does not.
    const double noticed = e.t - (rdzv + connect) / 1000;
    if (cause.empty() || cause == "join") {
      r.noticed_by_newcomer = std::min(r.noticed_by_newcomer.value_or(noticed), noticed);
    } else {
      r.noticed_by_survivor = std::min(r.noticed_by_survivor.value_or(noticed), noticed);
      if (std::find(r.causes.begin(), r.causes.end(), cause) == r.causes.end() && r.causes.size() < 4) {
        r.causes.push_back(cause);
      }
    }
    return current_[{run(e), round}];
  }

  /// group_resynced: the group trains again at this member.
  std::size_t resynced(const event& e) {
    auto& r = at(e, int_field(e.fields, "round").value_or(0), {});
    r.resynced = r.resynced ? std::max(*r.resynced, e.t) : e.t;
    r.resync_ms = std::max(r.resync_ms, ms_field(e, "resync_ms"));
    r.recovery_ms = std::max(r.recovery_ms, ms_field(e, "recovery_ms"));
    if (const auto s = int_field(e.fields, "step")) r.step = *s;
    if (const auto b = int_field(e.fields, "bytes")) r.bytes = std::max(r.bytes.value_or(0), *b);
    return current_[{run(e), int_field(e.fields, "round").value_or(0)}];
  }

  /// group_resharded: where a rebuild took partitioned state from.
  void resharded(const event& e) {
    const auto round = int_field(e.fields, "round");
    auto it = round ? current_.find({run(e), *round}) : last_of_run(run(e));
    if (it == current_.end()) return;
    auto& r = rounds_[it->second].entry;
    std::string text = fmt::format("world {} → {}", any_field(e.fields, "world_before"), any_field(e.fields, "world_after"));
    for (const char* key : {"step", "from", "sources", "rolled_back", "bytes", "ms"}) {
      if (const auto v = any_field(e.fields, key); !v.empty()) text += fmt::format(", {} {}", key, v);
    }
    if (r.resharded.find(text) == std::string::npos) r.resharded += (r.resharded.empty() ? "" : "; ") + text;
  }

  /// A failed collective: it is what the run's next round rebuilds after.
  void failure(const event& e, const std::string& text) {
    auto& list = pending_failures_[run(e)];
    if (list.size() < 4 && std::find(list.begin(), list.end(), text) == list.end()) list.push_back(text);
  }

  /// The rounds in the order they were first seen (the indexes the calls above returned), each
  /// with its id, world before and whether it started its run (or a relaunch of it).
  std::vector<round_entry> finish() && {
    std::vector<round_entry> out;
    for (auto& r : rounds_) {
      r.entry.noticed = r.noticed_by_survivor ? r.noticed_by_survivor : r.noticed_by_newcomer;
      for (const auto& c : r.causes) r.entry.cause += (r.entry.cause.empty() ? "" : "; ") + c;
      if (r.entry.cause.empty()) r.entry.cause = "join";
      r.entry.closed = r.closed;
      r.entry.connected = r.connected;
      r.entry.resynced = r.resynced;
      r.entry.rendezvous_ms = r.rendezvous_ms;
      r.entry.connect_ms = r.connect_ms;
      r.entry.resync_ms = r.resync_ms;
      r.entry.recovery_ms = r.recovery_ms;
      r.entry.step = r.step;
      r.entry.bytes = r.bytes;
      out.push_back(std::move(r.entry));
    }
    return out;
  }

  /// When a round began: its notice, else its close, else its connect.
  static double start(const round_entry& r) {
    return r.noticed.value_or(r.closed.value_or(r.connected.value_or(r.resynced.value_or(0))));
  }

 private:
  struct record {
    round_entry entry;
    std::optional<double> closed, connected, resynced;
    double rendezvous_ms = 0, connect_ms = 0, resync_ms = 0, recovery_ms = 0;
    std::optional<std::int64_t> step, bytes;
    std::optional<double> noticed_by_survivor, noticed_by_newcomer;
    std::vector<std::string> causes;  ///< the survivors' (a newcomer's is "join")
  };

  static std::string run(const event& e) { return text_field(e.fields, "run_id"); }

  /// A duration in ms from an event: 0 when absent, negative or not finite, at most a day.
  static double ms_field(const event& e, std::string_view key) {
    const double v = number_field(e.fields, key).value_or(0);
    return std::isfinite(v) && v > 0 ? std::min(v, 86'400'000.0) : 0;
  }

  std::map<std::pair<std::string, std::int64_t>, std::size_t>::iterator last_of_run(const std::string& run_id) {
    auto best = current_.end();
    for (auto it = current_.begin(); it != current_.end(); ++it) {
      if (it->first.first == run_id && (best == current_.end() || it->second > best->second)) best = it;
    }
    return best;
  }

  /// The entry of round `round` of `e`'s run: a new one when none is open or `members` differ
  /// from its own (a relaunched group counting from 1 again).
  record& at(const event& e, std::int64_t round, const std::string& members) {
    const auto k = std::make_pair(run(e), round);
    auto it = current_.find(k);
    if (it != current_.end() && (members.empty() || rounds_[it->second].entry.members.empty() ||
                                 rounds_[it->second].entry.members == members)) {
      auto& r = rounds_[it->second];
      if (r.entry.members.empty()) r.entry.members = members;
      return r;
    }
    record r;
    r.entry.run_id = k.first;
    r.entry.round = round;
    r.entry.members = members;
    r.entry.id = fmt::format("round-{}", rounds_.size() + 1);
    const auto before = current_.find({k.first, round - 1});
    r.entry.world_before = before == current_.end() ? 0 : rounds_[before->second].entry.world;
    r.entry.first_of_run = before == current_.end();
    if (auto f = pending_failures_.find(k.first); f != pending_failures_.end()) {
      for (const auto& text : f->second) r.entry.failures += (r.entry.failures.empty() ? "" : "; ") + text;
      pending_failures_.erase(f);
    }
    current_[k] = rounds_.size();
    rounds_.push_back(std::move(r));
    return rounds_.back();
  }

  std::vector<record> rounds_;
  std::map<std::pair<std::string, std::int64_t>, std::size_t> current_;
  std::map<std::string, std::vector<std::string>> pending_failures_;
};

}  // namespace elastic::agent::timeline
