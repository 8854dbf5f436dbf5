// How the ids a launcher hands out name it: its workers' participant ids, the guardian's mark of
// its descendants and its watchdog's segment. They must differ between any two live launchers of
// a run on one host, and stay the same for the launcher's whole life (a restarted worker reuses
// its slot's participant id: the rendezvous takes the same id with a new incarnation for a
// restart, and waits out its predecessor's lease).
//
// A pid alone does not tell two launchers apart when they run in separate pid namespaces
// (containers that share the host's network, host name and /dev/shm): each may be pid 2 in its
// own. So outside the host's own pid namespace the name carries that namespace's inode, which no
// other live namespace on the host has: "HOST@NS.PID". In the host's namespace it stays
// "HOST.PID", the ids users already know. Where the namespace cannot be read (no /proc) a random
// number stands in for it.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <elastic/internal/host_name.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/rendezvous/detail/participant_id.hpp>

namespace elastic::agent {

class launcher_identity {
 public:
  /// The identity of the calling process, on this host, in its pid namespace.
  static launcher_identity of_this_process() {
    const std::uint64_t ns = elastic::internal::pid_namespace();
    std::string qualifier;
    if (ns == 0) {
      qualifier = "x" + rendezvous::detail::random_hex(4);  // unknown namespace: unique anyway
    } else if (ns != elastic::internal::initial_pid_namespace) {
      qualifier = std::to_string(ns);
    }
    return launcher_identity(elastic::internal::host_name_for_ids(), ::getpid(), std::move(qualifier));
  }

  /// `qualifier`: empty in the host's own pid namespace, else what tells this one apart.
  launcher_identity(std::string host, pid_t pid, std::string qualifier)
      : host_(std::move(host)), pid_(pid), qualifier_(std::move(qualifier)) {}

  [[nodiscard]] const std::string& host() const noexcept { return host_; }

  /// "HOST.PID", or "HOST@NS.PID" outside the host's pid namespace.
  [[nodiscard]] std::string name() const {
    return qualifier_.empty() ? fmt::format("{}.{}", host_, pid_) : fmt::format("{}@{}.{}", host_, qualifier_, pid_);
  }

  /// A worker's participant id in the rendezvous: "NAME:SLOT" (the run timeline reads the pid
  /// between the last '.' and the ':', and the slot after it: keep the format).
  [[nodiscard]] std::string participant(std::size_t slot) const { return fmt::format("{}:{}", name(), slot); }

  /// The environment entry prefix every descendant of this launcher carries (guardian.hpp).
  [[nodiscard]] std::string mark() const { return fmt::format("ELASTIC_PARTICIPANT_ID={}:", name()); }

  /// The launcher's watchdog segment for run `run_id`: "elastic-RUN-PID[-NS]".
  [[nodiscard]] std::string watchdog_name(std::string_view run_id) const {
    return qualifier_.empty() ? fmt::format("elastic-{}-{}", run_id, pid_)
                              : fmt::format("elastic-{}-{}-{}", run_id, pid_, qualifier_);
  }

 private:
  std::string host_;
  pid_t pid_;
  std::string qualifier_;
};

}  // namespace elastic::agent
