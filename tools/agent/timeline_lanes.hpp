// Which row of a run timeline each event belongs on. A worker's events carry its pid and its
// group rank, and the rank changes as the group rebuilds, so lanes are worker slots: a launcher's
// worker_start/worker_restart names the slot of each worker pid, and a rendezvous participant id
// (HOST[@NS].LAUNCHER_PID:SLOT, launcher_identity.hpp) names the slot of a trainer a wrapper
// script started. Launchers of one host share its lanes across retries; a second launcher on a
// host while another still runs (several "hosts" on one machine) gets lanes of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "timeline_events.hpp"
#include "timeline_types.hpp"
#include <elastic/internal/env.hpp>

namespace elastic::agent::timeline {

/// A launcher seen in the events.
struct launcher_seen {
  std::string host, group;  ///< its host, and the lanes' host group ("vm", or "vm #4242")
  std::int64_t pid = -1;
  std::size_t row = 0;
  std::optional<double> started, ended;
  double first = 0, last = 0;  ///< its first and last events
  bool spoke = false;          ///< it logged events of its own (not only named by its workers)
  std::string outcome, command;
  std::optional<std::int64_t> exit_code;
};

/// The rows, and which pid of which host is on which.
class lane_map {
 public:
  /// Finds every launcher and worker slot in `events` (sorted by time).
  explicit lane_map(const std::vector<event>& events) {
    for (const auto& e : events) {
      if (e.name == "launcher_start") {
        start_launcher(e);
      } else if (e.name == "launcher_end") {
        launcher(e.host, e.pid, e.t).ended = e.t;
      } else if (e.name == "worker_start" || e.name == "worker_restart") {
        const auto slot = int_field(e.fields, "slot");
        const auto worker = int_field(e.fields, "worker_pid");
        if (slot && worker) pids_[{e.host, *worker}] = slot_row(launcher(e.host, e.pid, e.t), *slot);
      } else if (const auto p = text_field(e.fields, "participant"); !p.empty() && e.pid > 0) {
        map_participant(e, p);
      }
    }
  }

  std::vector<row>& rows() noexcept { return rows_; }
  std::map<std::pair<std::string, std::int64_t>, launcher_seen>& launchers() noexcept { return launchers_; }

  /// The launcher `pid` of `host`, if it is one.
  launcher_seen* find_launcher(const std::string& host, std::int64_t pid) {
    const auto it = launchers_.find({host, pid});
    return it == launchers_.end() ? nullptr : &it->second;
  }

  /// The lane of pid `pid` of `host`, if it is a known worker.
  std::optional<std::size_t> worker_row(const std::string& host, std::int64_t pid) const {
    const auto it = pids_.find({host, pid});
    return it == pids_.end() ? std::nullopt : std::optional<std::size_t>(it->second);
  }

  /// Where an event of `e`'s process goes: its slot's lane, else its launcher's row, else a lane
  /// for its rank, else its host's row for other processes.
  std::size_t row_of(const event& e) { return row_of(e.host, e.pid, e.rank); }

  std::size_t row_of(const std::string& host, std::int64_t pid, std::optional<std::int64_t> rank) {
    if (auto r = worker_row(host, pid)) return *r;
    if (auto* l = find_launcher(host, pid)) return l->row;
    if (rank) return rank_row(host, *rank);
    return other_row(host);
  }

  /// A lane for rank `rank` of `host` (its process not known as any slot's).
  std::size_t rank_row(const std::string& host, std::int64_t rank) {
    return make_row({"rank", host, rank}, {.kind = row_kind::rank_lane,
                                          .label = fmt::format("{} · rank {}", host, rank),
                                          .detail = fmt::format("host {}: rank {} (no slot known for its process)",
                                                                host, rank),
                                          .group = host_order(host),
                                          .index = rank});
  }

  /// The group's row of run `run_id`.
  std::size_t group_row(const std::string& run_id) {
    return make_row({"group", run_id, 0}, {.kind = row_kind::group,
                                          .label = run_id.empty() ? "group" : fmt::format("group {}", run_id),
                                          .detail = "rounds of the group: the world it trained with, and each "
                                                    "rebuild's rendezvous, connect and resync",
                                          .group = run_order(run_id),
                                          .index = 0});
  }

  std::size_t checkpoint_row() {
    return make_row({"checkpoints", "", 0}, {.kind = row_kind::checkpoints,
                                            .label = "checkpoints",
                                            .detail = "checkpoint commits (rank 0), failures and skips",
                                            .group = 0,
                                            .index = 0});
  }

 private:
  using key = std::tuple<std::string, std::string, std::int64_t>;

  std::size_t make_row(key k, row r) {
    const auto [it, added] = row_of_key_.try_emplace(std::move(k), rows_.size());
    if (added) rows_.push_back(std::move(r));
    return it->second;
  }

  std::size_t host_order(const std::string& host_group) {
    return order_.try_emplace("h:" + host_group, order_.size()).first->second;
  }
  std::size_t run_order(const std::string& run_id) {
    return order_.try_emplace("r:" + run_id, order_.size()).first->second;
  }

  std::size_t other_row(const std::string& host) {
    return make_row({"other", host, 0}, {.kind = row_kind::other,
                                        .label = fmt::format("{} · other", host),
                                        .detail = fmt::format("host {}: processes that are neither a launcher nor a "
                                                              "known worker",
                                                              host),
                                        .group = host_order(host),
                                        .index = 0});
  }

  std::size_t slot_row(const launcher_seen& l, std::int64_t slot) {
    return make_row({"slot", l.group, slot}, {.kind = row_kind::lane,
                                             .label = fmt::format("{} · slot {}", l.group, slot),
                                             .detail = fmt::format("host {}, worker slot {} (ELASTIC_LOCAL_RANK); "
                                                                   "launcher pid {}",
                                                                   l.host, slot, l.pid),
                                             .group = host_order(l.group),
                                             .index = slot});
  }

  /// A launcher that starts while another of its host has not ended gets lanes of its own.
  void start_launcher(const event& e) {
    bool busy = false;
    for (const auto& [k, l] : launchers_) busy = busy || (l.host == e.host && l.pid != e.pid && !l.ended);
    auto& l = launcher(e.host, e.pid, e.t, busy ? fmt::format("{} #{}", e.host, e.pid) : e.host);
    l.started = e.t;
    l.command = text_field(e.fields, "command");
  }

  /// The launcher `pid` of `host`, first seen at `t` (with `group` when new).
  launcher_seen& launcher(const std::string& host, std::int64_t pid, double t, std::string group = {}) {
    auto [it, added] = launchers_.try_emplace({host, pid});
    auto& l = it->second;
    if (added) {
      l.host = host;
      l.pid = pid;
      l.group = group.empty() ? host : std::move(group);
      l.first = l.last = t;
      // One row per host group: its launches follow each other on it.
      l.row = make_row({"launcher", l.group, 0}, {.kind = row_kind::launcher,
                                                 .label = fmt::format("{} · elastic-run", l.group),
                                                 .detail = fmt::format("host {}: elastic-run (each launch: its pid, "
                                                                       "from launcher_start to launcher_end)",
                                                                       host),
                                                 .group = host_order(l.group),
                                                 .index = 0});
    }
    return l;
  }

  /// HOST[@NS].LAUNCHER_PID:SLOT of a rendezvous event: the slot of a process no worker_start named.
  void map_participant(const event& e, const std::string& participant) {
    if (pids_.count({e.host, e.pid}) != 0) return;
    const auto dot = participant.rfind('.');
    const auto colon = participant.rfind(':');
    if (dot == std::string::npos || colon == std::string::npos || colon < dot) return;
    const auto lpid = elastic::internal::parse_integer(std::string_view(participant).substr(dot + 1, colon - dot - 1));
    const auto slot = elastic::internal::parse_integer(std::string_view(participant).substr(colon + 1));
    if (!lpid || !slot || *slot < 0) return;
    pids_[{e.host, e.pid}] = slot_row(launcher(e.host, *lpid, e.t), *slot);
  }

  std::vector<row> rows_;
  std::map<key, std::size_t> row_of_key_;
  std::map<std::string, std::size_t> order_;
  std::map<std::pair<std::string, std::int64_t>, launcher_seen> launchers_;
  std::map<std::pair<std::string, std::int64_t>, std::size_t> pids_;
};

}  // namespace elastic::agent::timeline
