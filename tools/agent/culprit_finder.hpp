// The launcher's reading of its workers' flight recorders (elastic/comm/detail/flight_recorder.hpp):
// when a worker dies badly (the watchdog killed it, it crashed), the records of every worker of
// the run on this host say which rank never entered the collective the others were in. Each
// such finding is reported once (`group_culprit`, source "launcher", and the summary); a dead
// worker's object is removed once it has been read.
//
// Records are read, never trusted. Only those of this launcher's own workers are read (the one
// that died, the live ones and what runs in their process groups), named by their pids: not
// whatever a process of this user put under the run's prefix. A record whose head names another
// pid than its name is not read, a collective that claims a world larger than the run's bound is
// not believed (find_culprit), and a name that is no regular file of ours is skipped unopened
// with a note. Records are removed only when no process maps them: a second launcher of the same
// run on this host (refused, or one of another host's group sharing the run id) never removes
// the records of the first one's live workers.
#pragma once

#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "process_tree.hpp"
#include <elastic/comm/detail/flight_culprit.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/shm_object.hpp>

namespace elastic::agent {

class culprit_finder {
 public:
  /// For run `run_id`, whose groups have at most `max_world` ranks.
  culprit_finder(std::string run_id, std::size_t max_world)
      : run_id_(std::move(run_id)),
        prefix_(comm::detail::flight_prefix(run_id_)),
        max_world_(static_cast<int>(std::min<std::size_t>(max_world, comm::detail::max_flight_world))) {}

  /// After worker `pid` died badly (or its collective failed): compares the records of the
  /// round it was in (its own record read before it is removed) with those of the live
  /// `workers` and reports culprits not reported yet. Returns the new finding's text (empty:
  /// none).
  std::string look(long pid, std::span<const pid_t> workers, const event_log& events) {
    std::vector<comm::detail::flight_log> logs;
    std::int64_t round = -1;
    for (const long p : readable_pids(pid, workers)) {
      auto l = read(p);
      if (!l) continue;
      if (l->pid == pid) round = l->round;
      logs.push_back(std::move(*l));
    }
    if (round < 0) return {};  // it recorded nothing: it never took part in a round
    const auto rep = comm::detail::find_culprit(logs, round, false, max_world_);
    if (!rep || !reported_.insert({rep->round, rep->index}).second) return {};
    std::vector<long> pids;
    for (int r : rep->culprits) pids.push_back(rep->ranks[static_cast<std::size_t>(r)].pid);
    const std::string pid_list = fmt::format("{}", fmt::join(pids, ","));
    const event_field extra[] = {{"bytes", rep->bytes}, {"culprit_pids", pid_list}, {"trigger_pid", pid}};
    const std::string text = comm::detail::emit_culprit(events, *rep, "launcher", internal::monotonic_ns(), extra);
    findings_.push_back(text);
    return text;
  }

  /// Removes the object of worker `pid`, which has ended (read first by look()).
  void forget(long pid) const { remove_if_ours(comm::detail::flight_name(run_id_, pid)); }

  /// Removes the objects of the run that no process maps (workers that were killed, here or in
  /// an earlier life of the run); at the start and the end of the run. A live process's record
  /// is left alone, whoever started it.
  void forget_all() const {
    const auto names = run_names();
    if (names.empty()) return;
    const auto mapped = internal::mapped_shm_names();
    for (const auto& name : names)
      if (mapped.count(name) == 0) remove_if_ours(name);
  }

  /// What was found, one paragraph per finding, for the summary.
  [[nodiscard]] const std::vector<std::string>& findings() const noexcept { return findings_; }

  /// Records that were skipped since the last call, one sentence each (a name planted in a
  /// worker's place), for the launcher to say.
  std::vector<std::string> take_notes() { return std::exchange(notes_, {}); }

 private:
  /// `dead`, the `workers`, and the live processes in the workers' process groups (a worker
  /// started through a wrapper that does not exec), at most once each.
  static std::vector<long> readable_pids(long dead, std::span<const pid_t> workers) {
    std::set<long> out{dead};
    for (const pid_t w : workers)
      if (w > 0) out.insert(w);
    detail::for_each_process([&](const detail::proc_info& p) {
      if (p.state != 'Z' && p.state != 'X' && std::find(workers.begin(), workers.end(), p.pgid) != workers.end()) {
        out.insert(p.pid);
      }
    });
    return {out.begin(), out.end()};
  }

  /// The record of process `pid`, when it has one that says it is its own.
  std::optional<comm::detail::flight_log> read(long pid) {
    const std::string name = comm::detail::flight_name(run_id_, pid);
    try {
      auto l = comm::detail::read_flight(name);
      if (l && l->pid != pid) {
        notes_.push_back(fmt::format("flight record /dev/shm/{} says it is pid {}'s: not read", name, l->pid));
        return std::nullopt;
      }
      return l;
    } catch (const error& e) {
      notes_.push_back(fmt::format("flight record skipped: {}", e.message()));
      return std::nullopt;
    }
  }

  /// Removes /dev/shm/`name` when it is a regular file of ours: a name planted by someone else
  /// stays (root could remove it, the sticky bit notwithstanding), and is theirs to remove.
  static void remove_if_ours(const std::string& name) {
    struct stat st {};
    if (::lstat(("/dev/shm/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) {
      ::shm_unlink(("/" + name).c_str());
    }
  }

  /// The names of the run's objects: PREFIX<pid> (a run whose id extends ours, "a" and "a.b",
  /// has more dots after the prefix).
  [[nodiscard]] std::vector<std::string> run_names() const {
    std::vector<std::string> out;
    DIR* d = ::opendir("/dev/shm");
    if (d == nullptr) return out;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n(e->d_name);
      if (n.size() > prefix_.size() && n.substr(0, prefix_.size()) == prefix_ &&
          n.find_first_not_of("0123456789", prefix_.size()) == std::string_view::npos) {
        out.emplace_back(n);
      }
    }
    ::closedir(d);
    return out;
  }

  std::string run_id_;
  std::string prefix_;
  int max_world_;
  std::set<std::pair<std::int64_t, std::uint64_t>> reported_;  // (round, collective)
  std::vector<std::string> findings_;
  std::vector<std::string> notes_;
};

}  // namespace elastic::agent
