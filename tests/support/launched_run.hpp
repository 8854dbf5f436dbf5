// A real elastic-run for a test: its logs in a temporary directory, its console read as it goes,
// and what it left behind (rank logs, events, its stderr) read back once it ended.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/process.hpp"

namespace elastic::test {

/// elastic-run (`tool`) with run id RUN-PID, its logs under a temporary directory, `options`,
/// then "--" and `program`. Its stdout is read by finish(), its stderr goes to err().
struct launched_run {
  temp_dir dir;
  std::string run;
  child_process proc;
  std::vector<std::string> console;

  launched_run(const std::string& tool, const std::string& run_id, const std::vector<std::string>& options,
               const std::vector<std::string>& program)
      : run(run_id + "-" + std::to_string(::getpid())) {
    std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>\"$ELASTIC_TEST_ERR\"", tool,
                                  "--run-id", run, "--log-dir", dir.path()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    proc = child_process::spawn(argv, {{"ELASTIC_TEST_ERR", dir.file("launcher.err")}});
  }

  [[nodiscard]] std::string log(int slot) const {
    return slurp(dir.path() + "/" + run + "/rank-" + std::to_string(slot) + ".log");
  }
  [[nodiscard]] std::string events() const { return slurp(dir.path() + "/" + run + "/events.jsonl"); }
  [[nodiscard]] std::string err() const { return slurp(dir.file("launcher.err")); }

  /// elastic-run's exit code once it ended (its console read meanwhile), or -1 after `timeout`
  /// (the child_process kills it then). Its stderr is copied to the test's.
  int finish(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      while (auto l = proc.read_line(std::chrono::milliseconds(0))) console.push_back(*l);
      if (auto st = proc.wait_for(std::chrono::milliseconds(10))) {
        while (auto l = proc.read_line(std::chrono::milliseconds(0))) console.push_back(*l);
        std::cerr << err();
        return WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
      }
    }
    std::cerr << err();
    return -1;
  }
};

}  // namespace elastic::test
