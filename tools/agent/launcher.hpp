// The agent behind elastic-run: starts the workers of one host, hosts their watchdog, restarts the
// ones that fail while the others go on, turns a preemption notice into an orderly stop, keeps
// every worker's output, and says at the end what happened and what it cost.
//
//   elastic::agent::launcher l(elastic::agent::parse_command_line(args));
//   return l.run();    // see exit_codes.hpp: 0 done, 75 preempted, 1 failed, 3 crash loop
//
// The launcher is the last thing that may fail, so nothing outside may stall or kill it:
//   - Signals: every signal that could end it is blocked in the thread that constructs it (before
//     any thread starts, so all inherit the mask) and read from a signalfd; each is a preemption
//     notice, forwarded to the workers as SIGTERM. Signals within 2 s of a notice are the same
//     notice (platforms signal every process); one after that kills the workers at once.
//   - The loop sleeps in poll() until a worker writes, exits, a signal comes, the console takes
//     more, a restart is due or the grace ends. The console never blocks it (console.hpp), the
//     store never does (async_store.hpp), SIGPIPE is ignored (workers get it back by default).
//   - Nothing outlives it: it is a child subreaper, kills each worker's whole process group, and
//     kills what escaped at the end; a guardian process (guardian.hpp) does the same and removes
//     its /dev/shm objects if the launcher itself is SIGKILLed.
//   - Paths under --log-dir are opened through private_dir: no planted link is followed.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "async_store.hpp"
#include "console.hpp"
#include "culprit_finder.hpp"
#include "exit_codes.hpp"
#include "guardian.hpp"
#include "host_rounds.hpp"
#include "log_pump.hpp"
#include "options.hpp"
#include "launcher_identity.hpp"
#include "notice_signals.hpp"
#include "process_tree.hpp"
#include "run_events.hpp"
#include "run_lock.hpp"
#include "run_files.hpp"
#include "run_report.hpp"
#include "run_timeline.hpp"
#include "store_relay.hpp"
#include "watchdog_kills.hpp"
#include "worker_environment.hpp"
#include "worker_process.hpp"
#include "worker_slot.hpp"
#include <elastic/internal/file.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/internal/private_dir.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/internal/shm_object.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/rendezvous/host_address.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/store_url.hpp>
#include <elastic/timer/watchdog.hpp>

namespace elastic::agent {

namespace detail {

inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// An error's plain message and its OS reason, to be quoted in a log line or the summary.
inline std::string plain(const error& e) {
  return e.os_code() ? fmt::format("{} ({})", e.message(), e.os_code().message()) : e.message();
}

}  // namespace detail

class launcher {
 public:
  explicit launcher(launch_options o) : opts_(std::move(o)), started_(std::chrono::steady_clock::now()) {
    open_standard_fds();
    choose_run_id();
    culprits_.emplace(opts_.run_id, opts_.max_ranks());
    const bool own_default_store = opts_.rdzv.empty();
    if (own_default_store) opts_.rdzv = "shm://elastic-" + opts_.run_id;
    const auto url = rendezvous::parse_store_url(opts_.rdzv);  // a bad URL fails before anything starts
    note_inherited_children();
    // First, before any thread exists: the signal mask (inherited by every thread) and the
    // guardian (single-threaded, holding no lock of ours).
    take_signals();

    // Objects of launchers that died with nobody left to remove them. Names that are no
    // shared-memory objects (a FIFO any local user can plant) are left alone, and said below.
    std::vector<std::string> planted;
    elastic::internal::sweep_stale_shm("elastic-store.elastic-", 2, {}, &planted);
    elastic::internal::sweep_stale_shm("elastic-timer.elastic-", 2, {}, &planted);
    elastic::internal::sweep_stale_shm("elastic.flight.", 600, {}, &planted);  // killed workers of launchers that died too

    open_logs();
    open_event_log();
    out_.emplace(opts_.quiet ? -1 : STDOUT_FILENO);
    err_.emplace(STDERR_FILENO);
    for (const auto& p : planted) say(p);

    if (opts_.host_addr.empty()) opts_.host_addr = elastic::internal::env_string("ELASTIC_HOST_ADDR").value_or("");
    if (opts_.host_addr.empty()) opts_.host_addr = rendezvous::host_address_for(url);
    if (whole_round()) opts_.host_interface = detail::interface_of(opts_.host_addr);
    open_store(url, own_default_store);
    start_relay(url);
    // Only now, as the run's owner (a second launcher of a live run is refused above), and only
    // what no process maps: a record of this run's earlier life names nothing now.
    culprits_->forget_all();
    start_watchdog();
  }

  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;

  ~launcher() { end_everything(); }

  [[nodiscard]] const launch_options& options() const noexcept { return opts_; }
  [[nodiscard]] const std::filesystem::path& log_dir() const noexcept { return files_.dir.path(); }
  [[nodiscard]] const run_report& report() const noexcept { return report_; }

  /// Runs the workers until they are done, preempted, out of restarts or in a crash loop;
  /// prints the summary to stderr and returns the exit code (exit_codes.hpp).
  int run() {
    events_.emit("launcher_start", {{"workers", opts_.nproc_per_node},
                                    {"min_ranks", opts_.min_ranks},
                                    {"max_ranks", opts_.max_ranks()},
                                    {"rdzv", opts_.rdzv},
                                    {"watchdog", watchdog_name_},
                                    {"guardian_pid", guardian_.pid()},
                                    {"max_restarts", opts_.max_restarts},
                                    {"command", join_command()}});
    slots_.resize(opts_.nproc_per_node);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].index = i;
      slots_[i].log = std::make_unique<log_pump>(std::move(files_.logs[i]), i, opts_.quiet ? nullptr : &*out_);
    }
    files_.logs.clear();
    if (whole_round()) {
      say(fmt::format("every worker restarts together on a failure (--restart-mode all{}): torchrun's way, for "
                      "workers whose process group cannot rebuild in place",
                      opts_.python_program ? ", the default for a Python program" : ""));
      rounds_.emplace(opts_, self_.name(), events_);
      request_round();
    } else {
      for (auto& s : slots_) {
        if (!start(s)) break;
      }
    }
    loop();
    if (rounds_) rounds_->stop(ending_ == ending::none && all_finished());
    end_processes();
    culprits_->forget_all();  // the records of workers that were killed
    finish_report();
    if (report_.exit_code == exit_done) remove_run_keys();
    events_.emit("launcher_end", {{"exit_code", report_.exit_code},
                                  {"outcome", report_.outcome},
                                  {"seconds", report_.seconds},
                                  {"restarts", report_.restarts},
                                  {"failures", report_.failures},
                                  {"watchdog_kills", report_.watchdog_kills},
                                  {"final_checkpoint", report_.final_checkpoint_saved},
                                  {"console_lines_dropped", report_.console_lines_dropped}});
    // The page is drawn from the whole file, launcher_end included; the summary names it.
    print_summary(timeline_.write(files_.events.get(), "elastic-run " ELASTIC_VERSION_STRING));
    // A reader that is merely slow gets a moment; a stopped or absent one does not hold us.
    out_->drain(std::chrono::seconds(1));
    err_->drain(std::chrono::seconds(1));
    return report_.exit_code;
  }

 private:
  using clock = std::chrono::steady_clock;

  using slot = worker_slot;

  /// Started with stdin, stdout or stderr closed: /dev/null there, so that no file we open
  /// later (a log) takes fd 1 or 2 and gets the console's lines.
  static void open_standard_fds() noexcept {
    for (int fd = 0; fd < 3; ++fd) {
      if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) (void)::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    }
  }

  /// --run-id, else $ELASTIC_RUN_ID, else a random one; checked wherever it came from.
  void choose_run_id() {
    if (opts_.run_id.empty()) {
      opts_.run_id = elastic::internal::env_string("ELASTIC_RUN_ID").value_or("");
      if (!opts_.run_id.empty()) detail::check_run_id(opts_.run_id, "ELASTIC_RUN_ID");
    }
    if (opts_.run_id.empty()) opts_.run_id = detail::random_run_id();
    detail::check_run_id(opts_.run_id, "run id");
  }

  /// Children we had before we started anything are not ours to end: a shell running
  /// `elastic-run ... > >(tee log) &` forks `tee` and then execs us, making `tee` our child.
  /// Killing it with the workers would cut the console before the summary.
  void note_inherited_children() {
    detail::for_each_process([&](const detail::proc_info& p) {
      if (p.ppid != ::getpid()) return;
      try {
        inherited_children_.push_back(p.pid);
      } catch (...) {  // out of memory: at worst that child is ended with the workers
      }
    });
  }

  /// Blocks the notice signals (before any thread exists: every thread inherits the mask),
  /// starts the guardian, becomes the workers' subreaper and opens the signalfd.
  void take_signals() {
    signals_ = detail::launcher_signals(opts_.preempt_signals);
    ::signal(SIGPIPE, SIG_IGN);
    ::pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    guardian_ = guardian::start(self_.mark());
    // Orphans of the workers (a wrapper's trainers, what escaped with setsid) become ours.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    sigfd_ = elastic::internal::unique_fd(::signalfd(-1, &signals_, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigfd_) throw os_error("cannot make a signalfd");
  }

  /// Our events (and our watchdog's) carry the run id; the environment is left as we found it.
  void open_event_log() {
    event_identity identity = event_identity::from_env();
    identity.run_id = opts_.run_id;
    identity.rank.reset();  // a launcher has no rank, even one started from inside a worker
    events_ = event_log(std::make_shared<events::fd_sink>(files_.events.get()), std::move(identity));
    seen_ = run_events(files_.events.get(), files_.events_offset);
  }

  void open_store(const rendezvous::store_url& url, bool own_default_store) {
    if (own_default_store) {
      // This launcher's alone, for its life: a second launcher of this run is refused.
      store_object_.own("elastic-store." + url.name, &guardian_);
      auto shm = open_owned_store(url.name, store_object_, opts_.run_id);
      store_.emplace(opts_.rdzv, std::move(shm));
    } else {
      // Shared with other launchers (and left alone at the end); opened by the store's thread.
      store_.emplace(opts_.rdzv, nullptr);
    }
  }

  /// One participant per host: with an etcd store the workers reach it through this launcher's
  /// relay, in a directory only this user can enter. Without one (it cannot start), each
  /// worker speaks to the store itself, as with --no-store-relay.
  void start_relay(const rendezvous::store_url& url) {
    if (url.scheme != rendezvous::store_url::kind::etcd || !opts_.store_relay) return;
    sweep_dead_relays();
    try {
      std::string dir = "/tmp/elastic-relay-XXXXXX";  // short: a socket path holds at most 107 bytes
      if (::mkdtemp(dir.data()) == nullptr) throw os_error("mkdtemp for the store relay's directory");
      relay_dir_ = dir;
      relay_.emplace(rendezvous::open_store(opts_.rdzv), relay_dir_ / "store.sock", opts_.host_addr);
      opts_.relay = relay_->url();
    } catch (const error& e) {
      say(fmt::format("no store relay ({}): each worker speaks to the store itself", detail::plain(e)));
      stop_relay();
    }
  }

  /// The relay directories of this user's launchers that were SIGKILLed (no one listens on
  /// their socket, and nothing in them changed for a minute: a live launcher binds and listens
  /// within moments of making its directory). Nobody else's, nothing that is not a directory.
  static void sweep_dead_relays() noexcept {
    std::error_code ec;
    const auto now = std::filesystem::file_time_type::clock::now();
    for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with("elastic-relay-") || name.size() != 20) continue;
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
      const auto sock = entry.path() / "store.sock";
      const auto changed = std::filesystem::last_write_time(::access(sock.c_str(), F_OK) == 0 ? sock : entry.path(), ec);
      if (ec || now - changed < std::chrono::minutes(1)) continue;
      if (::access(sock.c_str(), F_OK) == 0) {
        elastic::internal::unique_fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!fd) continue;
        try {
          const sockaddr_un a = rendezvous::detail::relay::socket_address(sock.string());
          if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0 || errno != ECONNREFUSED) continue;
        } catch (...) {
          continue;
        }
      }
      std::filesystem::remove_all(entry.path(), ec);
    }
  }

  void stop_relay() noexcept {
    relay_.reset();
    opts_.relay.clear();
    if (!relay_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(relay_dir_, ec);
      relay_dir_.clear();
    }
  }

  /// Per launcher: two launchers of a run may share a host (and /dev/shm) with --rdzv.
  void start_watchdog() {
    watchdog_name_ = self_.watchdog_name(opts_.run_id);
    watchdog_object_.own(timer::detail::shm_object_name(watchdog_name_), &guardian_);
    timer::watchdog_options wo;
    wo.name = watchdog_name_;
    wo.events = events_;
    wo.on_kill = [this](const timer::watchdog_kill_report& r) { watchdog_kills_.add(r); };
    // A hung worker's stacks, before its kill, into its log (write_stacks): ptrace from this
    // process, the workers' parent. reap() copes with the stops that shows this thread.
    wo.stack_dump = opts_.stack_dump;
    wo.stack_dump_limit = opts_.stack_dump_limit;
    wo.on_stack = [this](const timer::stack_dump& d) { watchdog_kills_.add_stack(d); };
    wo.on_warning = [this](const timer::watchdog_warning_report& r) { watchdog_kills_.add_warning(r); };
    wo.descendants_only = true;  // a worker's slot may name no process this launcher did not start
    watchdog_ = std::make_unique<timer::watchdog>(std::move(wo));
  }

  enum class ending { none, preempted, failed, crash_loop };

  std::string participant(const slot& s) const { return self_.participant(s.index); }

  std::string join_command() const { return fmt::format("{}", fmt::join(opts_.command, " ")); }

  /// Creates (or opens) DIR/RUN_ID, the rank logs and the events file (run_files.hpp).
  void open_logs() {
    files_ = run_files::open(opts_);
    timeline_ = run_timeline::open(opts_);
  }

  std::vector<std::string> environment(const slot& s) const {
    std::optional<round_placement> placed;
    if (round_) {
      placed = round_placement{.group_rank = round_->rank,
                               .group_world = round_->world,
                               .master_addr = round_->master_addr,
                               .master_port = round_->master_port,
                               .restart_count = rounds_started_ - 1,
                               .error_file = error_file(s).string()};
    }
    return worker_environment(opts_, {.index = s.index,
                                      .starts = s.starts,
                                      .evictions = s.evictions,
                                      .participant = participant(s),
                                      .watchdog = watchdog_name_,
                                      .round = placed ? &*placed : nullptr});
  }

  /// TORCHELASTIC_ERROR_FILE of a slot: torch's @record writes the uncaught exception there.
  std::filesystem::path error_file(const slot& s) const { return files_.dir / fmt::format("error-{}.json", s.index); }

  /// The launcher's own message, on its stderr (never blocking).
  void say(const std::string& text) { err_->write("elastic-run: " + text + "\n"); }

  /// Starts (or restarts) a slot's worker; false when it cannot be started at all.
  bool start(slot& s) {
    s.restart_at.reset();
    s.retire = 0;
    seen_.update();
    s.checkpoints_at_start = seen_.checkpoints();
    if (whole_round()) {
      try {
        files_.dir.remove_file(error_file(s).filename().string());  // a previous life's
      } catch (const error&) {  // none
      }
    }
    try {
      s.proc = worker_process::spawn(opts_.command, environment(s));
    } catch (const error& e) {
      s.log->note(fmt::format("worker {} could not start: {}", s.index, detail::plain(e)));
      events_.emit("worker_start_failed", {{"slot", s.index}, {"message", e.what()}});
      report_.outcome = fmt::format("failed: {}", detail::plain(e));
      begin_shutdown(ending::failed);
      s.done = true;
      return false;
    }
    guardian_.watch(s.proc.pid());
    for (int fd : {s.proc.stdout_fd(), s.proc.stderr_fd()}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (s.starts > 0) ++report_.restarts;
    // The command once per log (it is in launcher_start too); the console stays readable.
    s.log->note(s.starts == 0 ? fmt::format("worker {} started: pid {}, restart 0: {}", s.index, s.proc.pid(), join_command())
                              : fmt::format("worker {} started: pid {}, restart {}", s.index, s.proc.pid(), s.starts));
    if (s.starts == 0) {
      events_.emit("worker_start", {{"slot", s.index}, {"worker_pid", s.proc.pid()}, {"restart_count", s.starts}});
    } else {
      events_.emit("worker_restart", {{"slot", s.index},
                                      {"worker_pid", s.proc.pid()},
                                      {"restart_count", s.starts},
                                      {"delay_ms", static_cast<std::int64_t>(s.delay.count())}});
    }
    s.delay = std::chrono::milliseconds(0);
    ++s.starts;
    return true;
  }

  [[nodiscard]] static bool group_alive(pid_t pgid) noexcept { return pgid > 0 && ::kill(-pgid, 0) == 0; }

  /// Whether the slot still has something running (its worker, or its group draining).
  [[nodiscard]] bool busy(slot& s) {
    if (s.proc.running()) return true;
    if (s.draining_group > 0 && !group_alive(s.draining_group)) {
      guardian_.forget(s.draining_group);
      s.draining_group = 0;
    }
    if (s.draining_group > 0) {
      // After the SIGKILLs at the grace, a group that still shows (zombies nobody reaps) does
      // not keep the run open for long.
      if (killed_after_grace_ && clock::now() - killed_at_ > std::chrono::seconds(2)) {
        guardian_.forget(s.draining_group);
        s.draining_group = 0;
        return false;
      }
      return true;
    }
    if (s.proc.stdout_fd() >= 0 || s.proc.stderr_fd() >= 0) {
      // The group is gone; what still holds its pipes escaped it: read what is there and stop.
      take_last_output(s);
    }
    return false;
  }

  /// What the loop waits for: whether anything still runs or waits to, whether a group drains
  /// after its leader exited, and when the next restart is due.
  struct pending {
    bool any = false;
    bool draining = false;
    std::optional<clock::time_point> next_restart;
  };

  pending what_is_pending() {
    pending p;
    if (rounds_ && ending_ == ending::none && (awaiting_round_ || round_stopping_ || round_request_at_)) p.any = true;
    if (round_request_at_ && (!p.next_restart || *round_request_at_ < *p.next_restart)) p.next_restart = round_request_at_;
    if (round_stopping_ && !round_killed_ && (!p.next_restart || round_kill_at_ < *p.next_restart)) {
      p.next_restart = round_kill_at_;
    }
    for (auto& s : slots_) {
      if (busy(s)) {
        p.any = true;
        p.draining = p.draining || !s.proc.running();
      }
      if (s.restart_at) {
        p.any = true;
        // Due when its backoff is over and its alive key is retired (or that took too long);
        // the store thread's eventfd wakes us for the second.
        const auto due = store_->done(s.retire) ? *s.restart_at : std::max(*s.restart_at, s.retire_by);
        if (!p.next_restart || due < *p.next_restart) p.next_restart = due;
      }
    }
    return p;
  }

  /// How long poll() may sleep, in ms (-1: until something happens).
  int poll_timeout(const pending& p) const {
    auto until = [](clock::time_point t) {
      return static_cast<int>(std::clamp<std::int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(t - clock::now()).count() + 1, 0, 60'000));
    };
    int timeout = -1;
    auto at_most = [&](int ms) { timeout = timeout < 0 ? ms : std::min(timeout, ms); };
    if (ending_ != ending::none && !killed_after_grace_) at_most(until(grace_deadline_));
    if (p.next_restart) at_most(until(*p.next_restart));
    if (p.draining) at_most(100);  // a draining group's last member may not be our child
    at_most(250);  // the workers' events: a collective that failed may point at a culprit
    return timeout;
  }

  /// Sleeps until a worker writes, a signal comes, the console takes more, the store answers or
  /// `timeout` ms pass; then reads what came.
  void wait_and_read(int timeout) {
    std::vector<pollfd> fds{{sigfd_.get(), POLLIN, 0}};
    std::vector<std::pair<slot*, int>> owners{{nullptr, 0}};
    for (auto& s : slots_) {
      if (s.proc.stdout_fd() >= 0) fds.push_back({s.proc.stdout_fd(), POLLIN, 0}), owners.emplace_back(&s, 0);
      if (s.proc.stderr_fd() >= 0) fds.push_back({s.proc.stderr_fd(), POLLIN, 0}), owners.emplace_back(&s, 1);
    }
    for (console* c : {&*out_, &*err_}) {
      if (c->waiting_fd() >= 0) fds.push_back({c->waiting_fd(), POLLOUT, 0}), owners.emplace_back(nullptr, 2);
    }
    fds.push_back({store_->done_fd(), POLLIN, 0});
    owners.emplace_back(nullptr, 3);
    if (watchdog_kills_.wake_fd() >= 0) fds.push_back({watchdog_kills_.wake_fd(), POLLIN, 0}), owners.emplace_back(nullptr, 4);
    if (rounds_) fds.push_back({rounds_->wake_fd(), POLLIN, 0}), owners.emplace_back(nullptr, 5);
    const int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) throw os_error("elastic-run: poll failed");
    if (n > 0) {
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0 && owners[i].first != nullptr) pump(*owners[i].first, owners[i].second);
      }
      if (fds[0].revents & POLLIN) read_signals();
    }
  }

  /// Starts the slots whose restart is due (unless the run is ending).
  void start_due_restarts() {
    if (ending_ != ending::none) return;
    for (auto& s : slots_) {
      if (!s.restart_at || clock::now() < *s.restart_at) continue;
      if (!store_->done(s.retire)) {
        if (clock::now() < s.retire_by) continue;
        store_->cancel(s.retire);  // the store does not answer: the new life must not lose its key to it
        events_.emit("launcher_store_error", {{"slot", s.index},
                                              {"message", "the previous life's alive key was not retired in time; "
                                                          "restarting without"}});
      }
      start(s);
    }
  }

  void loop() {
    for (;;) {
      const pending p = what_is_pending();
      if (!p.any) return;
      wait_and_read(poll_timeout(p));
      write_stacks();
      store_->read_done();
      out_->flush();
      err_->flush();
      guardian_.flush();
      start_due_restarts();
      if (rounds_) advance_round();
      if (ending_ != ending::none && !killed_after_grace_ && clock::now() >= grace_deadline_) kill_stragglers();
      for (auto& m : store_->take_errors()) events_.emit("launcher_store_error", {{"message", m}});
      seen_.update();
      for (const pid_t pid : seen_.take_collective_failures()) find_culprit(pid, std::nullopt);
    }
  }

  /// Reads what a worker wrote; false at EOF.
  bool pump(slot& s, int stream) {
    const int fd = stream == 0 ? s.proc.stdout_fd() : s.proc.stderr_fd();
    if (fd < 0) return false;
    char buf[65536];
    for (int rounds = 0; rounds < 16; ++rounds) {  // a worker that never stops writing yields to the others
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        s.log->feed(stream, std::string_view(buf, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      s.log->flush(stream);
      stream == 0 ? s.proc.close_stdout() : s.proc.close_stderr();
      return false;
    }
    return true;
  }

  /// Takes what is still in a slot's pipes and lets them go (a process that escaped the group
  /// may hold them open forever).
  void take_last_output(slot& s) {
    for (int stream : {0, 1}) {
      // Bounded: what escaped may never stop writing.
      for (int round = 0; round < 16 && pump(s, stream); ++round) {
        pollfd p{stream == 0 ? s.proc.stdout_fd() : s.proc.stderr_fd(), POLLIN, 0};
        if (p.fd < 0 || ::poll(&p, 1, 0) <= 0) break;
      }
      s.log->flush(stream);
    }
    s.proc.close_stdout();
    s.proc.close_stderr();
  }

  void read_signals() {
    signalfd_siginfo si;
    while (::read(sigfd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      const std::string name = detail::signal_display_name(sig);
      if (ending_ == ending::none) {
        events_.emit("launcher_signal", {{"signal", name}, {"sender_pid", static_cast<std::int64_t>(si.ssi_pid)},
                                         {"grace_ms", opts_.grace.count()}});
        say(fmt::format("{}: a preemption notice: asking {} workers to checkpoint and exit within {:.1f} s", name,
                        running_count(), opts_.grace.count() / 1e3));
        report_.outcome = "preempted";
        begin_shutdown(ending::preempted);
      } else if (clock::now() - shutdown_at_ < detail::same_notice_window) {
        // Slurm, systemd and time limits signal every process, sometimes with several signals:
        // one notice, not an order to kill.
        events_.emit("launcher_signal", {{"signal", name}, {"sender_pid", static_cast<std::int64_t>(si.ssi_pid)},
                                         {"same_notice", true}});
        say(fmt::format("{} {:.1f} s after the notice: the same notice, the workers keep their grace", name,
                        std::chrono::duration<double>(clock::now() - shutdown_at_).count()));
      } else if (!killed_after_grace_) {
        events_.emit("launcher_signal", {{"signal", name}, {"sender_pid", static_cast<std::int64_t>(si.ssi_pid)},
                                         {"kill_now", true}});
        say(fmt::format("{} again: killing the workers now", name));
        kill_stragglers();
      }
    }
  }

  std::size_t running_count() const {
    return static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](const slot& s) { return s.proc.running(); }));
  }

  slot* slot_of(pid_t pid) {
    for (auto& s : slots_)
      if (s.proc.pid() == pid) return &s;
    return nullptr;
  }

  /// The slot whose worker is, or last was, `pid`.
  slot* slot_of_life(pid_t pid) {
    if (slot* s = slot_of(pid)) return s;
    for (auto& s : slots_)
      if (s.last_pid == pid) return &s;
    return nullptr;
  }

  /// The watchdog's stack dumps, each into its worker's log (and so on the console, as the
  /// worker's own lines); one of a process that is no worker's goes to our stderr. A dump
  /// finished after its worker was reaped (the launcher stopped it while it was captured) goes
  /// to the log of the slot it ran in.
  void write_stacks() {
    for (const auto& st : watchdog_kills_.take_stacks()) {
      slot* s = slot_of_life(st.pid);
      if (s == nullptr && st.group > 0) s = slot_of_life(st.group);  // a trainer that a wrapper started
      if (s != nullptr) s->log->lines(st.text);
      else err_->write(st.text);
    }
  }

  /// The next child that exited, left to be reaped (WNOWAIT); false when none has. Notices of
  /// stops are taken off the queue on the way: while the watchdog's stack capture (a thread of
  /// this process) holds a worker stopped, the kernel reports the worker's ptrace stops to every
  /// thread here, waitid() included, even without WSTOPPED. Reaping one would lose the worker.
  static bool next_exited_child(siginfo_t& si) noexcept {
    for (int notices = 0; notices < 4096; ++notices) {
      si = siginfo_t{};
      if (::waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) return false;
      if (si.si_code == CLD_EXITED || si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED) return true;
      siginfo_t notice{};
      ::waitid(P_PID, static_cast<id_t>(si.si_pid), &notice, WSTOPPED | WCONTINUED | WNOHANG | __WALL);
    }
    return false;
  }

  /// Reaps every child that ended: workers, orphans that became ours, the guardian.
  void reap() {
    write_stacks();  // a dump taken before a kill goes into the log before the worker's end
    for (;;) {
      siginfo_t si{};
      if (!next_exited_child(si)) return;
      // The watchdog hands a dump over before its signal: any dump of this child is queued by
      // now, and goes into its log while the slot still knows the child's pid.
      write_stacks();
      const pid_t pid = si.si_pid;
      slot* s = slot_of(pid);
      const bool graceful = ending_ != ending::none && !killed_after_grace_;
      // While the leader is a zombie its pid cannot be reused, so its group id still means it:
      // what it left behind in the group is killed now (a restarted worker must never meet its
      // previous life's children), unless the group has its grace to finish in.
      if (s != nullptr && !graceful) ::kill(-pid, SIGKILL);
      int st = 0;
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      forget_inherited(pid);
      if (pid == guardian_.pid()) {
        guardian_.reaped();
        events_.emit("guardian_lost", {{"guardian_pid", pid}});
        say(fmt::format("the guardian (pid {}) died: if this launcher is killed now, its workers may survive it",
                        pid));
        continue;
      }
      if (s == nullptr) continue;  // an orphan of a worker, reparented to us: reaped
      s->proc.reaped();
      s->last_pid = pid;
      if (graceful && group_alive(pid)) {
        s->draining_group = pid;  // the rest of its group still checkpoints; pipes stay open
      } else {
        guardian_.forget(pid);
        take_last_output(*s);
      }
      exited(*s, pid, st);
    }
  }

  /// Whether the watchdog we host killed `pid`. It signals first and calls on_kill right after,
  /// on its own thread: a worker reaped in between (a loaded machine; seen under TSan) is the
  /// one it is signalling now, and its on_kill is waited for (bounded). Other deaths wait for
  /// nothing.
  bool killed_by_watchdog(pid_t pid) {
    for (int i = 0; i < 2000 && !watchdog_kills_.killed(pid) && watchdog_ && watchdog_->signalling() == pid; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return watchdog_kills_.killed(pid);
  }

  void exited(slot& s, pid_t pid, int st) {
    seen_.update();
    const bool signaled = WIFSIGNALED(st);
    const int code = signaled ? -WTERMSIG(st) : WEXITSTATUS(st);
    const bool by_watchdog = signaled && killed_by_watchdog(pid);
    const bool noticed = code == exit_preempted && seen_.preempted(pid);
    s.last_code = code;
    std::string how;
    if (signaled) {
      how = fmt::format("killed by {}{}", detail::signal_display_name(-code),
                        by_watchdog ? " (the watchdog: a timer scope expired)" : "");
    } else if (code == exit_preempted) {
      how = seen_.saved_final_checkpoint(pid)                ? fmt::format("exited with code {} (preempted, state saved)", code)
            : noticed || ending_ == ending::preempted ? fmt::format("exited with code {} (preempted)", code)
                                                      : fmt::format("exited with code {} (retry me, but no preemption "
                                                                    "notice came)",
                                                                    code);
    } else {
      how = fmt::format("exited with code {}", code);
    }
    s.log->note(fmt::format("worker {} (pid {}) {}", s.index, pid, how));
    find_culprit(pid, code);
    events_.emit("worker_exit", {{"slot", s.index},
                                 {"worker_pid", pid},
                                 {"code", signaled ? event_value(nullptr) : event_value(code)},
                                 {"signal", signaled ? event_value(detail::signal_display_name(-code)) : event_value(nullptr)},
                                 {"watchdog", by_watchdog}});
    if (by_watchdog) ++report_.watchdog_kills;
    retire_alive_key(s);
    if (whole_round()) {
      round_exit(s, pid, code, how, by_watchdog, noticed);
      return;
    }

    if (ending_ != ending::none || code == 0) {
      s.done = true;
      return;
    }
    if (code == exit_preempted && noticed) {
      // It got a notice of its own (the platform signalled it, not us) and saved: not a failure.
      ++report_.preempted_restarts;
      restart(s, std::chrono::milliseconds(0));
      return;
    }
    if (code == exit_preempted) {
      tempfail(s, how);
      return;
    }
    if (!signaled && seen_.evicted(pid) && s.evictions < opts_.max_restarts) {
      // Its loop left the group as a persistent straggler (straggler_evicted): not a failure. The
      // library stops evicting once a slot comes back no faster; the bound is for older workers.
      ++s.evictions;
      say(fmt::format("worker {} (pid {}) left its group as a straggler: restarting it (eviction {} of this slot, "
                      "not counted against --max-restarts)",
                      s.index, pid, s.evictions));
      restart(s, std::chrono::milliseconds(0));
      return;
    }
    ++report_.failures;
    if (!by_watchdog) failures_at_.push_back(detail::wall_now());  // a hang's cost starts with the hang
    if (report_.failures > opts_.max_restarts) {
      report_.outcome = fmt::format("failed: worker {} {}, and all {} restarts are used up", s.index, how, opts_.max_restarts);
      say(fmt::format("worker {} {}; {} restarts used up: stopping the others", s.index, how, opts_.max_restarts));
      s.done = true;
      begin_shutdown(ending::failed);
      return;
    }
    say(fmt::format("worker {} {}: restarting it ({} of {} restarts)", s.index, how, report_.failures, opts_.max_restarts));
    restart(s, std::chrono::milliseconds(0));
  }

  [[nodiscard]] bool whole_round() const noexcept { return opts_.restarts == restart_mode::whole_round; }

  [[nodiscard]] bool all_finished() const noexcept {
    return !slots_.empty() && std::all_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.done && s.last_code == 0; });
  }

  /// A worker of a round decided before it started (--restart-mode all) ended: any end but
  /// success stops every worker of this host and starts the next round of hosts, as torchrun
  /// does. What counts against --max-restarts, a notice, the crash-loop rule and the
  /// --max-restarts ending are those of a worker restarted in place.
  void round_exit(slot& s, pid_t pid, int code, const std::string& how, bool by_watchdog, bool noticed) {
    if (ending_ != ending::none) {
      s.done = true;
      return;
    }
    if (round_stopping_) return;  // stopped with its round: no failure of its own
    if (code == 0) {
      s.done = true;
      return;
    }
    std::string what = fmt::format("worker {} {}", s.index, how);
    if (const auto message = torch_error(s); !message.empty()) {
      what += fmt::format(": {}", message);
      events_.emit("worker_error", {{"slot", s.index}, {"worker_pid", pid}, {"message", message}});
      if (report_.worker_errors.size() == max_worker_errors) report_.worker_errors.erase(report_.worker_errors.begin());
      report_.worker_errors.push_back(fmt::format("worker {} (pid {}): {}", s.index, pid, message));
    }
    if (code == exit_preempted && noticed) {
      ++report_.preempted_restarts;
      say(fmt::format("{}: restarting every worker", what));
      stop_round(what, std::chrono::milliseconds(0));
      return;
    }
    if (code == exit_preempted) {
      tempfail(s, how);  // restart() stops the round
      return;
    }
    ++report_.failures;
    if (!by_watchdog) failures_at_.push_back(detail::wall_now());
    if (report_.failures > opts_.max_restarts) {
      report_.outcome = fmt::format("failed: {}, and all {} restarts are used up", what, opts_.max_restarts);
      say(fmt::format("{}; {} restarts used up: stopping the others", what, opts_.max_restarts));
      s.done = true;
      begin_shutdown(ending::failed);
      return;
    }
    say(fmt::format("{}: restarting every worker ({} of {} restarts)", what, report_.failures, opts_.max_restarts));
    stop_round(what, std::chrono::milliseconds(0));
  }

  /// What torch's @record wrote to the slot's TORCHELASTIC_ERROR_FILE: its exception's message
  /// ("" when there is none or it cannot be read). Read through the run's private directory, and
  /// at most 1 MiB of it: the worker wrote it, not us.
  std::string torch_error(const slot& s) const {
    try {
      const auto j = elastic::internal::json::parse(elastic::internal::read_small_file_at(
          files_.dir.fd(), error_file(s).filename().string(), error_file(s), 1 << 20));
      const auto* m = j.find("message");
      if (m != nullptr && m->is_object()) m = m->find("message");  // {"message": {"message": ...}}
      if (m == nullptr || !m->is_string()) return {};
      std::string msg = m->as_string();
      if (msg.size() > 500) msg = msg.substr(0, 500) + "...";
      return elastic::internal::printable(msg);
    } catch (const std::exception&) {  // absent, damaged, not ours to read
      return {};
    }
  }

  /// Stops every worker of this host's round (SIGTERM, SIGKILL after round_stop_wait) and asks
  /// for the next round after `delay`; the workers start again once it is there and they are gone.
  void stop_round(const std::string& why, std::chrono::milliseconds delay) {
    round_stopping_ = true;
    round_killed_ = false;
    round_kill_at_ = clock::now() + std::min(opts_.grace, round_stop_wait);
    events_.emit("launcher_round_stop", {{"round", round_ ? round_->number : 0},
                                         {"reason", why},
                                         {"delay_ms", static_cast<std::int64_t>(delay.count())}});
    round_.reset();
    for (auto& s : slots_) {
      s.done = false;
      s.restart_at.reset();
      s.proc.signal(SIGTERM);
    }
    round_request_at_ = clock::now() + delay;
  }

  /// Asks the hosts for the next round (the first one at the start).
  void request_round() {
    try {
      rounds_->request();
      awaiting_round_ = true;
    } catch (const error& e) {
      report_.outcome = fmt::format("failed: no round could start: {}", detail::plain(e));
      say(fmt::format("no round could start: {}", detail::plain(e)));
      begin_shutdown(ending::failed);
    }
  }

  /// The rounds of hosts, each time the loop wakes: an error ends the run; a change of the
  /// hosts stops this host's workers; a round that came starts them, once the last are gone.
  void advance_round() {
    if (ending_ != ending::none) return;
    if (auto e = rounds_->take_error(); !e.empty()) {
      report_.outcome = fmt::format("failed: no round of hosts: {}", e);
      say(fmt::format("no round of hosts: {}", e));
      begin_shutdown(ending::failed);
      return;
    }
    if (auto why = rounds_->take_change(); !why.empty() && round_ && !round_stopping_) {
      say(fmt::format("{}: restarting every worker of this host (not counted against --max-restarts)", why));
      stop_round(why, std::chrono::milliseconds(0));
    }
    const auto now = clock::now();
    if (round_stopping_) {
      bool running = false;
      for (auto& s : slots_) running = busy(s) || running;
      if (!running) {
        round_stopping_ = false;
      } else if (!round_killed_ && now >= round_kill_at_) {
        round_killed_ = true;
        for (auto& s : slots_) {
          if (!s.proc.running()) continue;
          s.log->note(fmt::format("worker {} (pid {}) did not stop within {:.1f} s of its round's end: SIGKILL", s.index,
                                  s.proc.pid(), std::chrono::duration<double>(round_stop_wait).count()));
          s.proc.signal(SIGKILL);
        }
      }
    }
    if (round_request_at_ && now >= *round_request_at_) {
      round_request_at_.reset();
      request_round();
    }
    if (auto r = rounds_->take_round()) {
      next_round_ = std::move(r);
      awaiting_round_ = false;
    }
    if (next_round_ && !round_stopping_ && !round_request_at_) start_round();
  }

  void start_round() {
    round_ = std::move(next_round_);
    next_round_.reset();
    ++rounds_started_;
    round_started_at_.push_back(detail::wall_now());
    const std::size_t first = round_->rank * opts_.nproc_per_node;
    events_.emit("launcher_round_start", {{"round", round_->number},
                                          {"group_rank", round_->rank},
                                          {"group_world_size", round_->world},
                                          {"first_rank", first},
                                          {"world_size", round_->world * opts_.nproc_per_node},
                                          {"master_addr", round_->master_addr},
                                          {"master_port", round_->master_port},
                                          {"restart_count", rounds_started_ - 1}});
    say(fmt::format("round {}: host {} of {}, ranks {} to {} of {}, MASTER_ADDR={} MASTER_PORT={}", round_->number,
                    round_->rank, round_->world, first, first + opts_.nproc_per_node - 1,
                    round_->world * opts_.nproc_per_node, round_->master_addr, round_->master_port));
    for (auto& s : slots_) {
      s.done = false;
      if (!start(s)) break;
    }
  }

  /// How long the workers of a round being ended get between SIGTERM and SIGKILL (at most the
  /// grace): a torch script in a collective with a dead peer has nothing to save.
  static constexpr std::chrono::milliseconds round_stop_wait{5000};
  /// The summary quotes the last this many exceptions of failed workers.
  static constexpr std::size_t max_worker_errors = 5;

  /// A worker exited 75 with no preemption notice: "retry me", but nothing says why. Restarted
  /// after a backoff; more than --max-restarts of these in a row, with no checkpoint committed
  /// since the slot last started, is a crash loop that ends the run.
  void tempfail(slot& s, const std::string& how) {
    if (seen_.checkpoints() > s.checkpoints_at_start) {  // progress: a new row begins
      s.tempfail_streak = 0;
      s.backoff = detail::first_backoff;
    }
    ++s.tempfail_streak;
    if (s.tempfail_streak > opts_.max_restarts) {
      report_.outcome = fmt::format("crash loop: worker {} exited 75 {} times in a row with no preemption notice and "
                                    "no checkpoint committed in between",
                                    s.index, s.tempfail_streak);
      say(fmt::format("worker {} {}: {} times in a row with no progress (more than --max-restarts {}): a crash loop, "
                      "stopping the others; exit {} (do not requeue)",
                      s.index, how, s.tempfail_streak, opts_.max_restarts, exit_crash_loop));
      events_.emit("launcher_crash_loop", {{"slot", s.index}, {"exits_in_a_row", s.tempfail_streak}});
      s.done = true;
      begin_shutdown(ending::crash_loop);
      return;
    }
    restart(s, s.backoff);
    s.backoff = std::min(s.backoff * 2, detail::max_backoff);
    ++report_.backoff_restarts;
    say(fmt::format("worker {} {}: restarting it in {:.1f} s ({} of {} such exits in a row without a checkpoint)",
                    s.index, how, s.delay.count() / 1e3, s.tempfail_streak, opts_.max_restarts));
    events_.emit("worker_backoff", {{"slot", s.index},
                                    {"delay_ms", static_cast<std::int64_t>(s.delay.count())},
                                    {"exits_in_a_row", s.tempfail_streak}});
  }

  /// The group sees the death at once instead of after the heartbeat timeout. Queued: the store
  /// may not answer, and the loop must not wait for it.
  void retire_alive_key(slot& s) {
    const rendezvous::rendezvous_options defaults;  // the workers' key prefix is the default one
    s.retire = store_->erase(rendezvous::alive_key(defaults.key_prefix, opts_.run_id, participant(s)));
    s.retire_by = clock::now() + retire_wait;
  }

  /// A finished run leaves nothing behind in a store that other runs share: the last host to
  /// finish removes the run's keys (rendezvous::remove_finished_run). Bounded like every store
  /// call at the end: a store that does not answer leaves them, and the run still exits 0.
  void remove_run_keys() {
    if (!store_) return;
    auto removed = std::make_shared<std::atomic<std::int64_t>>(-2);  // -2: not done, -1: others live
    const rendezvous::rendezvous_options defaults;  // the workers' key prefix is the default one
    const auto t = store_->call(fmt::format("removing the keys of finished run '{}'", opts_.run_id),
                                [removed, prefix = defaults.key_prefix, run = opts_.run_id](rendezvous::store& st) {
                                  const auto n = rendezvous::remove_finished_run(st, prefix, run);
                                  removed->store(n ? static_cast<std::int64_t>(*n) : -1);
                                });
    const auto until = clock::now() + retire_wait;
    while (!store_->done(t) && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (auto& m : store_->take_errors()) events_.emit("launcher_store_error", {{"message", m}});
    if (const auto n = removed->load(); n >= -1) {
      events_.emit("run_keys_removed", {{"keys", std::max<std::int64_t>(n, 0)},
                                        {"others_live", n == -1}});
    }
  }

  /// Starts the slot's next life after `delay` and once its previous life's alive key is retired.
  void restart(slot& s, std::chrono::milliseconds delay) {
    if (whole_round()) {
      s.delay = delay;
      stop_round(fmt::format("worker {} exited {}", s.index, s.last_code), delay);
      return;
    }
    s.delay = delay;
    s.restart_at = clock::now() + delay;
  }

  /// How long a restart waits for the store to retire the previous life's key (the etcd call's
  /// own bound, and a little more).
  static constexpr std::chrono::milliseconds retire_wait{4000};

  void begin_shutdown(ending why) {
    if (ending_ != ending::none) return;
    ending_ = why;
    shutdown_at_ = clock::now();
    grace_deadline_ = shutdown_at_ + opts_.grace;
    for (auto& s : slots_) {
      if (s.restart_at) {  // a restart waiting out its backoff will not happen
        s.restart_at.reset();
        s.done = true;
      }
      s.proc.signal(SIGTERM);
    }
  }

  void kill_stragglers() {
    killed_after_grace_ = true;
    killed_at_ = clock::now();
    for (auto& s : slots_) {
      if (s.proc.running()) {
        ++report_.stragglers_killed;
        s.log->note(fmt::format("worker {} (pid {}) did not exit within the grace: SIGKILL", s.index, s.proc.pid()));
        events_.emit("worker_grace_exceeded", {{"slot", s.index}, {"worker_pid", s.proc.pid()}});
        s.proc.signal(SIGKILL);
      } else if (s.draining_group > 0 && group_alive(s.draining_group)) {
        ++report_.stragglers_killed;
        s.log->note(fmt::format("worker {}'s process group {} still ran after the grace: SIGKILL", s.index,
                                s.draining_group));
        events_.emit("worker_grace_exceeded", {{"slot", s.index}, {"worker_group", s.draining_group}});
        ::kill(-s.draining_group, SIGKILL);
      }
    }
  }

  /// After the workers: kills and reaps whatever of theirs is left (orphans reparented to us,
  /// processes that escaped with setsid and carry our mark), for at most a few seconds.
  void end_processes() noexcept {
    const pid_t self = ::getpid();
    const std::string mark = self_.mark();
    const auto until = clock::now() + std::chrono::seconds(3);
    for (;;) {
      // Reap what ended (orphans of ours), then look for what still runs.
      for (;;) {
        siginfo_t si{};
        if (!next_exited_child(si)) break;
        int st = 0;
        while (::waitpid(si.si_pid, &st, 0) < 0 && errno == EINTR) {
        }
        forget_inherited(si.si_pid);
        if (si.si_pid == guardian_.pid()) guardian_.reaped();
      }
      bool left = false;
      detail::for_each_process([&](const detail::proc_info& p) {
        if (p.pid == self || p.pid == guardian_.pid() || p.state == 'Z' || p.state == 'X' || inherited(p.pid)) return;
        if (p.ppid == self || (p.uid == ::geteuid() && detail::environ_has_prefix(p.pid, mark.c_str(), mark.size()))) {
          left = true;
          ::kill(p.pid, SIGKILL);
        }
      });
      if (!left || clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  [[nodiscard]] bool inherited(pid_t pid) const noexcept {
    return std::find(inherited_children_.begin(), inherited_children_.end(), pid) != inherited_children_.end();
  }
  /// A reaped child's pid may come back as one of ours.
  void forget_inherited(pid_t pid) noexcept { std::erase(inherited_children_, pid); }

  /// Ends what this launcher started, in order, whatever state it is in; never throws.
  void end_everything() noexcept {
    for (auto& s : slots_) {
      if (s.draining_group > 0) ::kill(-s.draining_group, SIGKILL);
    }
    // A dump the watchdog finished after the loop's last look (of a worker stopped at the end
    // while it was captured) still goes into its rank's log, while the slots are there.
    if (watchdog_) watchdog_->stop();
    try {
      write_stacks();
    } catch (...) {  // out of memory: the event has the dump
    }
    slots_.clear();  // kills and reaps whatever still runs
    end_processes();
    stop_relay();  // no worker is left to speak through it
    watchdog_.reset();
    watchdog_object_.remove();
    if (store_) store_->stop(std::chrono::seconds(2));
    store_object_.remove();
    guardian_.finish(std::chrono::seconds(3));
  }

  /// Exit code and the figures the workers' own events give.
  void finish_report() {
    seen_.update();
    report_.workers = slots_.size();
    report_.seconds = std::chrono::duration<double>(clock::now() - started_).count();
    if (ending_ == ending::failed) {
      report_.exit_code = exit_failed;
    } else if (ending_ == ending::crash_loop) {
      report_.exit_code = exit_crash_loop;
    } else if (ending_ == ending::preempted) {
      report_.exit_code = exit_preempted;
    } else {
      const bool all_ok = std::all_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.last_code == 0; });
      report_.exit_code = all_ok ? exit_done : exit_failed;
      report_.outcome = all_ok ? "finished" : "failed: a worker ended badly";
    }
    report_.rounds = seen_.rounds();
    report_.rebuilds = seen_.rebuilds();
    report_.checkpoints = seen_.checkpoints();
    report_.newest_checkpoint = seen_.newest_checkpoint();
    report_.final_checkpoint_saved = seen_.final_checkpoint_confirmed();
    report_.stragglers = seen_.stragglers();
    report_.stragglers_evicted = seen_.stragglers_evicted();
    report_.console_lines_dropped = out_->dropped_lines() + err_->dropped_lines();
    auto resumed = seen_.resumed();
    if (whole_round()) {  // a torch script says nothing of its training: its round's start is what is known
      report_.whole_rounds = rounds_started_;
      resumed.insert(resumed.end(), round_started_at_.begin(), round_started_at_.end());
      std::sort(resumed.begin(), resumed.end());
    }
    std::vector<double> failures = failures_at_;
    const auto hangs = watchdog_kills_.hangs();
    failures.insert(failures.end(), hangs.begin(), hangs.end());
    report_.seconds_lost = detail::seconds_lost(failures, resumed);
  }

  /// After worker `pid` ended with `code`, or its collective failed (no code: it lives on): a
  /// bad death or a failed collective while the run goes on may have left the others waiting in
  /// a collective; their flight records say who they wait for. A dead worker's record is then
  /// removed.
  void find_culprit(pid_t pid, std::optional<int> code) {
    try {
      if (ending_ == ending::none && (!code || (*code != 0 && *code != exit_preempted))) {
        std::vector<pid_t> workers;  // live ones: the records read are theirs and the dead one's
        for (const auto& s : slots_)
          if (s.proc.running() && s.proc.pid() != pid) workers.push_back(s.proc.pid());
        const auto found = culprits_->look(pid, workers, events_);
        for (const auto& note : culprits_->take_notes()) say(note);
        if (!found.empty()) {
          say("culprit: " + found);
          report_.culprits.push_back(found);
        }
      }
      if (code) culprits_->forget(pid);
    } catch (const std::exception& e) {
      say(fmt::format("could not read the workers' flight records: {}", e.what()));
    }
  }

  void print_summary(const std::string& timeline) {
    err_->write(summary_text(report_, {.run_id = opts_.run_id,
                                       .max_restarts = opts_.max_restarts,
                                       .log_dir = files_.dir.path(),
                                       .events = opts_.events,
                                       .timeline = timeline}));
  }

  // Declared in the order they are made; destroyed in reverse (workers first, guardian last).
  launch_options opts_;
  clock::time_point started_;
  launcher_identity self_ = launcher_identity::of_this_process();  ///< what our ids name us by
  std::vector<pid_t> inherited_children_;  ///< children from before we started: not ours to end
  sigset_t signals_{};
  guardian guardian_;
  elastic::internal::unique_fd sigfd_;
  run_files files_;
  run_timeline timeline_;
  event_log events_;
  run_events seen_;
  std::optional<console> out_;
  std::optional<console> err_;
  owned_shm store_object_;
  std::optional<async_store> store_;
  std::filesystem::path relay_dir_;
  std::optional<store_relay> relay_;  ///< the workers' way to an etcd store (one participant per host)
  std::string watchdog_name_;
  owned_shm watchdog_object_;
  watchdog_kills watchdog_kills_;  ///< filled by the watchdog's thread: declared before it, outlives it
  std::unique_ptr<timer::watchdog> watchdog_;
  std::vector<slot> slots_;
  // --restart-mode all: the rounds of hosts, the one this host's workers run in, and its end.
  std::optional<host_rounds> rounds_;
  std::optional<host_rounds::round> round_;       ///< the workers run in it
  std::optional<host_rounds::round> next_round_;  ///< there, waiting for the last workers to go
  std::size_t rounds_started_ = 0;
  std::vector<double> round_started_at_;  ///< wall clock, for the time lost to failures
  bool awaiting_round_ = false;
  bool round_stopping_ = false;
  bool round_killed_ = false;
  clock::time_point round_kill_at_{};
  std::optional<clock::time_point> round_request_at_;
  ending ending_ = ending::none;
  clock::time_point shutdown_at_{};
  clock::time_point grace_deadline_{};
  bool killed_after_grace_ = false;
  clock::time_point killed_at_{};
  std::vector<double> failures_at_;
  run_report report_;
  std::optional<culprit_finder> culprits_;  ///< made once the run id is known
};

}  // namespace elastic::agent
