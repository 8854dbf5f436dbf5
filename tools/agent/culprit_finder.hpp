// The launcher's reading of its workers' flight recorders (elastic/comm/detail/flight_recorder.hpp):
// when a worker dies badly (the watchdog killed it, it crashed), the records of every worker of
// the run on this host say which rank never entered the collective the others were in. Each
// such finding is reported once (`group_culprit`, source "launcher", and the summary); a dead
// worker's object is removed once it has been read.
#pragma once

#include <dirent.h>
#include <sys/mman.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/comm/detail/flight_culprit.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/clock.hpp>

namespace elastic::agent {

class culprit_finder {
 public:
  explicit culprit_finder(std::string run_id) : prefix_(comm::detail::flight_prefix(run_id)) {}

  /// After worker `pid` died badly: compares the records of the round it was in (its own record
  /// read before it is removed) and reports culprits not reported yet. Returns the new finding's
  /// text (empty: none).
  std::string look(long pid, const event_log& events) {
    std::vector<comm::detail::flight_log> logs;
    std::int64_t round = -1;
    for (const auto& name : names()) {
      auto l = comm::detail::read_flight(name);
      if (!l) continue;
      if (l->pid == pid) round = l->round;
      logs.push_back(std::move(*l));
    }
    if (round < 0) return {};  // it recorded nothing: it never took part in a round
    const auto rep = comm::detail::find_culprit(logs, round);
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
  void forget(long pid) const {
    for (const auto& name : names()) {
      const auto dot = name.find_last_of('.');
      if (dot != std::string::npos && name.substr(dot + 1) == std::to_string(pid)) ::shm_unlink(("/" + name).c_str());
    }
  }

  /// Removes every object of the run left behind (workers that were killed); at the end of the run.
  void forget_all() const {
    for (const auto& name : names()) ::shm_unlink(("/" + name).c_str());
  }

  /// What was found, one paragraph per finding, for the summary.
  [[nodiscard]] const std::vector<std::string>& findings() const noexcept { return findings_; }

 private:
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    DIR* d = ::opendir("/dev/shm");
    if (d == nullptr) return out;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n(e->d_name);
      // PREFIX<pid>: a run whose id extends ours ("a" and "a.b") has more dots after the prefix.
      if (n.size() > prefix_.size() && n.substr(0, prefix_.size()) == prefix_ &&
          n.find_first_not_of("0123456789", prefix_.size()) == std::string_view::npos) {
        out.emplace_back(n);
      }
    }
    ::closedir(d);
    return out;
  }

  std::string prefix_;
  std::set<std::pair<std::int64_t, std::uint64_t>> reported_;  // (round, collective)
  std::vector<std::string> findings_;
};

}  // namespace elastic::agent
