// A watchdog hosted in the test process, with its own segment and events file, and a way to
// start test_worker processes against it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <elastic/timer/watchdog.hpp>

#include "support/process.hpp"

namespace elastic::test {

struct hosted {
  temp_dir dir;
  std::string name = unique_name("wd");
  std::string events = dir.file("events.jsonl");
  elastic::timer::watchdog wd;

  explicit hosted(elastic::timer::watchdog_options o = {})
      : wd([&] {
          o.name = name;
          o.events = elastic::event_log::to_file(events);
          return o;
        }()) {}

  /// Starts test_worker MODE <this segment> ARGS...
  child_process worker(const std::string& mode, const std::vector<std::string>& args,
                       std::vector<std::pair<std::string, std::string>> env = {}) {
    std::vector<std::string> argv{ELASTIC_TEST_WORKER, mode, name};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace_back("ELASTIC_EVENTS", events);
    return child_process::spawn(argv, env);
  }
};


}  // namespace elastic::test
