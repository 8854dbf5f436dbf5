// A worker that hangs where a stack dump must find it (tests/test_stack_dump.cpp). It attaches to
// the watchdog named by ELASTIC_WATCHDOG, as a trainer does, enters a scope named "hung-step" of
// ELASTIC_STEP_TIMEOUT seconds (elastic-run --step-timeout), else of MS milliseconds, prints
// "entered" and hangs in one of these ways until the watchdog kills it:
//
//   hung_worker spin [MS]       spin in elastic_test::stuck_in_known_function(int), while a second
//                               thread named "hw-sleeper" waits on a condition variable
//   hung_worker malloc [MS]     a real deadlock in async-signal-unsafe code: thread "malloc-stats"
//                               is inside malloc_stats(), which holds malloc's (only) arena lock while
//                               it prints; its print blocks on a mutex the main thread holds; the
//                               main thread then calls malloc() in blocked_on_the_arena_lock() and
//                               waits for the arena lock forever. Nothing in this process could
//                               print a stack now: printing allocates.
//   hung_worker traced [MS]     like spin, but a child process traces this one first (PTRACE_SEIZE),
//                               so that no other tracer can: it prints "traced" before "entered"
//   hung_worker leave [MS]      waits in sigwait() for SIGUSR1, then leaves its scope, prints "left"
//                               and waits forever, alive: a hang that ended on its own
//   hung_worker crowd N [MS]    like spin, with N threads more (named "crowd"), each waiting on a
//                               condition variable 0 to 39 calls deep (thread i: i % 40): a dump of
//                               N + 2 threads, in 40 crowds of one stack each
//   hung_worker attach          attaches (a scope of an hour), prints "attached PID", waits forever:
//                               a process that maps the segment without being the launcher's
//   hung_worker forge TARGET    writes an expired scope (SIGKILL) into a free slot in the name of
//                               TARGET: "parent" (its parent, elastic-run) or a file it waits for
//                               (bounded) holding a pid; prints "attached" first, "forged PID", waits (bounded) until
//                               the watchdog frees the slot, prints "freed" and exits 0
//   hung_worker nsexec DECOY MODE...  in a mount namespace of its own (unshare; exits 77 if not
//                               permitted), binds its own executable over the file DECOY and execs
//                               DECOY MODE...: the same process, running this program under a path
//                               that names another program outside the namespace (a container)
//   hung_worker nsbind DECOY MODE...  in a mount namespace of its own, binds DECOY over the path of
//                               its own (already mapped) executable, then runs MODE...: its maps
//                               name a path that, even in its namespace, is now another program
//
// This program is built without sanitizers (tests/CMakeLists.txt): the malloc mode needs glibc's
// own allocator, which ASan and TSan replace.
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <elastic/internal/clock.hpp>
#include <elastic/internal/futex.hpp>
#include <elastic/internal/process.hpp>
#include <elastic/timer/client.hpp>
#include <elastic/timer/expires.hpp>

#include "forged_scope.hpp"

namespace elastic_test {

/// Where the spinning modes hang: the name a stack dump must show.
[[gnu::noinline]] void stuck_in_known_function(int step) {
  volatile unsigned long spins = 0;
  for (;;) spins = spins + static_cast<unsigned long>(step);
}

}  // namespace elastic_test

namespace {

/// A line on stdout with write(2) alone: the malloc mode must not allocate once deadlocked.
void say(std::string_view line) {
  (void)!::write(STDOUT_FILENO, line.data(), line.size());
  (void)!::write(STDOUT_FILENO, "\n", 1);
}

std::chrono::milliseconds scope_limit(int argc, char** argv) {
  if (const char* s = std::getenv("ELASTIC_STEP_TIMEOUT"); s != nullptr && *s != '\0') {
    return std::chrono::milliseconds(static_cast<long long>(std::strtod(s, nullptr) * 1000));
  }
  return std::chrono::milliseconds(argc > 2 ? std::atoi(argv[2]) : 300);
}

// --- malloc mode -----------------------------------------------------------------------------
std::mutex step_lock;                  // the main thread holds it; the cookie writer wants it
std::atomic<bool> writer_waits{false};  // the writer is inside malloc_stats, about to lock it
std::atomic<bool> armed{false};

ssize_t cookie_write(void*, const char*, std::size_t size) {
  if (armed.load()) {
    writer_waits.store(true);
    std::lock_guard lk(step_lock);  // never granted: the main thread holds it, and waits for us
  }
  return static_cast<ssize_t>(size);
}

[[gnu::noinline]] void* blocked_on_the_arena_lock() {
  void* volatile block = std::malloc(65536);  // above the per-thread cache: it needs the arena's lock
  return block;  // (through a volatile, so that the call is no tail call and this frame shows)
}

int malloc_deadlock(std::chrono::milliseconds limit) {
  // One arena for every thread: the main thread's malloc needs the very lock malloc_stats holds.
  ::mallopt(M_ARENA_MAX, 1);
  {
    auto warm = elastic::expires(std::chrono::seconds(60), "warm-up");  // attach now: it allocates
    if (!warm.watched()) {
      say("not watched");
      return 1;
    }
  }
  cookie_io_functions_t io{};
  io.write = cookie_write;
  std::FILE* err = ::fopencookie(nullptr, "w", io);
  if (err == nullptr) return 1;
  std::setvbuf(err, nullptr, _IONBF, 0);  // every fprintf reaches cookie_write, no buffer to allocate
  std::fputs("warm\n", err);
  stderr = err;  // malloc_stats() prints here
  step_lock.lock();
  armed.store(true);
  std::thread stats([] {
    ::pthread_setname_np(::pthread_self(), "malloc-stats");
    ::malloc_stats();
  });
  while (!writer_waits.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto step = elastic::expires(limit, "hung-step");
  say("entered");
  void* never = blocked_on_the_arena_lock();
  say("not deadlocked");
  std::free(never);
  step_lock.unlock();
  stats.join();
  return 1;
}

// --- traced mode -----------------------------------------------------------------------------
/// Forks a tracer of this process and waits until it holds it. The tracer passes on every signal
/// and ends when this process does.
bool be_traced() {
  int ready[2];
  if (::pipe(ready) != 0) return false;
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // where Yama lets only ancestors trace
  const pid_t parent = ::getpid();
  const pid_t tracer = ::fork();
  if (tracer < 0) return false;
  if (tracer == 0) {
    ::close(ready[0]);
    if (::ptrace(PTRACE_SEIZE, parent, nullptr, nullptr) != 0) ::_exit(1);
    (void)!::write(ready[1], "t", 1);
    for (;;) {
      int st = 0;
      if (::waitpid(parent, &st, __WALL) < 0 || WIFEXITED(st) || WIFSIGNALED(st)) ::_exit(0);
      if (WIFSTOPPED(st)) {
        const int sig = (st >> 16) == 0 ? WSTOPSIG(st) : 0;
        ::ptrace(PTRACE_CONT, parent, nullptr, reinterpret_cast<void*>(static_cast<long>(sig)));
      }
    }
  }
  ::close(ready[1]);
  char c = 0;
  const bool ok = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return ok;
}

/// The leave mode: the scope ends when SIGUSR1 comes.
int leave_on_signal(std::chrono::milliseconds limit) {
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  {
    auto step = elastic::expires(limit, "hung-step");
    if (!step.watched()) {
      say("not watched");
      return 1;
    }
    say("entered");
    int sig = 0;
    while (::sigwait(&usr1, &sig) != 0) {
    }
  }
  say("left");
  for (;;) ::pause();
}

// --- forge, attach and nsexec modes -------------------------------------------------------------
/// The pid TARGET names: its parent for "parent", else the number in file TARGET (waited for).
pid_t forge_target(const std::string& target) {
  if (target == "parent") return ::getppid();
  for (int tries = 0; tries < 30000; ++tries) {
    char buf[32] = {};
    const int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      const ssize_t n = ::read(fd, buf, sizeof buf - 1);
      ::close(fd);
      if (n > 0 && buf[n - 1] == '\n') return static_cast<pid_t>(std::atoi(buf));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}

/// Writes an expired scope into a free slot in the name of the process TARGET names, as a
/// hostile client could, and waits for the watchdog to free it.
int forge(const std::string& target) {
  {
    auto warm = elastic::expires(std::chrono::seconds(60), "warm-up");  // attach, as the trainer does
    if (!warm.watched()) {
      say("not watched");
      return 1;
    }
  }
  say("attached");
  const pid_t pid = forge_target(target);
  const std::uint64_t start = elastic::internal::process_start_time(pid);
  if (pid <= 0 || start == 0) {
    say("no target");
    return 1;
  }
  const auto* s = elastic::test::forge_expired_scope(elastic::timer::client::attach(std::getenv("ELASTIC_WATCHDOG")).table(),
                                                     static_cast<std::uint64_t>(pid), start);
  if (s == nullptr) {
    say("table full");
    return 1;
  }
  say("forged " + std::to_string(pid));
  if (!elastic::test::forged_slot_freed(*s, static_cast<std::uint64_t>(pid), start)) {
    say("not freed");
    return 1;
  }
  say("freed");
  return 0;
}

int attach_and_wait() {
  auto idle = elastic::expires(std::chrono::hours(1), "idle");
  if (!idle.watched()) {
    say("not watched");
    return 1;
  }
  say("attached " + std::to_string(::getpid()));
  for (;;) ::pause();
}

int exec_in_namespace(int argc, char** argv) {
  if (argc < 4) return 2;
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    say(std::string("no mount namespace: ") + std::strerror(errno));
    return 77;
  }
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0 || ::mount(self, argv[2], nullptr, MS_BIND, nullptr) != 0) {
    say(std::string("cannot bind over the decoy: ") + std::strerror(errno));
    return 77;
  }
  ::execv(argv[2], argv + 2);
  say(std::string("cannot exec the decoy: ") + std::strerror(errno));
  return 1;
}

/// nsbind: in a mount namespace of its own, binds DECOY over its own executable's path, after
/// it was mapped: the path then names another program in its own namespace too.
bool bind_decoy_over_self(const char* decoy) {
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return false;
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    say(std::string("no mount namespace: ") + std::strerror(errno));
    std::exit(77);
  }
  if (::mount(decoy, self, nullptr, MS_BIND, nullptr) != 0) {
    say(std::string("cannot bind over the decoy: ") + std::strerror(errno));
    std::exit(77);
  }
  return true;
}

/// Where the crowd's threads wait, `depth` calls deep: one stack per depth.
[[gnu::noinline]] void crowd_waits_here(std::mutex& m, std::condition_variable& cv, int depth) {
  if (depth > 0) {
    crowd_waits_here(m, cv, depth - 1);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // no tail call: each level is a frame
    return;
  }
  std::unique_lock lk(m);
  cv.wait(lk, [] { return false; });
}

void start_crowd(int n) {
  static std::mutex m;
  static std::condition_variable never;
  pthread_attr_t attr;
  ::pthread_attr_init(&attr);
  ::pthread_attr_setstacksize(&attr, 128 * 1024);  // a thousand threads need no 8 MB each
  ::pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < n; ++i) {
    pthread_t t;
    // 40 stacks in all, each of a crowd of its own: 40 folded entries, too long together for a dump.
    if (::pthread_create(&t, &attr, [](void* depth) -> void* {
          ::pthread_setname_np(::pthread_self(), "crowd");
          crowd_waits_here(m, never, static_cast<int>(reinterpret_cast<std::intptr_t>(depth)));
          return nullptr;
        }, reinterpret_cast<void*>(static_cast<std::intptr_t>(i % 40))) != 0) {
      say("cannot start thread " + std::to_string(i));
      std::exit(1);
    }
  }
  ::pthread_attr_destroy(&attr);
}

}  // namespace

int run_mode(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode == "forge" && argc > 2) return forge(argv[2]);
  if (mode == "attach") return attach_and_wait();
  if (mode == "nsexec") return exec_in_namespace(argc, argv);
  if (mode == "nsbind" && argc > 3) {
    bind_decoy_over_self(argv[2]);
    argv += 2;  // MODE [MS] follow
    argc -= 2;
    return run_mode(argc, argv);
  }
  if (mode == "crowd" && argc > 2) {
    start_crowd(std::atoi(argv[2]));
    argv[2] = argv[1];  // the limit follows, as for spin
    ++argv;
    --argc;
  }
  const auto limit = scope_limit(argc, argv);
  if (mode == "malloc") return malloc_deadlock(limit);
  if (mode == "leave") return leave_on_signal(limit);
  if (mode != "spin" && mode != "traced" && mode != "crowd") {
    std::fprintf(stderr, "usage: hung_worker spin|malloc|traced|leave|crowd N|attach|forge TARGET|nsexec DECOY MODE [MS]\n");
    return 2;
  }
  if (mode == "traced") {
    if (!be_traced()) {
      say("cannot be traced");
      return 1;
    }
    say("traced");
  }
  static std::mutex m;  // static: the sleeper outlives this frame if main returns
  static std::condition_variable never;
  std::thread sleeper([] {
    ::pthread_setname_np(::pthread_self(), "hw-sleeper");
    std::unique_lock lk(m);
    never.wait(lk, [] { return false; });
  });
  sleeper.detach();
  auto step = elastic::expires(limit, "hung-step");
  if (!step.watched()) {
    say("not watched");
    return 1;
  }
  say("entered");
  elastic_test::stuck_in_known_function(3);
  return 1;  // never: it spins until killed
}

int main(int argc, char** argv) { return run_mode(argc, argv); }
