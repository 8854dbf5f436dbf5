// Child processes for the NCCL model's tests: posix_spawn (safe from a threaded parent), a pipe
// on stdin and stdout for a line protocol, stderr into a file read after the fact, bounded waits,
// and a destructor that always kills and reaps.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace nccl_model_test {

using env_list = std::vector<std::pair<std::string, std::string>>;

class child {
 public:
  /// Starts `argv` with `env` added to (or replacing entries of) this process's environment.
  child(const std::vector<std::string>& argv, const env_list& env) {
    char tmpl[] = "/tmp/nccl-model-stderr-XXXXXX";
    const int err_fd = ::mkstemp(tmpl);
    if (err_fd < 0) throw std::runtime_error("mkstemp failed");
    err_path_ = tmpl;
    int in[2];
    int out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
    std::vector<std::string> entries = environment(env);
    std::vector<char*> args;
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : entries) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err_fd);
    in_ = in[1];
    out_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn " + argv[0] + " failed");
    }
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child() {
    reap();
    ::unlink(err_path_.c_str());
  }

  [[nodiscard]] pid_t pid() const { return pid_; }

  /// The next stdout line, or nullopt on EOF or after `timeout`.
  std::optional<std::string> line(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string l = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return l;
      }
      if (out_ < 0) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(out_, buf, sizeof buf);
      if (n <= 0) {
        ::close(out_);
        out_ = -1;
        if (!buffer_.empty()) buffer_ += '\n';
        continue;
      }
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// The next stdout line that starts with `prefix` (others are skipped), or nullopt.
  std::optional<std::string> line_starting(const std::string& prefix,
                                           std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      auto l = line(left.count() > 0 ? left : std::chrono::milliseconds(0));
      if (!l) return std::nullopt;
      if (l->rfind(prefix, 0) == 0) return l;
    }
  }

  /// Writes `text` and a newline to the child's stdin.
  void say(const std::string& text) {
    const std::string l = text + "\n";
    (void)!::write(in_, l.data(), l.size());
  }

  void kill(int sig) const {
    if (pid_ > 0 && !status_) ::kill(pid_, sig);
  }

  /// The wait status once the child ended within `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    if (status_) return status_;
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = st;
        return status_;
      }
      if (std::chrono::steady_clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  /// Exit code if the child exited normally within `timeout`; -1 for a signal, -2 for no end.
  int exit_code(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto st = wait(timeout);
    if (!st) return -2;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  }

  /// Whether the child ended by signal `sig` within `timeout`.
  bool killed_by(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto st = wait(timeout);
    return st && WIFSIGNALED(*st) && WTERMSIG(*st) == sig;
  }

  /// Everything the child wrote to stderr so far.
  [[nodiscard]] std::string err() const {
    std::ifstream f(err_path_);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

 private:
  static std::vector<std::string> environment(const env_list& env) {
    std::vector<std::string> entries;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      const std::string name = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (const auto& kv : env) replaced = replaced || kv.first == name;
      if (!replaced) entries.push_back(entry);
    }
    for (const auto& [k, v] : env) entries.push_back(k + "=" + v);
    return entries;
  }

  void reap() {
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
    in_ = out_ = -1;
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = st;
    }
  }

  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string err_path_;
  std::string buffer_;
  std::optional<int> status_;
};

}  // namespace nccl_model_test
