// Real child processes for multi-process tests: fork/exec, a pipe on the child's stdout, bounded
// waits, and a destructor that always kills and reaps.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace elastic::test {

/// A child process started with fork/exec. Move-only; kills (SIGKILL) and reaps on destruction.
class child_process {
 public:
  child_process() = default;

  /// Starts `argv` with `env` added to this process's environment; the child's stdout is piped
  /// to read_line(), its stderr is inherited.
  static child_process spawn(std::vector<std::string> argv,
                             std::vector<std::pair<std::string, std::string>> env = {}) {
    return spawn_as(-1, -1, std::move(argv), std::move(env));
  }

  /// spawn(), as user `uid` with group `gid` (the caller must be root); -1 keeps this process's.
  static child_process spawn_as(uid_t uid, gid_t gid, std::vector<std::string> argv,
                                std::vector<std::pair<std::string, std::string>> env = {}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    // The child's environment is built here: setenv allocates, which a forked child of a
    // threaded parent must not do (another thread may have held malloc's lock at the fork).
    std::vector<std::string> entries;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const auto name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& kv : env) replaced = replaced || kv.first == name;
      if (!replaced) entries.emplace_back(entry);
    }
    for (const auto& [k, v] : env) entries.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : entries) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Only async-signal-safe calls until exec: the parent may have threads.
      ::dup2(fds[1], STDOUT_FILENO);
      if (gid != static_cast<gid_t>(-1) && (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0)) ::_exit(126);
      if (uid != static_cast<uid_t>(-1) && ::setuid(uid) != 0) ::_exit(126);
      ::execve(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    child_process c;
    c.pid_ = pid;
    c.out_ = fds[0];
    return c;
  }

  child_process(child_process&& o) noexcept { *this = std::move(o); }
  child_process& operator=(child_process&& o) noexcept {
    if (this != &o) {
      reap();
      pid_ = std::exchange(o.pid_, -1);
      out_ = std::exchange(o.out_, -1);
      status_ = o.status_;
      buffer_ = std::move(o.buffer_);
    }
    return *this;
  }
  ~child_process() { reap(); }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }

  /// Sends `sig` if the child has not been reaped yet.
  void kill(int sig) const noexcept {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }

  /// The next line of the child's stdout (without '\n'), or nullopt on EOF or timeout.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (out_ < 0) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{out_, POLLIN, 0};
      // A zero timeout still looks once: read_line(0ms) takes what is already there.
      if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(0, left.count()))) <= 0) {
        if (std::chrono::steady_clock::now() >= until) return std::nullopt;
        continue;
      }
      char buf[4096];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) {
        ::close(out_);
        out_ = -1;
        if (buffer_.empty()) return std::nullopt;
        std::string rest = std::move(buffer_);
        buffer_.clear();
        return rest;
      }
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// The wait status once the child has ended within `timeout`; nullopt if it still runs.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    if (status_) return status_;
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = st;
        return status_;
      }
      if (std::chrono::steady_clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  /// True when the child has ended by signal `sig` (waiting up to `timeout`).
  bool killed_by(int sig, std::chrono::milliseconds timeout) {
    auto st = wait_for(timeout);
    return st && WIFSIGNALED(*st) && WTERMSIG(*st) == sig;
  }

  /// Exit code if the child exited normally within `timeout`.
  std::optional<int> exit_code(std::chrono::milliseconds timeout) {
    auto st = wait_for(timeout);
    if (!st || !WIFEXITED(*st)) return std::nullopt;
    return WEXITSTATUS(*st);
  }

 private:
  void reap() noexcept {
    if (out_ >= 0) ::close(out_);
    out_ = -1;
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
    }
    pid_ = -1;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::optional<int> status_;
  std::string buffer_;
};

/// Runs `f` in a forked child that exits with what `f` returns (99 if it throws); returns pid.
template <class F>
pid_t fork_child(F&& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = f();
    } catch (...) {
    }
    std::_Exit(code);
  }
  return pid;
}

/// The whole text of a file ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Lines of a JSON-lines events file that mention `"event":"NAME"`.
inline std::vector<std::string> events_named(const std::string& path, const std::string& name) {
  std::vector<std::string> out;
  std::ifstream in(path);
  const std::string needle = "\"event\":\"" + name + "\"";
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

/// The newest step whose commit to checkpoint directory `dir` the events file `path` announces
/// (0: none); a checkpoint_commit event comes only once its step is durable.
inline std::uint64_t newest_commit_announced(const std::string& path, const std::string& dir) {
  const std::string prefix = "\"dir\":\"" + dir + "/step-";
  std::uint64_t newest = 0;
  for (const auto& line : events_named(path, "checkpoint_commit")) {
    const auto at = line.find(prefix);
    if (at != std::string::npos) newest = std::max<std::uint64_t>(newest, std::stoull(line.substr(at + prefix.size(), 12)));
  }
  return newest;
}

/// Waits up to `timeout` for at least `count` events named `name` in `path`.
inline std::vector<std::string> wait_for_events(const std::string& path, const std::string& name, std::size_t count,
                                                std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto found = events_named(path, name);
    if (found.size() >= count || std::chrono::steady_clock::now() >= until) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

/// A fresh name for a segment or file, unique to this process and call.
inline std::string unique_name(const std::string& prefix) {
  static int counter = 0;
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
}

/// A temporary directory removed (recursively) on destruction.
class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/elastic-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  /// Removed with everything in it, unless ELASTIC_TEST_KEEP is set (to read a failed run's
  /// logs and events afterwards: the path is printed).
  ~temp_dir() {
    if (std::getenv("ELASTIC_TEST_KEEP")) {
      std::fprintf(stderr, "kept %s (ELASTIC_TEST_KEEP)\n", path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace elastic::test
