// A worker for tests/test_agent.cpp, started by elastic-run. What it does depends on argv[1] and
// on its slot (ELASTIC_LOCAL_RANK) and life (ELASTIC_RESTART_COUNT):
//   env FILE        writes the ELASTIC_* and torchrun variables to FILE.<slot>, exits 0
//   crash-once      slot 1 aborts in its first life; everyone else runs 1 s and exits 0
//   crash-always    slot 0 exits 3 at once, every life; the others wait for SIGTERM (exit 75)
//   preempt-once    slot 0 exits 75 in its first life; then everyone exits 0
//   wait FILE       writes its pid to FILE.<slot>, then waits for SIGTERM and exits 75;
//                   slot 1 ignores SIGTERM (a straggler)
//   hang            slot 0, first life: stuck in a 300 ms timer scope (the watchdog kills it);
//                   else exit 0
//   lines N         N lines on stdout and on stderr, then SIGKILLs itself in its first life
//   retire          first life: sets its alive key /elastic/RUN/alive/PARTICIPANT (no lease) in the
//                   store of ELASTIC_RDZV and SIGKILLs itself; second life: prints
//                   "key-present=<0|1>" and exits 0
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/rendezvous/store_url.hpp>
#include <elastic/timer/expires.hpp>

namespace {

volatile sig_atomic_t terminated = 0;
void on_term(int) { terminated = 1; }

long env_long(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atol(v) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  const long slot = env_long("ELASTIC_LOCAL_RANK");
  const bool first_life = env_long("ELASTIC_RESTART_COUNT") == 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (mode == "env" && argc > 2) {
    std::ofstream out(std::string(argv[2]) + "." + std::to_string(slot));
    for (const char* k : {"ELASTIC_RUN_ID", "ELASTIC_RANK", "ELASTIC_WORLD_SIZE", "ELASTIC_LOCAL_RANK",
                          "ELASTIC_LOCAL_WORLD_SIZE", "ELASTIC_RESTART_COUNT", "ELASTIC_WATCHDOG", "ELASTIC_RDZV",
                          "ELASTIC_EVENTS", "ELASTIC_MIN_NODES", "ELASTIC_MAX_NODES", "ELASTIC_PARTICIPANT_ID",
                          "ELASTIC_STEP_TIMEOUT", "ELASTIC_GRACE", "ELASTIC_HOST_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
      const char* v = std::getenv(k);
      out << k << "=" << (v ? v : "<unset>") << "\n";
    }
    return 0;
  }
  if (mode == "crash-once") {
    if (slot == 1 && first_life) {
      std::puts("slot 1 crashes");
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::puts("done");
    return 0;
  }
  if (mode == "crash-always" || mode == "wait") {
    std::signal(SIGTERM, on_term);
    if (mode == "crash-always" && slot == 0) return 3;
    if (mode == "wait") {
      if (slot == 1) std::signal(SIGTERM, SIG_IGN);
      std::ofstream(std::string(argv[2]) + "." + std::to_string(slot)) << ::getpid() << "\n";
    }
    std::puts("waiting");
    while (!terminated) ::pause();
    std::puts("terminating: exit 75");
    return 75;
  }
  if (mode == "preempt-once") return slot == 0 && first_life ? 75 : 0;
  if (mode == "hang") {
    if (slot == 0 && first_life) {
      auto scope = elastic::expires(std::chrono::milliseconds(300), "step");
      std::puts("hanging");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return 0;
  }
  if (mode == "lines" && argc > 2) {
    const int n = std::atoi(argv[2]);
    for (int i = 0; i < n; ++i) {
      std::printf("out line %d\n", i);
      std::fprintf(stderr, "err line %d\n", i);
    }
    std::fflush(stdout);
    if (first_life) ::kill(::getpid(), SIGKILL);
    return 0;
  }
  if (mode == "retire") {
    const auto url = elastic::rendezvous::parse_store_url(std::getenv("ELASTIC_RDZV"));
    elastic::rendezvous::shm_store store(url.name);
    const std::string key = std::string("/elastic/") + std::getenv("ELASTIC_RUN_ID") + "/alive/" +
                            std::getenv("ELASTIC_PARTICIPANT_ID");
    if (first_life) {
      store.set(key, "x");
      ::kill(::getpid(), SIGKILL);
    }
    std::printf("key-present=%d\n", store.get(key).has_value() ? 1 : 0);
    return 0;
  }
  return 2;
}
