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
//
// This program is built without sanitizers (tests/CMakeLists.txt): the malloc mode needs glibc's
// own allocator, which ASan and TSan replace.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
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

#include <elastic/timer/expires.hpp>

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

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const auto limit = scope_limit(argc, argv);
  if (mode == "malloc") return malloc_deadlock(limit);
  if (mode == "leave") return leave_on_signal(limit);
  if (mode != "spin" && mode != "traced") {
    std::fprintf(stderr, "usage: hung_worker spin|malloc|traced [MS]\n");
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
}
