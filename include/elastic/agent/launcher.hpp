// The agent behind elastic-run: starts the workers of one host, hosts their watchdog, restarts the
// ones that fail while the others go on, turns SIGTERM into an orderly preemption, keeps every
// worker's output, and says at the end what happened and what it cost.
//
//   elastic::agent::launcher l(elastic::agent::parse_command_line(args));
//   return l.run();    // 0 done, 75 preempted (retry me), 1 failed
//
// Signals: SIGCHLD, SIGTERM, SIGINT and SIGHUP are blocked in the thread that constructs the
// launcher (before the watchdog thread starts, so it inherits the mask) and read from a
// signalfd: no handler runs, and the loop sleeps in poll() until a worker writes, exits, or a
// signal comes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/agent/log_pump.hpp>
#include <elastic/agent/options.hpp>
#include <elastic/agent/worker_process.hpp>
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/detail/file.hpp>
#include <elastic/detail/json.hpp>
#include <elastic/detail/process.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/rendezvous/host_address.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/timer/watchdog.hpp>

extern char** environ;

namespace elastic::agent {

/// What a run came to, for the summary and for tests.
struct run_report {
  int exit_code = 0;
  std::string outcome;               ///< "finished", "preempted", "failed: ..."
  double seconds = 0;
  std::size_t workers = 0;
  std::size_t failures = 0;          ///< worker deaths counted against --max-restarts
  std::size_t restarts = 0;          ///< workers started again (failures and preemptions)
  std::size_t preempted_restarts = 0;
  std::size_t watchdog_kills = 0;
  std::size_t stragglers_killed = 0;  ///< SIGKILLed after the grace
  std::int64_t rounds = 0;           ///< rendezvous rounds the workers formed
  std::size_t rebuilds = 0;          ///< group rebuilds after the first round
  std::size_t checkpoints = 0;       ///< checkpoint commits
  std::int64_t newest_checkpoint = -1;
  double seconds_lost = 0;           ///< from each failure to the group training again
};

namespace detail {

inline std::string random_run_id() {
  std::random_device rd;
  return fmt::format("run-{:08x}", rd());
}

inline bool valid_run_id(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

inline std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "host";
  std::string h = host;
  for (char& c : h)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) c = '_';
  return h.substr(0, 64);
}

/// Seconds since the epoch of an events line's "ts" (RFC 3339, UTC, microseconds).
inline double parse_ts(std::string_view ts) {
  std::tm tm{};
  int us = 0;
  if (std::sscanf(std::string(ts).c_str(), "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &us) < 6) {
    return 0;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<double>(::timegm(&tm)) + us / 1e6;
}

inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Signals the launcher reads from its signalfd instead of handling.
inline sigset_t launcher_signals() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&s, sig);
  return s;
}

}  // namespace detail

class launcher {
 public:
  explicit launcher(launch_options o) : opts_(std::move(o)), started_(std::chrono::steady_clock::now()) {
    if (opts_.run_id.empty()) opts_.run_id = elastic::detail::env_string("ELASTIC_RUN_ID").value_or("");
    if (opts_.run_id.empty()) opts_.run_id = detail::random_run_id();
    if (!detail::valid_run_id(opts_.run_id)) {
      throw error(errc::invalid_argument,
                  fmt::format("run id '{}' is not 1 to 64 characters of A-Z a-z 0-9 . _ -", opts_.run_id));
    }
    const bool own_default_store = opts_.rdzv.empty();
    if (own_default_store) opts_.rdzv = "shm://elastic-" + opts_.run_id;
    const auto url = rendezvous::parse_store_url(opts_.rdzv);  // a bad URL fails before anything starts
    if (opts_.host_addr.empty()) opts_.host_addr = elastic::detail::env_string("ELASTIC_HOST_ADDR").value_or("");
    if (opts_.host_addr.empty()) opts_.host_addr = rendezvous::host_address_for(url);
    dir_ = opts_.log_dir / opts_.run_id;
    std::filesystem::create_directories(dir_);
    if (opts_.events.empty()) opts_.events = dir_ / "events.jsonl";
    {
      // A retried run appends to the same file: only what comes after this point is ours.
      std::error_code ec;
      const auto size = std::filesystem::file_size(opts_.events, ec);
      events_offset_ = ec ? 0 : static_cast<std::streamoff>(size);
    }
    ::setenv("ELASTIC_RUN_ID", opts_.run_id.c_str(), 1);  // our events carry it
    events_ = event_log::to_file(opts_.events);

    const sigset_t sigs = detail::launcher_signals();
    ::pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    sigfd_ = elastic::detail::unique_fd(::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!sigfd_) throw os_error("cannot make a signalfd");

    store_ = rendezvous::open_store(opts_.rdzv);
    // The default store is this run's alone: removed at the end. One given with --rdzv may be
    // shared with other launchers and is left alone.
    if (own_default_store && url.scheme == rendezvous::store_url::kind::shm) own_shm_store_ = url.name;
    // Per launcher: two launchers of a run may share a host (and /dev/shm), as in tests.
    watchdog_name_ = fmt::format("elastic-{}-{}", opts_.run_id, ::getpid());
    timer::watchdog_options wo;
    wo.name = watchdog_name_;
    wo.events = events_;
    watchdog_ = std::make_unique<timer::watchdog>(std::move(wo));
    host_ = detail::host_name();
  }

  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;

  ~launcher() {
    slots_.clear();  // kills and reaps whatever still runs
    watchdog_.reset();
    store_.reset();
    if (!own_shm_store_.empty()) rendezvous::shm_store::remove(own_shm_store_);
  }

  [[nodiscard]] const launch_options& options() const noexcept { return opts_; }
  [[nodiscard]] const std::filesystem::path& log_dir() const noexcept { return dir_; }
  [[nodiscard]] const run_report& report() const noexcept { return report_; }

  /// Runs the workers until they are done, preempted, or out of restarts; prints the summary
  /// to stderr and returns the exit code.
  int run() {
    events_.emit("launcher_start", {{"workers", opts_.nproc_per_node},
                                    {"min_ranks", opts_.min_ranks},
                                    {"max_ranks", opts_.max_nodes * opts_.nproc_per_node},
                                    {"rdzv", opts_.rdzv},
                                    {"watchdog", watchdog_name_},
                                    {"max_restarts", opts_.max_restarts},
                                    {"command", join_command()}});
    slots_.resize(opts_.nproc_per_node);
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      slots_[i].index = i;
      slots_[i].log = std::make_unique<log_pump>(dir_ / fmt::format("rank-{}.log", i), i, opts_.quiet ? -1 : STDOUT_FILENO);
      if (!start(slots_[i])) break;
    }
    loop();
    finish_report();
    print_summary();
    events_.emit("launcher_end", {{"exit_code", report_.exit_code},
                                  {"outcome", report_.outcome},
                                  {"seconds", report_.seconds},
                                  {"restarts", report_.restarts},
                                  {"failures", report_.failures},
                                  {"watchdog_kills", report_.watchdog_kills}});
    return report_.exit_code;
  }

 private:
  using clock = std::chrono::steady_clock;

  struct slot {
    std::size_t index = 0;
    worker_process proc;
    std::unique_ptr<log_pump> log;
    std::size_t starts = 0;
    bool done = false;
    int last_code = -1;          ///< exit code, or -signal
  };

  enum class ending { none, preempted, failed };

  std::string participant(const slot& s) const {
    return fmt::format("{}.{}:{}", host_, ::getpid(), s.index);
  }

  std::string join_command() const {
    std::string out;
    for (const auto& a : opts_.command) out += (out.empty() ? "" : " ") + a;
    return out;
  }

  std::vector<std::string> environment(const slot& s) const {
    static constexpr std::string_view ours[] = {
        "ELASTIC_RUN_ID=", "ELASTIC_RANK=", "ELASTIC_WORLD_SIZE=", "ELASTIC_LOCAL_RANK=", "ELASTIC_LOCAL_WORLD_SIZE=",
        "ELASTIC_RESTART_COUNT=", "ELASTIC_WATCHDOG=", "ELASTIC_RDZV=", "ELASTIC_EVENTS=", "ELASTIC_MIN_NODES=",
        "ELASTIC_MAX_NODES=", "ELASTIC_PARTICIPANT_ID=", "ELASTIC_STEP_TIMEOUT=", "ELASTIC_GRACE=", "RANK=",
        "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "ELASTIC_HOST_ADDR="};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view kv(*e);
      if (std::none_of(std::begin(ours), std::end(ours), [&](std::string_view p) { return kv.rfind(p, 0) == 0; })) {
        env.emplace_back(kv);
      }
    }
    const std::size_t world = opts_.min_nodes * opts_.nproc_per_node;  // a first guess: the group decides
    auto set = [&](std::string_view k, const std::string& v) { env.push_back(fmt::format("{}={}", k, v)); };
    set("ELASTIC_RUN_ID", opts_.run_id);
    set("ELASTIC_RANK", std::to_string(s.index));
    set("ELASTIC_WORLD_SIZE", std::to_string(world));
    set("ELASTIC_LOCAL_RANK", std::to_string(s.index));
    set("ELASTIC_LOCAL_WORLD_SIZE", std::to_string(opts_.nproc_per_node));
    set("ELASTIC_RESTART_COUNT", std::to_string(s.starts));
    set("ELASTIC_WATCHDOG", watchdog_name_);
    set("ELASTIC_RDZV", opts_.rdzv);
    set("ELASTIC_EVENTS", opts_.events.string());
    set("ELASTIC_MIN_NODES", std::to_string(opts_.min_ranks));
    set("ELASTIC_MAX_NODES", std::to_string(opts_.max_nodes * opts_.nproc_per_node));
    set("ELASTIC_PARTICIPANT_ID", participant(s));
    set("ELASTIC_HOST_ADDR", opts_.host_addr);
    if (opts_.step_timeout.count() > 0) set("ELASTIC_STEP_TIMEOUT", fmt::format("{:.3f}", opts_.step_timeout.count() / 1e3));
    set("ELASTIC_GRACE", fmt::format("{:.3f}", opts_.grace.count() / 1e3));
    set("RANK", std::to_string(s.index));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_RANK", std::to_string(s.index));
    set("LOCAL_WORLD_SIZE", std::to_string(opts_.nproc_per_node));
    return env;
  }

  /// Starts (or restarts) a slot's worker; false when it cannot be started at all.
  bool start(slot& s) {
    try {
      s.proc = worker_process::spawn(opts_.command, environment(s));
    } catch (const error& e) {
      s.log->note(fmt::format("worker {} could not start: {}", s.index, e.what()));
      events_.emit("worker_start_failed", {{"slot", s.index}, {"message", e.what()}});
      report_.outcome = fmt::format("failed: {}", e.what());
      begin_shutdown(ending::failed);
      s.done = true;
      return false;
    }
    for (int fd : {s.proc.stdout_fd(), s.proc.stderr_fd()}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (s.starts > 0) ++report_.restarts;
    // The command once per log (it is in launcher_start too); the console stays readable.
    s.log->note(s.starts == 0 ? fmt::format("worker {} started: pid {}, restart 0: {}", s.index, s.proc.pid(), join_command())
                              : fmt::format("worker {} started: pid {}, restart {}", s.index, s.proc.pid(), s.starts));
    events_.emit(s.starts == 0 ? "worker_start" : "worker_restart",
                 {{"slot", s.index}, {"worker_pid", s.proc.pid()}, {"restart_count", s.starts}});
    ++s.starts;
    return true;
  }

  void loop() {
    for (;;) {
      const bool any_running = std::any_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.proc.running(); });
      if (!any_running) return;
      std::vector<pollfd> fds{{sigfd_.get(), POLLIN, 0}};
      std::vector<std::pair<slot*, int>> owners{{nullptr, 0}};
      for (auto& s : slots_) {
        if (s.proc.stdout_fd() >= 0) fds.push_back({s.proc.stdout_fd(), POLLIN, 0}), owners.emplace_back(&s, 0);
        if (s.proc.stderr_fd() >= 0) fds.push_back({s.proc.stderr_fd(), POLLIN, 0}), owners.emplace_back(&s, 1);
      }
      int timeout = -1;
      if (ending_ != ending::none && !killed_after_grace_) {
        timeout = static_cast<int>(std::max<std::int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(grace_deadline_ - clock::now()).count() + 1));
      }
      const int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) throw os_error("elastic-run: poll failed");
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) pump(*owners[i].first, owners[i].second);
      }
      if (fds[0].revents & POLLIN) read_signals();
      if (ending_ != ending::none && !killed_after_grace_ && clock::now() >= grace_deadline_) kill_stragglers();
    }
  }

  /// Reads what a worker wrote; false at EOF.
  bool pump(slot& s, int stream) {
    const int fd = stream == 0 ? s.proc.stdout_fd() : s.proc.stderr_fd();
    if (fd < 0) return false;
    char buf[65536];
    for (;;) {
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
  }

  void read_signals() {
    signalfd_siginfo si;
    while (::read(sigfd_.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
      const int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
        continue;
      }
      if (ending_ == ending::none) {
        events_.emit("launcher_signal", {{"signal", elastic::detail::signal_name(sig)},
                                         {"grace_ms", opts_.grace.count()}});
        std::fprintf(stderr, "elastic-run: %s: asking %zu workers to checkpoint and exit within %.1f s\n",
                     elastic::detail::signal_name(sig).data(), running_count(), opts_.grace.count() / 1e3);
        report_.outcome = "preempted";
        begin_shutdown(ending::preempted);
      } else if (!killed_after_grace_) {
        std::fprintf(stderr, "elastic-run: %s again: killing the workers now\n", elastic::detail::signal_name(sig).data());
        kill_stragglers();
      }
    }
  }

  std::size_t running_count() const {
    return static_cast<std::size_t>(std::count_if(slots_.begin(), slots_.end(), [](const slot& s) { return s.proc.running(); }));
  }

  void reap() {
    for (;;) {
      int st = 0;
      const pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid <= 0) return;
      for (auto& s : slots_) {
        if (s.proc.pid() != pid) continue;
        // Take what is still in the pipes, then let them go: a grandchild may hold them open.
        pump(s, 0);
        pump(s, 1);
        s.log->flush(0);
        s.log->flush(1);
        s.proc.close_stdout();
        s.proc.close_stderr();
        s.proc.reaped();
        exited(s, pid, st);
        break;
      }
    }
  }

  /// Whether the watchdog's events name `pid` as a process it killed.
  bool killed_by_watchdog(pid_t pid) const {
    std::ifstream in(opts_.events);
    in.seekg(events_offset_);
    const std::string needle = fmt::format("\"target_pid\":{},", pid);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"event\":\"watchdog_kill\"") != std::string::npos && line.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  void exited(slot& s, pid_t pid, int st) {
    const bool signaled = WIFSIGNALED(st);
    const int code = signaled ? -WTERMSIG(st) : WEXITSTATUS(st);
    const bool by_watchdog = signaled && killed_by_watchdog(pid);
    s.last_code = code;
    const std::string how = signaled ? fmt::format("killed by {}{}", elastic::detail::signal_name(-code),
                                                   by_watchdog ? " (the watchdog: a timer scope expired)" : "")
                                     : fmt::format("exited with code {}{}", code, code == elastic::exit_preempted
                                                                                      ? " (preempted, state saved)"
                                                                                      : "");
    s.log->note(fmt::format("worker {} (pid {}) {}", s.index, pid, how));
    events_.emit("worker_exit", {{"slot", s.index},
                                 {"worker_pid", pid},
                                 {"code", signaled ? event_value(nullptr) : event_value(code)},
                                 {"signal", signaled ? event_value(elastic::detail::signal_name(-code)) : event_value(nullptr)},
                                 {"watchdog", by_watchdog}});
    if (by_watchdog) ++report_.watchdog_kills;
    retire_alive_key(s);

    if (ending_ != ending::none || code == 0) {
      s.done = true;
      return;
    }
    if (code == elastic::exit_preempted) {
      ++report_.preempted_restarts;
      start(s);
      return;
    }
    ++report_.failures;
    if (!by_watchdog) failures_at_.push_back(detail::wall_now());  // a hang's cost starts with the hang
    if (report_.failures > opts_.max_restarts) {
      report_.outcome = fmt::format("failed: worker {} {}, and all {} restarts are used up", s.index, how, opts_.max_restarts);
      std::fprintf(stderr, "elastic-run: worker %zu %s; %zu restarts used up: stopping the others\n", s.index, how.c_str(),
                   opts_.max_restarts);
      s.done = true;
      begin_shutdown(ending::failed);
      return;
    }
    std::fprintf(stderr, "elastic-run: worker %zu %s: restarting it (%zu of %zu restarts)\n", s.index, how.c_str(),
                 report_.failures, opts_.max_restarts);
    start(s);
  }

  /// The group sees the death at once instead of after the heartbeat timeout.
  void retire_alive_key(const slot& s) {
    try {
      store_->erase(fmt::format("/elastic/{}/alive/{}", opts_.run_id, participant(s)));
    } catch (const error& e) {
      events_.emit("launcher_store_error", {{"slot", s.index}, {"message", e.what()}});
    }
  }

  void begin_shutdown(ending why) {
    if (ending_ != ending::none) return;
    ending_ = why;
    grace_deadline_ = clock::now() + opts_.grace;
    for (auto& s : slots_) s.proc.signal(SIGTERM);
  }

  void kill_stragglers() {
    killed_after_grace_ = true;
    for (auto& s : slots_) {
      if (!s.proc.running()) continue;
      ++report_.stragglers_killed;
      s.log->note(fmt::format("worker {} (pid {}) did not exit within the grace: SIGKILL", s.index, s.proc.pid()));
      events_.emit("worker_grace_exceeded", {{"slot", s.index}, {"worker_pid", s.proc.pid()}});
      s.proc.signal(SIGKILL);
    }
  }

  /// Exit code and the figures the workers' own events give.
  void finish_report() {
    report_.workers = slots_.size();
    report_.seconds = std::chrono::duration<double>(clock::now() - started_).count();
    if (ending_ == ending::failed) {
      report_.exit_code = 1;
    } else if (ending_ == ending::preempted) {
      report_.exit_code = elastic::exit_preempted;
    } else {
      const bool all_ok = std::all_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.last_code == 0; });
      report_.exit_code = all_ok ? 0 : 1;
      report_.outcome = all_ok ? "finished" : "failed: a worker ended badly";
    }
    std::set<std::int64_t> rebuilt_rounds;
    std::vector<double> resumed;  // when a group was training again after a rebuild
    std::ifstream in(opts_.events);
    in.seekg(events_offset_);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"event\":\"rendezvous_round_closed\"") == std::string::npos &&
          line.find("\"event\":\"group_") == std::string::npos && line.find("\"event\":\"checkpoint_commit\"") == std::string::npos &&
          line.find("\"event\":\"watchdog_kill\"") == std::string::npos) {
        continue;
      }
      try {
        const auto j = elastic::detail::json::parse(line);
        const std::string& ev = j.at("event").as_string();
        if (ev == "rendezvous_round_closed") {
          report_.rounds = std::max(report_.rounds, j.at("round").as_int64());
        } else if (ev == "group_rebuilt") {
          rebuilt_rounds.insert(j.at("round").as_int64());
        } else if (ev == "group_resynced") {
          resumed.push_back(detail::parse_ts(j.at("ts").as_string()));
        } else if (ev == "checkpoint_commit") {
          ++report_.checkpoints;
          report_.newest_checkpoint = std::max<std::int64_t>(report_.newest_checkpoint, j.at("step").as_int64());
        } else if (ev == "watchdog_kill") {
          // The hang began when the expired scope was entered: the group stalled from then.
          failures_at_.push_back(detail::parse_ts(j.at("ts").as_string()) - j.at("held_ms").as_double() / 1e3);
        }
      } catch (const error&) {
        // a line we cannot read is left out of the figures
      }
    }
    report_.rebuilds = rebuilt_rounds.size();
    std::sort(resumed.begin(), resumed.end());
    for (double t : failures_at_) {
      const auto it = std::upper_bound(resumed.begin(), resumed.end(), t);
      if (it != resumed.end()) report_.seconds_lost += *it - t;
    }
  }

  void print_summary() const {
    const auto& r = report_;
    std::string text = fmt::format("elastic-run: run '{}' {}\n", opts_.run_id, r.outcome);
    text += fmt::format("  exit code        {}{}\n", r.exit_code,
                        r.exit_code == elastic::exit_preempted ? " (preempted: state saved, run the same command again)"
                                                                  : "");
    text += fmt::format("  run time         {:.1f} s, {} workers\n", r.seconds, r.workers);
    text += fmt::format("  failures         {} (--max-restarts {}); workers restarted: {}, of which {} after a "
                        "preemption\n",
                        r.failures, opts_.max_restarts, r.restarts, r.preempted_restarts);
    text += fmt::format("  watchdog kills   {}\n", r.watchdog_kills);
    text += fmt::format("  rendezvous       round {} reached, the group rebuilt {} times\n", r.rounds, r.rebuilds);
    text += r.newest_checkpoint >= 0
                ? fmt::format("  checkpoints      {} committed, newest step {}\n", r.checkpoints, r.newest_checkpoint)
                : fmt::format("  checkpoints      none committed in this run\n");
    text += fmt::format("  time lost        {:.2f} s to failures (each from the death, or the hang, to the group "
                        "training again)\n",
                        r.seconds_lost);
    if (r.stragglers_killed > 0) text += fmt::format("  killed at grace  {} workers\n", r.stragglers_killed);
    text += fmt::format("  logs             {}/rank-*.log, events {}\n", dir_.string(), opts_.events.string());
    elastic::detail::write_all_best_effort(STDERR_FILENO, text);
  }

  launch_options opts_;
  clock::time_point started_;
  std::filesystem::path dir_;
  std::streamoff events_offset_ = 0;
  event_log events_;
  elastic::detail::unique_fd sigfd_;
  std::unique_ptr<rendezvous::store> store_;
  std::string own_shm_store_;
  std::string watchdog_name_;
  std::unique_ptr<timer::watchdog> watchdog_;
  std::string host_;
  std::vector<slot> slots_;
  ending ending_ = ending::none;
  clock::time_point grace_deadline_{};
  bool killed_after_grace_ = false;
  std::vector<double> failures_at_;
  run_report report_;
};

}  // namespace elastic::agent
