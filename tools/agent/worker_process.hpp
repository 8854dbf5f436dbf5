// One worker: a child process in a process group of its own, its stdout and stderr on pipes, that
// dies with the launcher (PR_SET_PDEATHSIG) and is killed (its whole group) and reaped when this
// object goes. PR_SET_PDEATHSIG reaches the worker only, not what it starts: the launcher's
// guardian (guardian.hpp) and its subreaping take care of those.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/file.hpp>
#include <elastic/error.hpp>

namespace elastic::agent {

class worker_process {
 public:
  worker_process() = default;

  /// Starts `argv` (PATH searched) with exactly the environment `env` ("K=V" strings). Throws
  /// errc::os_error naming the program when it cannot be executed.
  static worker_process spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    if (argv.empty()) throw error(errc::invalid_argument, "worker_process: no program");
    int out[2], err[2], status[2];
    if (::pipe2(out, O_CLOEXEC) != 0) throw os_error("cannot make a pipe for a worker's stdout");
    elastic::internal::unique_fd out_r(out[0]), out_w(out[1]);
    if (::pipe2(err, O_CLOEXEC) != 0) throw os_error("cannot make a pipe for a worker's stderr");
    elastic::internal::unique_fd err_r(err[0]), err_w(err[1]);
    if (::pipe2(status, O_CLOEXEC) != 0) throw os_error("cannot make a pipe to start a worker");
    elastic::internal::unique_fd status_r(status[0]), status_w(status[1]);

    // Everything the child needs is made before fork: between fork and exec only
    // async-signal-safe calls (the launcher has threads).
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();

    const pid_t pid = ::fork();
    if (pid < 0) throw os_error("cannot fork a worker");
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
      // The launcher blocks the signals it reads from a signalfd: the worker must not.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
      ::dup2(out_w.get(), STDOUT_FILENO);
      ::dup2(err_w.get(), STDERR_FILENO);
      ::execvpe(args[0], args.data(), envp.data());
      const int e = errno;
      (void)!::write(status_w.get(), &e, sizeof e);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before we ever signal it
    status_w.reset();
    out_w.reset();
    err_w.reset();
    int child_errno = 0;
    ssize_t n;
    while ((n = ::read(status_r.get(), &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
    }
    worker_process w;
    w.pid_ = pid;
    if (n == static_cast<ssize_t>(sizeof child_errno)) {
      w.reap_blocking();
      throw error(errc::os_error, fmt::format("cannot run '{}': {}", argv[0], std::strerror(child_errno)),
                  std::error_code(child_errno, std::generic_category()));
    }
    w.out_ = std::move(out_r);
    w.err_ = std::move(err_r);
    return w;
  }

  worker_process(worker_process&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), out_(std::move(o.out_)), err_(std::move(o.err_)) {}
  worker_process& operator=(worker_process&& o) noexcept {
    if (this != &o) {
      kill_and_reap();
      pid_ = std::exchange(o.pid_, -1);
      out_ = std::move(o.out_);
      err_ = std::move(o.err_);
    }
    return *this;
  }
  worker_process(const worker_process&) = delete;
  worker_process& operator=(const worker_process&) = delete;
  ~worker_process() { kill_and_reap(); }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const noexcept { return pid_ > 0; }
  [[nodiscard]] int stdout_fd() const noexcept { return out_.get(); }
  [[nodiscard]] int stderr_fd() const noexcept { return err_.get(); }
  /// Gives a pipe up once it reached EOF.
  void close_stdout() noexcept { out_.reset(); }
  void close_stderr() noexcept { err_.reset(); }

  /// Signals the worker's whole process group (what it started dies with it).
  void signal(int sig) const noexcept {
    if (pid_ > 0) ::kill(-pid_, sig);
  }

  /// The caller reaped `pid()` (waitpid on any child): the worker is gone.
  void reaped() noexcept { pid_ = -1; }

 private:
  void reap_blocking() noexcept {
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  void kill_and_reap() noexcept {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    reap_blocking();
  }

  pid_t pid_ = -1;
  elastic::internal::unique_fd out_, err_;
};

}  // namespace elastic::agent
