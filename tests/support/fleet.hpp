// Group workers (tests/support/group_worker.cpp) as a fleet of real processes whose stdout is
// collected line by line, for tests/test_elastic_group.cpp and benchmarks/recovery_bench.cpp.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/rendezvous/shm_store.hpp>

#include "support/process.hpp"

namespace elastic::test {

/// The value of `key=` in a worker's line ("" when absent).
inline std::string field(const std::string& line, const std::string& key) {
  const std::string k = key + "=";
  std::size_t at = 0;
  for (;;) {
    at = line.find(k, at);
    if (at == std::string::npos) return {};
    if (at == 0 || line[at - 1] == ' ') break;
    ++at;
  }
  const auto end = line.find(' ', at);
  return line.substr(at + k.size(), end == std::string::npos ? std::string::npos : end - at - k.size());
}

inline std::int64_t num(const std::string& line, const std::string& key) {
  const std::string v = field(line, key);
  return v.empty() ? -1 : std::stoll(v);
}

inline bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

/// A set of group workers whose stdout is collected line by line; every wait keeps reading all
/// of them, so no worker ever blocks on a full pipe.
class fleet {
 public:
  struct worker {
    std::string id;
    child_process proc;
    std::vector<std::string> lines;
    std::optional<int> status;
  };

  /// Workers run `program` and meet in `store` as run `run_id`, each with the options `common`;
  /// their events go to `events`.
  fleet(std::string program, std::string store, std::string run_id, std::vector<std::string> common, std::string events)
      : program_(std::move(program)),
        store_(std::move(store)),
        run_id_(std::move(run_id)),
        common_(std::move(common)),
        events_(std::move(events)) {}

  /// Starts a worker with participant id `id`; returns its index.
  std::size_t start(const std::string& id, std::vector<std::string> extra = {},
                    std::vector<std::pair<std::string, std::string>> env = {}) {
    std::vector<std::string> argv{program_, "--store", store_, "--run-id", run_id_, "--id", id};
    argv.insert(argv.end(), common_.begin(), common_.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    env.emplace_back("ELASTIC_EVENTS", events_);
    workers_.push_back({id, child_process::spawn(argv, env), {}, {}});
    return workers_.size() - 1;
  }

  worker& operator[](std::size_t i) { return workers_[i]; }
  std::size_t size() const { return workers_.size(); }

  /// Reads what is there from every worker and reaps those that ended.
  void pump() {
    for (auto& w : workers_) {
      while (auto line = w.proc.read_line(std::chrono::milliseconds(0))) w.lines.push_back(*line);
      if (!w.status) w.status = w.proc.wait_for(std::chrono::milliseconds(0));
    }
  }

  /// Pumps until `done()` holds or `timeout` passes; the final value of done().
  bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      pump();
      if (done()) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  /// The first line of worker i starting with `prefix` (and passing `pred`), if any yet.
  std::optional<std::string> find(std::size_t i, const std::string& prefix,
                                  const std::function<bool(const std::string&)>& pred = {}) const {
    for (const auto& l : workers_[i].lines)
      if (starts_with(l, prefix) && (!pred || pred(l))) return l;
    return std::nullopt;
  }

  bool all_ended(const std::vector<std::size_t>& which) const {
    return std::all_of(which.begin(), which.end(), [&](std::size_t i) { return workers_[i].status.has_value(); });
  }

  std::string transcript(std::size_t i, std::size_t last = 12) const {
    const auto& ls = workers_[i].lines;
    const auto& st = workers_[i].status;
    std::string out = "worker " + workers_[i].id + " (pid " + std::to_string(workers_[i].proc.pid()) + ", " +
                      (!st ? std::string("running")
                       : WIFSIGNALED(*st) ? "killed by signal " + std::to_string(WTERMSIG(*st))
                                          : "exit " + std::to_string(WEXITSTATUS(*st))) +
                      "):\n";
    for (std::size_t k = ls.size() > last ? ls.size() - last : 0; k < ls.size(); ++k) out += "  " + ls[k] + "\n";
    return out;
  }

 private:
  std::string program_, store_, run_id_;
  std::vector<std::string> common_;
  std::string events_;
  std::vector<worker> workers_;
};

/// What a group test's workers share: a scratch directory, an shm store (removed afterwards), the
/// checkpoint directory and the events file.
struct group_scratch {
  temp_dir dir;
  std::string store_name;
  std::string url = "shm://" + store_name;
  std::string ckpt = dir.file("ckpt");
  std::string events = dir.file("events.jsonl");
  explicit group_scratch(const std::string& tag) : store_name(unique_name(tag)) {}
  group_scratch(const group_scratch&) = delete;
  group_scratch& operator=(const group_scratch&) = delete;
  ~group_scratch() { elastic::rendezvous::shm_store::remove(store_name); }
};

inline int exit_code_of(const std::optional<int>& st) { return st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1; }

}  // namespace elastic::test
