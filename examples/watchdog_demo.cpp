// The watchdog in one screen: a worker trains for a few steps inside timer scopes, then hangs in
// an "allreduce" (a peer that never answers). The watchdog hosted in this process kills it just
// after the scope's deadline and logs what it did.
//
//   watchdog_demo [--steps N] [--timeout-ms MS]
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

#include <elastic/elastic.hpp>

// "SIGKILL" for 9; glibc names every signal it knows.
static std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

using namespace std::chrono_literals;

namespace {

// The worker: what a trainer writes.
int worker(int steps, std::chrono::milliseconds timeout) {
  for (int step = 0; step < steps; ++step) {
    auto guard = elastic::expires(timeout, "step");
    std::this_thread::sleep_for(timeout / 10);  // forward/backward
    {
      auto ar = elastic::expires(timeout, "allreduce");
      std::this_thread::sleep_for(timeout / 20);
    }
    std::printf("  [worker %d] step %d done\n", static_cast<int>(::getpid()), step);
    std::fflush(stdout);
  }
  std::printf("  [worker %d] entering allreduce; the peer is gone, this will never return\n",
              static_cast<int>(::getpid()));
  std::fflush(stdout);
  auto ar = elastic::expires(timeout, "allreduce");
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines in order when piped along with the worker's
  int steps = 3;
  std::chrono::milliseconds timeout = 500ms;
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    if (a == "--worker") return worker(std::atoi(argv[i + 1]), std::chrono::milliseconds(std::atoi(argv[i + 2])));
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (a == "--timeout-ms" && i + 1 < argc) timeout = std::chrono::milliseconds(std::atoi(argv[++i]));
  }

  const std::string name = "demo-" + std::to_string(::getpid());
  const auto events = std::filesystem::temp_directory_path() / (name + ".events.jsonl");
  std::filesystem::remove(events);
  elastic::timer::watchdog wd({.name = name, .events = elastic::event_log::to_file(events)});
  std::printf("watchdog: serving segment '%s'; events go to %s\n", name.c_str(), events.c_str());

  ::setenv("ELASTIC_WATCHDOG", name.c_str(), 1);
  ::setenv("ELASTIC_EVENTS", events.c_str(), 1);
  ::setenv("ELASTIC_RANK", "0", 1);
  const auto started = std::chrono::steady_clock::now();
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string s = std::to_string(steps), t = std::to_string(timeout.count());
    ::execl("/proc/self/exe", argv[0], "--worker", s.c_str(), t.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  std::printf("launched worker pid %d: %d steps, each scope must finish within %lld ms\n", static_cast<int>(pid),
              steps, static_cast<long long>(timeout.count()));
  std::fflush(stdout);  // before the worker's lines when both go to one pipe
  int status = 0;
  ::waitpid(pid, &status, 0);
  const auto ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (WIFSIGNALED(status)) {
    std::printf("worker %d was killed by %s after %.2f s\n", static_cast<int>(pid),
                signal_name(WTERMSIG(status)).c_str(), ran);
  } else {
    std::printf("worker %d exited with %d: the watchdog did not kill it\n", static_cast<int>(pid),
                WEXITSTATUS(status));
    return 1;
  }
  wd.stop();
  std::printf("events:\n");
  std::ifstream in(events);
  for (std::string line; std::getline(in, line);) std::printf("  %s\n", line.c_str());
  std::filesystem::remove(events);
  return 0;
}
