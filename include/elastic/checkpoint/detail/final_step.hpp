// How ranks that checkpoint together without a group agree on their final step.
//
// Such ranks each write their part of every step and rank 0 commits a step once every part is
// there, so at the end they must all snapshot the same step: a rank that stops at its own step
// leaves rank 0 waiting for a part that never comes, and nothing is saved. They agree through
// the checkpoint directory, which every rank that checkpoints with them shares by construction
// (the checkpoint layer sits below rendezvous: no store here).
//
// Files, in DIR/.final-<S>/ (S: the step this incarnation resumed at, 12 digits, so that an
// incarnation does not read the files of one that resumed elsewhere):
//   rank-<r>   "<step> <reason> <host> <pidns> <pid> <start time> <lock>": rank r stopped
//              training after <step> steps for <reason> (preempted, stopped, finished, or
//              joined: it saw another rank's proposal). Made under a temporary name and
//              renamed, so a reader never sees half of one. <lock> is "locked" when the writer
//              holds an open-file-description write lock on it for as long as it lives (taken
//              before the rename), "unlocked" where the file system refused the lock.
//   ack-<r>    the same identity: rank r has read every proposal and its final part is durable.
//
// The protocol (training_loop drives it):
//   1. On a notice (its own signal, stop(), its last step, or another rank's live proposal,
//      looked for at the end of a step at most every 20 ms) a rank writes its proposal.
//   2. It waits until all world_size proposals are there: F is the largest step, the reason is
//      `finished` when F is the last step, else `stopped` when some rank stopped and none was
//      preempted, else `preempted`.
//      Every rank reads the same complete set, so every rank finds the same F and reason.
//   3. A rank behind F trains on (no waiting) until F. At F every rank snapshots (unless its
//      periodic snapshot was of F) and waits until durable; rank 0's commit waits for every part.
//   4. Each then writes its ack and waits for every ack, so that no proposal disappears (its
//      process exits, or rank 0 removes the directory) before a slow rank has read the set;
//      after the last ack rank 0 removes the directory.
// Every wait is bounded by the caller's deadline (the grace after a preemption notice): a rank
// that is dead or hung makes the others wait until then, and the previous step stands.
//
// Stale files: a killed incarnation that resumed at the same step leaves its proposals behind.
// A proposal of this host (same host name) is live while its lock is held: the kernel drops
// the lock when its process dies, in whatever pid namespace (a container of its own) it ran, so
// the proposals of another, dead incarnation on this host are ignored, however recent. Without
// the lock (a file system that refused it) a proposal of this host and pid namespace is live
// while its process is. An incarnation's processes stay alive until every ack is in, so the live
// incarnation's proposals never look stale. Liveness cannot be checked across hosts: there a
// proposal counts until it is older than `stale_after`. Each rank also removes its own leftover
// files when it starts (nobody else of its incarnation writes those names).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/host_name.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// One rank's proposal (or ack), as read back.
struct final_proposal {
  int rank = -1;
  std::uint64_t step = 0;
  std::string reason;
};

/// The outcome all ranks compute from the complete set of proposals.
struct final_decision {
  std::uint64_t step = 0;  ///< F: the largest proposed step
  std::string reason;      ///< "finished", "preempted" or "stopped"
};

class final_step_agreement {
 public:
  using clock = std::chrono::steady_clock;

  /// Ranks `rank` of `world_size` checkpointing into `dir` (which the checkpointer has made),
  /// this incarnation having resumed at `resumed_step`. Removes this rank's leftovers of an
  /// earlier incarnation; rank 0 also removes the namespaces of incarnations that resumed
  /// earlier (their ranks are gone: this incarnation resumed after them).
  final_step_agreement(const std::filesystem::path& dir, int rank, int world_size, std::uint64_t resumed_step,
                       std::chrono::milliseconds stale_after)
      : parent_(internal::private_dir::open(dir)),
        name_(fmt::format(".final-{:012}", resumed_step)),
        rank_(rank),
        world_size_(world_size),
        stale_after_(stale_after),
        identity_(make_identity()) {
    if (auto ns = open_namespace(false)) {
      remove_quietly(*ns, proposal_name(rank_));
      remove_quietly(*ns, ack_name(rank_));
    }
    if (rank_ == 0) sweep_older(resumed_step);
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::filesystem::path path() const { return parent_ / name_; }

  /// Whether another rank has a live proposal out: usually one fstatat (no namespace, or one
  /// that has not changed since it was last read); the directory is read when it changed.
  [[nodiscard]] bool peer_proposed() noexcept {
    try {
      return peek();
    } catch (...) {
      return false;  // a namespace we cannot read is looked at again at the next step
    }
  }

  /// Writes this rank's proposal: it stopped after `step` steps for `reason`.
  void propose(std::uint64_t step, std::string_view reason) {
    ns_ = open_namespace(true);
    const std::string name = proposal_name(rank_), text = fmt::format("{} {} {}", step, reason, identity_);
    proposal_ = ns_->write_atomic_kept(name, text + " locked", [&](int fd) {
      // Taken before the rename, so the lock is there as soon as the name is. A file system that
      // refuses it is told in the file: readers then check the process instead.
      if (take_lock(fd)) return;
      const std::string unlocked = text + " unlocked";
      if (::ftruncate(fd, 0) != 0) throw os_error("cannot rewrite " + (path() / name).string());
      internal::pwrite_all(fd, unlocked.data(), unlocked.size(), 0, path() / name);
      internal::fsync_fd(fd, path() / name);
    });
  }

  /// The decision once every rank's live proposal is there; nothing when `deadline` passes
  /// first. `last_step` is the loop's total (0: none): reaching it means finished.
  std::optional<final_decision> wait_for_proposals(clock::time_point deadline, std::uint64_t last_step,
                                                   const std::function<void()>& on_poll = {}) {
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(5))) {
      const auto set = read_all(*ns_, "rank-");
      if (static_cast<int>(set.size()) == world_size_) {
        final_decision d;
        bool preempted = false, stopped = false;
        for (const auto& p : set) {
          d.step = std::max(d.step, p.step);
          preempted = preempted || p.reason == "preempted";
          stopped = stopped || p.reason == "stopped";
        }
        d.reason = last_step > 0 && d.step >= last_step ? "finished" : preempted || !stopped ? "preempted" : "stopped";
        proposals_seen_ = set.size();
        return d;
      }
      proposals_seen_ = set.size();
      if (on_poll) on_poll();
      if (clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(pause);
    }
  }

  /// Live proposals found by the newest wait_for_proposals (for events).
  [[nodiscard]] std::size_t proposals_seen() const noexcept { return proposals_seen_; }

  /// Writes this rank's ack and waits (until `deadline`) for every rank's; rank 0 then removes
  /// the namespace. False when some ack did not come in time (the namespace is left: its
  /// proposals are stale once their processes are gone).
  bool acknowledge(clock::time_point deadline) {
    write_atomic(ack_name(rank_), identity_);
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(5))) {
      if (static_cast<int>(read_all(*ns_, "ack-").size()) == world_size_) break;
      // Rank 0 removes the namespace only once every ack is in: gone is as good as complete.
      if (rank_ != 0 && removed()) return true;
      if (clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
    }
    if (rank_ == 0) remove_namespace();
    return true;
  }

 private:
  bool peek() {
    struct stat st {};
    if (::fstatat(parent_.fd(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return false;
    // File times tick coarsely (a jiffy or more): a change in the same tick as a read keeps
    // the time, so an unchanged time proves nothing new only when that read came well after it.
    const auto mtime = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
    if (seen_mtime_ && *seen_mtime_ == mtime && read_at_ - mtime > std::chrono::seconds(1)) return false;
    seen_mtime_ = mtime;
    read_at_ = std::chrono::system_clock::now();
    auto ns = open_namespace(false);
    if (!ns) return false;
    for (const auto& p : read_all(*ns, "rank-"))
      if (p.rank != rank_) return true;
    return false;
  }

  static std::string proposal_name(int r) { return "rank-" + std::to_string(r); }

  /// An open-file-description write lock on all of `fd`'s file: held until the descriptor is
  /// closed, which the kernel does when the process dies however it dies.
  static bool take_lock(int fd) noexcept {
    struct flock l {};
    l.l_type = F_WRLCK;
    l.l_whence = SEEK_SET;
    return ::fcntl(fd, F_OFD_SETLK, &l) == 0;
  }

  /// Whether some open file description (of any process on this host) holds a lock on `fd`'s
  /// file; nothing when the file system cannot say.
  static std::optional<bool> lock_held(int fd) noexcept {
    struct flock l {};
    l.l_type = F_RDLCK;
    l.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_GETLK, &l) != 0) return std::nullopt;
    return l.l_type != F_UNLCK;
  }

  /// Whether the namespace we hold open has been removed (by rank 0, after the last ack).
  bool removed() const noexcept {
    struct stat st {};
    return ::fstat(ns_->fd(), &st) == 0 && st.st_nlink == 0;
  }
  static std::string ack_name(int r) { return "ack-" + std::to_string(r); }

  /// "<host> <pid namespace> <pid> <start time>": who wrote a file, checkable on its host.
  static std::string make_identity() {
    const pid_t pid = ::getpid();
    return fmt::format("{} {} {} {}", internal::host_name_for_ids(), internal::pid_namespace(), pid,
                       internal::process_start_time(pid));
  }

  std::optional<internal::private_dir> open_namespace(bool create) const {
    try {
      return parent_.subdir(name_, create);
    } catch (const error& e) {
      if (!create && e.code() == errc::not_found) return std::nullopt;
      throw;
    }
  }

  void write_atomic(const std::string& name, const std::string& content) const { ns_->write_atomic(name, content); }

  /// The names in `d`; nothing when it cannot be read (it is being removed, or never was).
  static std::vector<std::string> list(const internal::private_dir& d) {
    try {
      return internal::list_dir_at(d.fd(), d.path());
    } catch (const error&) {
      return {};
    }
  }

  /// The live files named `<prefix><rank>`, one per rank, parsed.
  std::vector<final_proposal> read_all(const internal::private_dir& d, std::string_view prefix) const {
    std::vector<final_proposal> out;
    for (const auto& n : list(d)) {
      if (!n.starts_with(prefix)) continue;
      int r = -1;
      const char* first = n.data() + prefix.size();
      const auto [end, ec] = std::from_chars(first, n.data() + n.size(), r);
      if (ec != std::errc() || end != n.data() + n.size() || r < 0 || r >= world_size_) continue;
      if (auto p = read_one(d, n, prefix == "rank-")) {
        p->rank = r;
        out.push_back(std::move(*p));
      }
    }
    return out;
  }

  /// The whitespace-separated fields of a proposal or ack file; nothing when it has trailing
  /// whitespace or a NUL byte (what the library writes has neither).
  static std::optional<std::vector<std::string_view>> split_fields(std::string_view text) {
    if (text.find('\0') != std::string_view::npos) return std::nullopt;
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; };
    if (!text.empty() && space(text.back())) return std::nullopt;
    std::vector<std::string_view> out;
    std::size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && space(text[i])) ++i;
      std::size_t j = i;
      while (j < text.size() && !space(text[j])) ++j;
      if (j > i) out.push_back(text.substr(i, j - i));
      i = j;
    }
    return out;
  }

  /// A non-negative integer field (a step, a pid namespace inode, a start time).
  static std::optional<std::uint64_t> parse_count(std::string_view field) noexcept {
    const auto n = internal::parse_integer(field);
    if (!n || *n < 0) return std::nullopt;
    return static_cast<std::uint64_t>(*n);
  }

  /// A file of the namespace, if it is there, well formed and live.
  std::optional<final_proposal> read_one(const internal::private_dir& d, const std::string& name,
                                         bool proposal) const {
    std::string text;
    struct stat st {};
    internal::unique_fd fd;
    try {
      fd = d.open_file(name, O_RDONLY);
      if (::fstat(fd.get(), &st) != 0) return std::nullopt;
      char buf[512];
      const ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
      if (n <= 0) return std::nullopt;
      text.assign(buf, static_cast<std::size_t>(n));
    } catch (const error&) {
      return std::nullopt;  // gone since the listing, or not a file of ours: not a proposal
    }
    // proposal: "<step> <reason> " then the identity, then "locked"/"unlocked"; ack: the
    // identity alone.
    final_proposal p;
    const auto fields = split_fields(text);
    if (!fields || fields->size() != (proposal ? 7u : 4u)) return std::nullopt;
    const std::string_view* id = fields->data() + (proposal ? 2 : 0);  // host pidns pid start
    const auto step = proposal ? parse_count((*fields)[0]) : std::optional<std::uint64_t>(0);
    const auto pidns = parse_count(id[1]), start = parse_count(id[3]);
    const auto pid = internal::parse_integer(id[2]);
    if (!step || !pidns || !pid || !start) return std::nullopt;
    if ((proposal && (*fields)[1].size() > 31) || id[0].size() > 255) return std::nullopt;
    p.step = *step;
    if (proposal) p.reason = std::string((*fields)[1]);
    const std::string host(id[0]);
    // Acks are read only once every rank's live proposal was seen: each rank had started by
    // then and removed its own leftovers, so every ack there is of this incarnation, and one
    // whose rank has exited since (it saw every ack) still counts.
    if (proposal && (*fields)[6] != "locked" && (*fields)[6] != "unlocked") return std::nullopt;
    const bool locked = proposal && (*fields)[6] == "locked";
    if (proposal && !live(host, *pidns, static_cast<pid_t>(*pid), *start, st, locked ? fd.get() : -1)) return std::nullopt;
    return p;
  }

  /// Whether a proposal is of a live process. `lock_fd`: the file, when its writer locked it.
  bool live(std::string_view host, std::uint64_t pidns, pid_t pid, std::uint64_t start, const struct stat& st,
            int lock_fd) const {
    if (host == host_of(identity_)) {
      if (lock_fd >= 0) {
        if (const auto held = lock_held(lock_fd)) return *held;
      }
      if (pidns == internal::pid_namespace() && pidns != 0) return internal::process_alive(pid, start);
    }
    const auto written = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
    return std::chrono::system_clock::now() - written < stale_after_;
  }

  static std::string_view host_of(std::string_view identity) { return identity.substr(0, identity.find(' ')); }

  static void remove_quietly(const internal::private_dir& d, const std::string& name) noexcept {
    ::unlinkat(d.fd(), name.c_str(), 0);
  }

  void remove_namespace() noexcept {
    for (const auto& n : list(*ns_)) remove_quietly(*ns_, n);
    ::unlinkat(parent_.fd(), name_.c_str(), AT_REMOVEDIR);
  }

  /// Namespaces of incarnations that resumed before this one: nobody reads them any more.
  void sweep_older(std::uint64_t resumed_step) const noexcept {
    try {
      for (const auto& n : list(parent_)) {
        if (!n.starts_with(".final-") || n.size() != 7 + 12) continue;
        std::uint64_t s = 0;
        const auto [end, ec] = std::from_chars(n.data() + 7, n.data() + n.size(), s);
        if (ec != std::errc() || end != n.data() + n.size() || s >= resumed_step) continue;
        auto d = parent_.subdir(n, false);
        for (const auto& f : list(d)) remove_quietly(d, f);
        ::unlinkat(parent_.fd(), n.c_str(), AT_REMOVEDIR);
      }
    } catch (...) {
    }
  }

  internal::private_dir parent_;
  std::optional<internal::private_dir> ns_;
  internal::unique_fd proposal_;  // our proposal, open: its lock says we live
  std::string name_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds stale_after_;
  std::string identity_;
  std::optional<std::chrono::system_clock::time_point> seen_mtime_;
  std::chrono::system_clock::time_point read_at_{};  // when the namespace was last read
  std::size_t proposals_seen_ = 0;
};

}  // namespace elastic::inline v1::checkpoint::detail
