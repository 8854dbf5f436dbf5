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
//                   "key-present=<0|1>", sets the key itself, prints "own-key-present=<0|1>"
//                   300 ms later, and exits 0
//   notice-once     slot 0, first life: logs loop_preempted (a notice it got itself, final
//                   checkpoint saved) and exits 75; then everyone exits 0
//   tempfail        slot 0 exits 75 at once, every life, with no notice; the others wait for
//                   SIGTERM (exit 75)
//   tempfail-progress N
//                   slot 0, lives 0..N-1: logs checkpoint_commit (step = life) and exits 75;
//                   life N exits 0. The others exit 0 at once
//   term MS FILE [none|saved|unsaved]
//                   writes its pid to FILE.<slot>; slot 0 logs checkpoint_commit step 3 (unless
//                   none); waits for SIGTERM, MS ms more (checkpointing), counts the SIGTERMs
//                   meanwhile; saved: slot 0 logs checkpoint_commit step 4 and loop_preempted
//                   with final_checkpoint true, the others false; unsaved: all false; prints
//                   "terminating after K notices: exit 75" and exits 75
//   chatter BYTES   lines of BYTES characters on stdout, one a millisecond, until SIGTERM: then
//                   "terminating: exit 75" and exit 75
//   wrap MODE ARGS  runs itself with MODE ARGS as a child (same process group) and exits with
//                   its status, as a shell script that does not exec would
//   escape FILE wait|exit
//                   starts a child that leaves with setsid(), writes its pid to
//                   FILE.escaped.<slot> and sleeps forever; then behaves as `wait FILE` or exits 0
//   orphan FILE     first life: starts a child (in the worker's process group) that writes its pid to
//                   FILE.child.<slot> and sleeps forever, then exits 1; later lives exit 0
// `env` also reports the signal state the worker got: SIGPIPE=<default|ignored>, SIGMASK=<empty|...>.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <elastic/events.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/rendezvous/store_url.hpp>
#include <elastic/timer/expires.hpp>

namespace {

volatile sig_atomic_t terminated = 0;
void on_term(int) { terminated = terminated + 1; }

void write_pid(const std::string& file) {
  const std::string tmp = file + ".tmp";
  std::ofstream(tmp) << ::getpid() << "\n";
  std::rename(tmp.c_str(), file.c_str());  // readers never see it half-written
}

void sleep_forever() {
  for (;;) ::pause();
}

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
                          "ELASTIC_EVENTS", "ELASTIC_MIN_RANKS", "ELASTIC_MAX_RANKS", "ELASTIC_MIN_NODES", "ELASTIC_MAX_NODES",
                          "ELASTIC_PARTICIPANT_ID",
                          "ELASTIC_STEP_TIMEOUT", "ELASTIC_GRACE", "ELASTIC_HOST_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
      const char* v = std::getenv(k);
      out << k << "=" << (v ? v : "<unset>") << "\n";
    }
    struct sigaction pipe_action {};
    ::sigaction(SIGPIPE, nullptr, &pipe_action);
    out << "SIGPIPE=" << (pipe_action.sa_handler == SIG_IGN ? "ignored" : "default") << "\n";
    sigset_t mask;
    ::sigprocmask(SIG_SETMASK, nullptr, &mask);
    bool empty = true;
    for (int sig = 1; sig < NSIG; ++sig) empty = empty && sigismember(&mask, sig) != 1;
    out << "SIGMASK=" << (empty ? "empty" : "blocked") << "\n";
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
      write_pid(std::string(argv[2]) + "." + std::to_string(slot));
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
    // Our own key, under the same name: the launcher's retiring of the last life's must not
    // take it (it is done before we start).
    store.set(key, "y");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::printf("own-key-present=%d\n", store.get(key).has_value() ? 1 : 0);
    store.erase(key);
    return 0;
  }
  if (mode == "notice-once") {
    if (slot == 0 && first_life) {
      elastic::event_log::from_env().emit("loop_preempted", {{"reason", "preempted"}, {"step", 5}, {"final_checkpoint", true}});
      return 75;
    }
    return 0;
  }
  if (mode == "tempfail") {
    std::signal(SIGTERM, on_term);
    if (slot == 0) return 75;
    while (!terminated) ::pause();
    std::puts("terminating: exit 75");
    return 75;
  }
  if (mode == "tempfail-progress" && argc > 2) {
    const long life = env_long("ELASTIC_RESTART_COUNT");
    if (slot != 0 || life >= std::atol(argv[2])) return 0;
    elastic::event_log::from_env().emit("checkpoint_commit", {{"step", life}});
    return 75;
  }
  if (mode == "term" && argc > 3) {
    std::signal(SIGTERM, on_term);
    const std::string saving = argc > 4 ? argv[4] : "none";
    auto events = elastic::event_log::from_env();
    if (slot == 0 && saving != "none") events.emit("checkpoint_commit", {{"step", 3}});
    write_pid(std::string(argv[3]) + "." + std::to_string(slot));
    std::puts("waiting");
    while (!terminated) ::pause();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(argv[2])));
    if (saving == "saved" && slot == 0) {
      events.emit("checkpoint_commit", {{"step", 4}});
      events.emit("loop_preempted", {{"reason", "preempted"}, {"step", 4}, {"final_checkpoint", true}});
    } else if (saving != "none") {
      events.emit("loop_preempted", {{"reason", "preempted"}, {"step", 4}, {"final_checkpoint", false}});
    }
    std::printf("terminating after %d notices: exit 75\n", static_cast<int>(terminated));
    return 75;
  }
  if (mode == "chatter" && argc > 2) {
    std::signal(SIGTERM, on_term);
    const std::string line(static_cast<std::size_t>(std::atol(argv[2])), 'x');
    for (long i = 0; !terminated; ++i) {
      std::printf("%ld %s\n", i, line.c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::puts("terminating: exit 75");
    return 75;
  }
  if (mode == "wrap" && argc > 2) {
    const pid_t child = ::fork();
    if (child == 0) {
      argv[1] = argv[0];
      ::execv(argv[0], argv + 1);
      ::_exit(127);
    }
    int st = 0;
    while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  if (mode == "escape" && argc > 3) {
    const std::string file = std::string(argv[2]) + ".escaped." + std::to_string(slot);
    const pid_t child = ::fork();
    if (child == 0) {
      ::setsid();
      write_pid(file);
      sleep_forever();
    }
    while (::access(file.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (std::string(argv[3]) != "wait") return 0;
    std::signal(SIGTERM, on_term);
    write_pid(std::string(argv[2]) + "." + std::to_string(slot));
    while (!terminated) ::pause();
    return 75;
  }
  if (mode == "orphan" && argc > 2) {
    if (!first_life) return 0;
    const std::string file = std::string(argv[2]) + ".child." + std::to_string(slot);
    const pid_t child = ::fork();
    if (child == 0) {
      write_pid(file);
      sleep_forever();
    }
    while (::access(file.c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return 1;
  }
  return 2;
}
